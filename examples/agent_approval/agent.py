"""The agent: an LLM-style tool loop whose `publish` tool waits for an editor's typed approval.

Two workflows (both registered by worker.py):

- `agent(ctx, topic, channels, ...)` is the loop. Each model call is a
  checkpointed step (`<run>.model-<turn>`), so a replay, on any worker, reads
  the recorded answer instead of calling (and paying for) the model again.
  The tools the model asks for in one turn start together, each as a child
  workflow (`<run>.<call id>`), and the loop waits for all of them before the
  next model call. The turn count and the tokens spent are plain local
  variables: a replay recomputes them from the recorded model answers, so
  they survive any wait, any worker dying, any number of days.
- `run_tool(ctx, call, agent_id, approval_timeout)` runs one tool call.
  `search_web` and `fetch_stats` are one checkpointed step each. `publish`
  first creates a latent approval promise (`<run>.<call id>.approval`) whose
  resolve value the server checks against `PublishDecision`, and waits, for
  hours if need be, holding no worker; a rejection (or a decision with
  `approved: false`, or no decision in time) comes back to the model as the
  tool result `{"declined": reason}`, and the model adapts.

Every real side effect (a model call, a tool run, a post published) appends
one JSON line to the journal file (`AGENT_JOURNAL`): it stands in for the
model API's bill, the tools' backends and the blog, and lets the test count
what actually ran.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from scripted_model import ScriptedModel, opening

from troth import Approvers, Context, PromiseHandle, Rejected, RetryPolicy, TimedOut

__all__ = [
    "APPROVAL_TAG",
    "DEFAULT_APPROVAL_TIMEOUT",
    "DEFAULT_APPROVERS",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_TOKEN_BUDGET",
    "Budget",
    "PublishDecision",
    "agent",
    "run_tool",
]

APPROVAL_TAG = "publish"
"""The `approval` tag on every approval promise: `troth approvals list --tag approval=publish`."""

DEFAULT_MAX_TURNS = 8
DEFAULT_TOKEN_BUDGET = 20_000
DEFAULT_APPROVAL_TIMEOUT = timedelta(hours=12).total_seconds()
"""Seconds an editor has to decide. A tool's child workflow gets the server's
default ttl (`--default-ttl`, 24 h), and a step never outlives its workflow,
so an approval cannot wait longer than that."""

DEFAULT_APPROVERS = ("editor",)
"""Who may approve a publish, unless the start names others (`start.py --approver`)."""

_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.5)
"""For a model call or a tool that fails (a real API times out, rate-limits...)."""


@dataclass(frozen=True, slots=True)
class PublishDecision:
    """What an editor resolves an approval with; the server refuses any other shape.

    Attributes:
        approved: False declines the post (the same as rejecting the promise).
        channel: Where to publish: usually the channel asked for; an editor may redirect it.
        note: Shown to the model: why it was declined, or a remark.
    """

    approved: bool
    channel: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class Budget:
    """The loop's limits and what it has spent: pure, recomputed on every replay."""

    max_turns: int
    max_tokens: int
    turns: int = 0
    tokens: int = 0

    def spend(self, usage: Mapping[str, int]) -> Budget:
        """After one model call that reported `usage`."""
        used = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
        return replace(self, turns=self.turns + 1, tokens=self.tokens + used)

    def exhausted(self) -> tuple[str, str] | None:
        """Why the model may not be called again (status, words), or None if it may."""
        if self.tokens >= self.max_tokens:
            return "budget_exhausted", (
                f"token budget exhausted: {self.tokens} of {self.max_tokens} tokens used"
            )
        if self.turns >= self.max_turns:
            return "turn_limit", f"turn limit reached: {self.turns} of {self.max_turns} turns"
        return None


# --- side effects: each runs inside a checkpointed step -------------------------


