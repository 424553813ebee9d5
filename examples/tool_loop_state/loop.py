"""The tool loop: a scripted model calls tools; a call to `publish` waits for an
approver. The loop keeps its message thread in the workflow's state slot `thread`
(`ctx.state`, `ctx.set_state`), so that an operator may rewrite it (shrink it, say)
while the run waits days for the approver, and the loop, once resumed, carries on
from the thread as rewritten."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from thread import THREAD

if TYPE_CHECKING:
    from troth import Context

__all__ = ["NEEDS_APPROVAL", "model", "run_tool", "tool_loop"]

NEEDS_APPROVAL = frozenset({"publish"})


def model(thread: list[dict[str, Any]]) -> dict[str, Any]:
    """A scripted model (pure): first it searches and publishes, then it answers."""
    asked = next(m["content"] for m in thread if m["role"] == "user")
    if not any(m["role"] == "assistant" for m in thread):
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call-1", "name": "search", "args": {"query": asked}},
                {"id": "call-2", "name": "publish", "args": {"channel": "blog", "text": asked}},
            ],
        }
    published = next(
        (m["content"] for m in thread if m.get("tool_call_id") == "call-2"), "nothing published"
    )
    size = sum(len(str(m.get("content", ""))) for m in thread)
    return {
        "role": "assistant",
        "content": f"{published} (the thread: {len(thread)} messages, {size} characters)",
    }


def run_tool(call: dict[str, Any]) -> str:
    """The tools: a verbose search, and a publish."""
    if call["name"] == "search":
        query = call["args"]["query"]
        return "\n".join(f"result {n}: a long page about {query}" for n in range(1, 41))
    return f"published on {call['args']['channel']}"


def tool_loop(ctx: Context, task: str) -> Generator[Any, Any, dict[str, Any]]:
    yield ctx.set_state(THREAD, [{"role": "user", "content": task}])
    while True:
        thread = yield ctx.state(THREAD)
        reply = yield ctx.run(model, thread)
        yield ctx.set_state(THREAD, [*thread, reply])
        if not reply.get("tool_calls"):
            return {"answer": reply["content"], "messages": len(thread) + 1}
        for call in reply["tool_calls"]:
            if call["name"] in NEEDS_APPROVAL:
                approval = yield ctx.promise(
                    id=f"{ctx.id}.approve-{call['id']}",
                    title=f"Run {call['name']}?",
                    tags={"approval": "tool-call", "call": call["id"]},
                )
                decision = yield approval  # parked here, for days if need be
                approved = isinstance(decision, dict) and decision.get("approved") is True
                result = (yield ctx.run(run_tool, call)) if approved else "declined"
            else:
                result = yield ctx.run(run_tool, call)
            # The thread as it is now: an operator may have rewritten it while we waited.
            thread = yield ctx.state(THREAD)
            answer = {"role": "tool", "tool_call_id": call["id"], "content": result}
            yield ctx.set_state(THREAD, [*thread, answer])
