"""A deterministic stand-in for an LLM: no network, no API key, the same answer every time.

`ScriptedModel.respond(conversation)` plays the part of a chat-completion
call with tools: it reads the conversation so far and answers the next
assistant message, either tool calls or a final answer, with token usage.
It is a pure function of the conversation, so a test can predict every
turn; the workflow still treats it as the expensive, non-deterministic
call a real model is and checkpoints each call (see agent.py).

Its script, for a brief "write about TOPIC and publish it on CHANNELS":

1. Research: `search_web(query=TOPIC)` and `fetch_stats(subject=TOPIC)`, in one turn.
2. Write a draft from what they found and ask, in one turn, for
   `publish(channel, draft)` on every channel and `fetch_stats(subject=channel)`
   (each channel's audience, for the final report).
3. For each publish that came back `{"declined": reason}`: revise the draft
   to answer the reason and ask to publish it again on that channel, once
   (`max_revisions`); declined again, it gives that channel up.
4. Otherwise: a final answer saying what was published where, and what was not.

Messages are plain JSON (what the workflow records):

    {"role": "user", "content": str, "topic": str, "channels": [str, ...]}
    {"role": "assistant", "content": str, "tool_calls": [{"id", "name", "args"}, ...]}
    {"role": "tool", "tool_call_id": str, "name": str, "content": <the tool's result>}

The brief's `topic` and `channels` are fields of the first message, rather
than parsed out of its text, because a script needs them exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ScriptedModel", "opening", "usage_of"]

Message = dict[str, Any]


def opening(topic: str, channels: Sequence[str]) -> list[Message]:
    """The conversation an agent run starts with: the user's brief."""
    return [
        {
            "role": "user",
            "content": f"Write a short post about {topic} and publish it on {', '.join(channels)}.",
            "topic": topic,
            "channels": list(channels),
        }
    ]


def _tokens(value: Any) -> int:
    # The usual rule of thumb, about four characters a token: what matters
    # here is that it is deterministic and grows with the conversation.
    return math.ceil(len(json.dumps(value, sort_keys=True)) / 4)


def usage_of(
    conversation: Sequence[Mapping[str, Any]], message: Mapping[str, Any]
) -> dict[str, int]:
    """The token usage a call reports: its prompt (the conversation) and its answer."""
    return {"input_tokens": _tokens(list(conversation)), "output_tokens": _tokens(dict(message))}


@dataclass(frozen=True, slots=True)
class _Publish:
    """One publish the model asked for, and what came back (None while it waits)."""

    channel: str
    draft: str
    result: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class ScriptedModel:
    """The scripted model; see the module docstring.

    Attributes:
        max_revisions: How often it revises a declined draft for one channel
            before it gives that channel up.
    """

    max_revisions: int = 1

    def respond(self, conversation: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The next assistant message and its usage: `{"message": {...}, "usage": {...}}`."""
        if not conversation or conversation[0].get("role") != "user":
            raise ValueError("a conversation starts with the user's brief (see opening())")
        brief = conversation[0]
        topic, channels = str(brief["topic"]), [str(c) for c in brief["channels"]]
        turn = 1 + sum(1 for m in conversation if m.get("role") == "assistant")
        results = {
            str(m["tool_call_id"]): m.get("content")
            for m in conversation
            if m.get("role") == "tool"
        }
        calls = [
            call
            for m in conversation
            if m.get("role") == "assistant"
            for call in m.get("tool_calls") or []
        ]

        if not calls:
            message = self._ask(
                turn,
                "Let me look this up first.",
                [("search_web", {"query": topic}), ("fetch_stats", {"subject": topic})],
            )
        else:
            publishes = [
                _Publish(str(c["args"]["channel"]), str(c["args"]["draft"]), results.get(c["id"]))
                for c in calls
                if c["name"] == "publish"
            ]
            if not publishes:
                # The first turn's calls were the research.
                research = {c["name"]: results.get(c["id"]) for c in conversation[1]["tool_calls"]}
                draft = _draft(topic, research.get("search_web"), research.get("fetch_stats"))
                message = self._ask(
                    turn,
                    "Here is a draft; it needs an editor's approval before it goes out.",
                    [("publish", {"channel": c, "draft": draft}) for c in channels]
                    + [("fetch_stats", {"subject": c}) for c in channels],
                )
            else:
                message = self._follow_up(turn, channels, publishes, calls, results)
        return {"message": message, "usage": usage_of(conversation, message)}

    def _follow_up(
        self,
        turn: int,
        channels: Sequence[str],
        publishes: Sequence[_Publish],
        calls: Sequence[Mapping[str, Any]],
        results: Mapping[str, Any],
    ) -> Message:
        retries: list[tuple[str, dict[str, Any]]] = []
        report: list[str] = []
        audience = {
            str(c["args"]["subject"]): results.get(c["id"])
            for c in calls
            if c["name"] == "fetch_stats"
        }
        for channel in channels:
            attempts = [p for p in publishes if p.channel == channel]
            last = attempts[-1]
            outcome = last.result or {}
            if outcome.get("published"):
                reach = audience.get(channel) or {}
                views = reach.get("views_last_week") if isinstance(reach, Mapping) else None
                where = outcome.get("url", channel)
                readers = f" (about {views} readers a week)" if views else ""
                first = attempts[0].result or {}
                revised = f" after a revision ({first['declined']})" if len(attempts) > 1 else ""
                report.append(f"Published on {channel}{revised}: {where}{readers}.")
            elif "declined" in outcome and len(attempts) <= self.max_revisions:
                reason = str(outcome["declined"])
                retries.append(
                    ("publish", {"channel": channel, "draft": _revise(last.draft, reason)})
                )
            else:
                why = outcome.get("declined") or outcome.get("error") or "no answer"
                report.append(f"Not published on {channel}: {why}.")
        if retries:
            return self._ask(turn, "I revised the draft to answer the review.", retries)
        return {"role": "assistant", "content": " ".join(report), "tool_calls": []}

    @staticmethod
    def _ask(turn: int, content: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> Message:
        return {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": f"call-{turn}-{i}", "name": name, "args": args}
                for i, (name, args) in enumerate(calls, start=1)
            ],
        }


def _draft(topic: str, found: Any, stats: Any) -> str:
    hits = found.get("results", []) if isinstance(found, Mapping) else []
    lines = [f"{topic}: what changed this week", ""]
    lines += [f"- {hit['title']}: {hit['snippet']}" for hit in hits]
    if isinstance(stats, Mapping) and "views_last_week" in stats:
        lines += ["", f"By the numbers: {stats['views_last_week']} views, {stats['change']}."]
    return "\n".join(lines)


def _revise(draft: str, reason: str) -> str:
    # A real model would rewrite the text; the script shows it read the review.
    title, _, body = draft.partition("\n")
    return f"{title} (revised)\n{body}\n\nRevised after review: {reason}."
