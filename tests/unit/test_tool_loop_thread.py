"""examples/tool_loop_state/thread.py: `assert_resumable_thread` refuses each thread the
loop could not resume from, naming the rule: (1) broken tool-call/result pairing, (2) a
result before its call, (3) a duplicated call id, (4) an empty thread, (5) the deferred
call dropped; and lets a resumable rewrite (a result shrunk) through."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tool_loop_state"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tool_loop_state_thread", EXAMPLE / "thread.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


thread_module = _load()
check = thread_module.assert_resumable_thread
Unresumable = thread_module.UnresumableThread

CALL_1 = {"id": "call-1", "name": "search", "args": {"query": "q"}}
CALL_2 = {"id": "call-2", "name": "publish", "args": {"channel": "blog"}}
PARKED: list[dict[str, Any]] = [
    {"role": "user", "content": "ship it"},
    {"role": "assistant", "content": "", "tool_calls": [CALL_1, CALL_2]},
    {"role": "tool", "tool_call_id": "call-1", "content": "a long result"},
]
"""A thread parked on the approval of call-2 (the deferred call)."""
PENDING = ["call-2"]


def refused(thread: list[dict[str, Any]]) -> tuple[str, str]:
    with pytest.raises(Unresumable) as caught:
        check(thread, PENDING)
    return caught.value.rule, str(caught.value)


def test_the_parked_thread_and_a_shrunk_one_are_resumable() -> None:
    assert thread_module.pending_calls(PARKED) == PENDING
    check(PARKED, PENDING)
    shrunk = copy.deepcopy(PARKED)
    shrunk[2]["content"] = "[summarized]"
    check(shrunk, PENDING)


def test_1_broken_pairing_is_refused() -> None:
    no_result = PARKED[:2]
    assert refused(no_result) == (
        "pairing",
        "call 'call-1' has no result (only the deferred call may wait)",
    )
    orphan = [*PARKED, {"role": "tool", "tool_call_id": "call-9", "content": "?"}]
    assert refused(orphan)[0] == "pairing" and "answers no call" in refused(orphan)[1]
    twice = [*PARKED, PARKED[2]]
    assert refused(twice)[0] == "pairing" and "answered twice" in refused(twice)[1]


def test_2_a_result_before_its_call_is_refused() -> None:
    assert refused([PARKED[0], PARKED[2], PARKED[1]]) == (
        "order",
        "the result of call 'call-1' (message 1) comes before the call (message 2)",
    )


def test_3_a_duplicated_call_id_is_refused() -> None:
    again = {"role": "assistant", "content": "", "tool_calls": [CALL_1]}
    assert refused([*PARKED[:2], again, PARKED[2]]) == (
        "duplicate",
        "call id 'call-1' is used twice (messages 1 and 2)",
    )


def test_4_an_empty_thread_is_refused() -> None:
    assert refused([])[0] == "empty"


def test_5_dropping_the_deferred_call_is_refused() -> None:
    dropped = [PARKED[0], {**PARKED[1], "tool_calls": [CALL_1]}, PARKED[2]]
    assert refused(dropped) == (
        "pending",
        "the deferred call 'call-2' is gone: the approval would answer nothing",
    )
    answered = [*PARKED, {"role": "tool", "tool_call_id": "call-2", "content": "forged"}]
    assert refused(answered)[0] == "pending"
