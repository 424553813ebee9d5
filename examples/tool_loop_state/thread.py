"""A tool loop's message thread, and the check that a rewritten thread can resume.

The thread is a list of messages: `{"role": "user" | "assistant" | "tool", ...}`; an
assistant message may carry `tool_calls` (`[{"id", "name", "args"}]`), and each call
is answered by one tool message (`{"role": "tool", "tool_call_id", "content"}`) after
it. While the run waits for an approver, the call it waits on (the deferred call) has
no result yet.

`assert_resumable_thread` refuses a thread the loop could not resume from (as
routecraft's `assertResumableThread` does): one that

1. breaks tool-call/result pairing (a result with no call, a call answered twice, or
   a call other than the deferred one left without its result),
2. puts a result before its call,
3. has two calls with one id,
4. is empty, or
5. drops the deferred call (or answers it).

`replace_thread` is an operator's rewrite with that check: `Client.replace_state`,
validating the new thread against the deferred call of the thread it rewrote.
Pure but for `replace_thread`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from troth import Client, StateReplaced

__all__ = [
    "THREAD",
    "UnresumableThread",
    "assert_resumable_thread",
    "pending_calls",
    "replace_thread",
]

THREAD = "thread"
"""The state slot the tool loop keeps its thread in."""

Message = dict[str, Any]


class UnresumableThread(ValueError):
    """A thread the loop cannot resume from; `rule` names which rule it breaks:
    `pairing`, `order`, `duplicate`, `empty` or `pending`."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


def _calls(thread: Sequence[Message]) -> list[tuple[int, str]]:
    return [
        (position, call["id"])
        for position, message in enumerate(thread)
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or ()
    ]


def _results(thread: Sequence[Message]) -> list[tuple[int, str]]:
    return [
        (position, message.get("tool_call_id", ""))
        for position, message in enumerate(thread)
        if message.get("role") == "tool"
    ]


def pending_calls(thread: Sequence[Message]) -> list[str]:
    """The calls of `thread` that have no result yet (the deferred call, while the run
    waits on its approval), in order."""
    answered = {call_id for _, call_id in _results(thread)}
    return [call_id for _, call_id in _calls(thread) if call_id not in answered]


def assert_resumable_thread(thread: Sequence[Message], pending: Sequence[str]) -> None:
    """Raise `UnresumableThread` unless the loop can resume from `thread`, whose
    deferred calls (`pending`: those of the thread it replaces) must stay unanswered."""
    if not thread:
        raise UnresumableThread("empty", "the thread is empty: the loop has nothing to resume")
    calls, results = _calls(thread), _results(thread)
    where: dict[str, int] = {}
    for position, call_id in calls:
        if call_id in where:
            raise UnresumableThread(
                "duplicate",
                f"call id {call_id!r} is used twice (messages {where[call_id]} and {position})",
            )
        where[call_id] = position
    answered: dict[str, int] = {}
    for position, call_id in results:
        for deferred in pending:
            if call_id == deferred:
                raise UnresumableThread(
                    "pending", f"the deferred call {deferred!r} is answered (message {position})"
                )
        if call_id not in where:
            raise UnresumableThread(
                "pairing", f"the result at message {position} answers no call ({call_id!r})"
            )
        if where[call_id] > position:
            raise UnresumableThread(
                "order",
                f"the result of call {call_id!r} (message {position}) comes before the call "
                f"(message {where[call_id]})",
            )
        if call_id in answered:
            raise UnresumableThread(
                "pairing",
                f"call {call_id!r} is answered twice (messages {answered[call_id]} and {position})",
            )
        answered[call_id] = position
    for deferred in pending:
        if deferred not in where:
            raise UnresumableThread(
                "pending",
                f"the deferred call {deferred!r} is gone: the approval would answer nothing",
            )
    unanswered = [c for _, c in calls if c not in answered and c not in pending]
    if unanswered:
        raise UnresumableThread(
            "pairing", f"call {unanswered[0]!r} has no result (only the deferred call may wait)"
        )


def replace_thread(
    client: Client, workflow_id: str, rewrite: Callable[[list[Message]], list[Message]]
) -> StateReplaced:
    """Rewrite a parked tool loop's thread, refusing (`UnresumableThread`, nothing
    written) a new thread it could not resume from; a loser of the compare-and-swap
    is answered `won=False` with what it lost to."""
    deferred: list[str] = []

    def rewritten(thread: list[Message]) -> list[Message]:
        deferred[:] = pending_calls(thread)
        return rewrite(thread)

    return client.replace_state(
        workflow_id,
        THREAD,
        rewritten,
        validate=lambda new: assert_resumable_thread(new, deferred),
    )