def _journal(event: dict[str, Any]) -> None:
    with open(os.environ.get("AGENT_JOURNAL", "journal.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps(event) + "\n")


def call_model(agent_id: str, turn: int, conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """One call to the model (here the scripted one): the step a replay never repeats."""
    _journal({"event": "model", "agent": agent_id, "turn": turn})
    return ScriptedModel().respond(conversation)


def search_web(query: str) -> dict[str, Any]:
    """A stand-in web search: two made-up but stable results."""
    slug = "-".join(query.lower().split())
    return {
        "query": query,
        "results": [
            {
                "title": f"{query} release notes",
                "url": f"https://example.com/{slug}/notes",
                "snippet": "faster startup and a smaller install",
            },
            {
                "title": f"What users say about {query}",
                "url": f"https://example.com/{slug}/reviews",
                "snippet": "most reviews mention the new approvals inbox",
            },
        ],
    }


def fetch_stats(subject: str) -> dict[str, Any]:
    """Stand-in analytics: stable numbers for any subject."""
    seed = zlib.crc32(subject.encode())
    return {
        "subject": subject,
        "views_last_week": 1_000 + seed % 9_000,
        "change": f"+{seed % 40}% week on week",
    }


_TOOLS: dict[str, Callable[..., dict[str, Any]]] = {
    "search_web": search_web,
    "fetch_stats": fetch_stats,
}


def execute_tool(agent_id: str, call_id: str, name: str, args: dict[str, Any]) -> Any:
    """Run one plain tool: the step a replay never repeats."""
    _journal({"event": "tool", "agent": agent_id, "call": call_id, "tool": name})
    return _TOOLS[name](**args)


def publish_post(agent_id: str, call_id: str, channel: str, draft: str) -> dict[str, Any]:
    """Publish `draft` on `channel` (a journal line standing in for the blog's API)."""
    url = f"https://example.com/{channel}/{agent_id}"
    _journal(
        {"event": "published", "agent": agent_id, "call": call_id, "channel": channel, "url": url}
    )
    return {"channel": channel, "url": url}


# --- workflows -------------------------------------------------------------------


def agent(
    ctx: Context,
    topic: str,
    channels: list[str],
    max_turns: int = DEFAULT_MAX_TURNS,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT,
    approvers: list[str] | None = None,
) -> Generator[Any, Any, dict[str, Any]]:
    """Let the model write about `topic` and publish it on `channels`, within its limits.

    Args:
        ctx: The workflow context.
        topic: What to write about.
        channels: Where to publish (each publish waits for its own approval).
        max_turns: Most model calls.
        token_budget: Most tokens (prompt plus answer, summed over calls);
            once spent, the model is not called again.
        approval_timeout: Seconds an editor has to decide on each publish.
        approvers: The principals who may decide (default `DEFAULT_APPROVERS`);
            the server refuses anyone else, and the principal who started the run.

    Returns:
        A report: `status` (`done`, `budget_exhausted` or `turn_limit`), the
        model's final `answer` (for `done`) or why it stopped (`stopped`),
        `turns`, `tokens`, what was `published`, and the `transcript`.
    """
    conversation = opening(topic, channels)
    budget = Budget(max_turns, token_budget)
    while (stop := budget.exhausted()) is None:
        turn = budget.turns + 1
        # A checkpoint: once recorded, a replay reads the answer instead of calling.
        step = f"{ctx.id}.model-{turn}"
        reply = yield ctx.run(call_model, ctx.id, turn, list(conversation), id=step, retry=_RETRY)
        budget = budget.spend(reply["usage"])
        message = reply["message"]
        conversation.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return _report(conversation, budget, "done", answer=message["content"])
        ctx.log.info("turn %d: the model asks for %s", turn, ", ".join(c["name"] for c in calls))
        # Start every tool of the turn before waiting for any: they run at
        # once, on any workers of the group, and wait for approvals side by side.
        handles: list[PromiseHandle] = []
        for call in calls:
            tool = ctx.start(
                run_tool, call, ctx.id, approval_timeout, approvers, id=f"{ctx.id}.{call['id']}"
            )
            handles.append((yield tool))
        results = yield ctx.all(handles)
        conversation += [
            {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": result}
            for call, result in zip(calls, results, strict=True)
        ]
    status, stopped = stop
    ctx.log.info("stopping before turn %d: %s", budget.turns + 1, stopped)
    return _report(conversation, budget, status, stopped=stopped)


def run_tool(
    ctx: Context,
    call: dict[str, Any],
    agent_id: str,
    approval_timeout: float,
    approvers: list[str] | None = None,
) -> Generator[Any, Any, Any]:
    """Run one tool call of the model; its result (never an error) goes back to the model."""
    name, args = str(call["name"]), dict(call.get("args") or {})
    if name == "publish":
        return (yield from _publish(ctx, call, agent_id, args, approval_timeout, approvers))
    if name not in _TOOLS:
        return {"error": f"there is no tool named {name!r}; use one of {sorted(_TOOLS)} or publish"}
    try:
        return (yield ctx.run(execute_tool, agent_id, call["id"], name, args, retry=_RETRY))
    except Rejected as failed:  # the tool kept failing: the model gets to see why
        return {"error": failed.value}


def _publish(
    ctx: Context,
    call: dict[str, Any],
    agent_id: str,
    args: dict[str, Any],
    approval_timeout: float,
    approvers: list[str] | None,
) -> Generator[Any, Any, dict[str, Any]]:
    channel, draft = str(args["channel"]), str(args["draft"])
    approval = yield ctx.promise(
        id=f"{ctx.id}.approval",
        timeout=timedelta(seconds=approval_timeout),
        schema=PublishDecision,
        title=f"Publish on {channel}?",
        message=draft,
        tags={"approval": APPROVAL_TAG, "agent": agent_id, "channel": channel},
        approvers=Approvers(principals=approvers or DEFAULT_APPROVERS, not_requester=True),
    )
    ctx.log.info("waiting for an editor to approve %s", approval.id)
    try:
        decided = yield ctx.decision(approval)  # the PublishDecision, and who made it
    except Rejected as rejected:
        # `troth approvals reject ID --reason TEXT` rejects with {"reason": TEXT}.
        return {"declined": str(rejected.reason or "rejected")}
    except TimedOut:
        return {"declined": "nobody decided in time"}
    decision: PublishDecision = decided.value
    if not decision.approved:
        return {"declined": decision.note or "not approved"}
    receipt = yield ctx.run(publish_post, agent_id, call["id"], decision.channel, draft)
    return {"published": True, **receipt, "note": decision.note, "approved_by": decided.settled_by}


def _report(
    conversation: list[dict[str, Any]],
    budget: Budget,
    status: str,
    *,
    answer: str | None = None,
    stopped: str | None = None,
) -> dict[str, Any]:
    published = [
        {
            "channel": m["content"]["channel"],
            "url": m["content"]["url"],
            "approved_by": m["content"].get("approved_by", ""),
        }
        for m in conversation
        if m["role"] == "tool" and isinstance(m["content"], dict) and m["content"].get("published")
    ]
    return {
        "status": status,
        "answer": answer,
        "stopped": stopped,
        "turns": budget.turns,
        "tokens": budget.tokens,
        "published": published,
        "transcript": conversation,
    }
