"""The step rules of `domain.steps`: namespaces, fences, ownership and how steps end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from troth.errors import Reason
from troth_server.domain.access import ANY_GROUP, LOCAL_DEVELOPER, Principal, Role
from troth_server.domain.errors import PromiseAlreadyExists
from troth_server.domain.promise import EMPTY, Promise, PromiseState
from troth_server.domain.steps import (
    Fence,
    OutsideWorkersGroups,
    ReservedForWorkflow,
    check_fence,
    check_owner,
    check_step_owner,
    check_unfenced_create,
    check_unfenced_settle,
    check_worker_early,
    check_worker_reach,
    check_worker_start,
    ended,
    is_step_id,
    links_under,
    namespace_roots,
    reach_parent,
    step_workflow,
)
from troth_server.domain.task import StaleCounter, Task, TaskKind, TaskNotFound, TaskState

T0 = 1_767_225_600_000
ROOT = {"troth:invoke": "g", "troth:func": "wf"}


def _promise(promise_id: str, tags: dict[str, str] | None = None, **fields: Any) -> Promise:
    fields.setdefault("state", PromiseState.PENDING)
    return Promise(promise_id, param=EMPTY, value=EMPTY, tags=tags or {}, create_time=T0, **fields)


def test_the_step_namespace_is_a_root_then_a_number() -> None:
    assert namespace_roots("wf.3") == ["wf"]
    assert namespace_roots("wf.3.1") == ["wf", "wf.3"]
    assert namespace_roots("acme-x.invoice-42") == []
    assert namespace_roots("acme-x.child") == []
    assert namespace_roots("a.b.7") == ["a.b"]
    assert namespace_roots("plain") == []


def test_a_numbered_steps_id_is_the_form_x_dot_a_number() -> None:
    assert is_step_id("order-42.0") and step_workflow("order-42.0") == "order-42"
    assert step_workflow("order-42.3.1") == "order-42.3"
    assert step_workflow("a.b.17") == "a.b"
    for other in ("order-42", "order-42.review", "order-42.0a", ".5", "x.", "x.\u0663"):
        assert not is_step_id(other), other


def test_nobody_creates_a_numbered_steps_id_without_a_fence_started_or_not() -> None:
    loaded = {"wf": _promise("wf", ROOT), "plain": _promise("plain")}
    for promise_id in ("plain.0", "not-started-yet.0", "wf.0", "wf.3.1"):
        with pytest.raises(ReservedForWorkflow, match="numbered step") as refused:
            check_unfenced_create(promise_id, {}, loaded)
        assert "choose another id" in refused.value.message
        with pytest.raises(ReservedForWorkflow, match="numbered step"):
            check_unfenced_settle(promise_id, None, loaded)  # create_if_missing
    check_unfenced_create("order-42-0", {}, loaded)
    check_unfenced_create("order-42.review-0", {}, loaded)


def test_a_fenced_create_takes_numbered_ids_only_in_its_own_workflow() -> None:
    check_step_owner("wf.0", "wf")
    check_step_owner("wf.3.1", "wf.3")  # a child workflow's own step
    check_step_owner("approval-7", "wf")  # an id the workflow names
    check_step_owner("other.approval", "wf")
    for promise_id, workflow_id in (("other.0", "wf"), ("wf.3.1", "wf"), ("wf.0", "wf.3")):
        with pytest.raises(ReservedForWorkflow, match="numbered step") as refused:
            check_step_owner(promise_id, workflow_id)
        assert f"not one of workflow {workflow_id!r}" in refused.value.message


def test_unfenced_writes_of_checkpoints_are_refused() -> None:
    loaded = {"wf": _promise("wf", ROOT), "plain": _promise("plain")}
    check_unfenced_create("wf.invoice", {}, loaded)  # not a numbered step
    with pytest.raises(ReservedForWorkflow, match="namespace"):
        check_unfenced_create("wf.3.invoice", {}, loaded)  # a child's namespace
    with pytest.raises(ReservedForWorkflow, match="'run' step"):
        check_unfenced_create("anything", {"troth:kind": "run"}, loaded)
    check_unfenced_create("anything", {"troth:kind": "promise"}, loaded)
    latent = _promise("wf.0", {"troth:kind": "promise"}, parent_id="wf", root_id="wf")
    check_unfenced_settle("wf.0", latent, loaded)  # humans settle latent steps
    run = _promise("wf.1", {"troth:kind": "run"}, parent_id="wf", root_id="wf")
    with pytest.raises(ReservedForWorkflow):
        check_unfenced_settle("wf.1", run, loaded)
    with pytest.raises(ReservedForWorkflow):
        check_unfenced_settle("wf.2", None, loaded)  # create_if_missing in the namespace
    check_unfenced_settle("approval-7", None, loaded)  # settle-before-wait, named waits


def test_a_fence_writes_pending_steps_at_the_current_counter_and_results_at_any() -> None:
    task = Task("t", "wf", "g", TaskKind.INVOKE, TaskState.CLAIMED, counter=3, worker_id="w")
    assert check_fence(task, Fence("t", 3, "w"), pending=True) is task
    with pytest.raises(StaleCounter):
        check_fence(task, Fence("t", 2, "w"), pending=True)
    with pytest.raises(StaleCounter):
        check_fence(task, Fence("t", 3, "other"), pending=True)
    assert check_fence(task, Fence("t", 1, "w-old"), pending=False) is task
    with pytest.raises(StaleCounter):
        check_fence(task, Fence("t", 4, "w"), pending=False)
    with pytest.raises(TaskNotFound):
        check_fence(None, Fence("t", 1, "w"), pending=False)


def test_only_the_workflows_own_step_or_an_early_answer_to_a_wait_is_reused() -> None:
    workflow = _promise("wf.3", ROOT, root_id="wf", parent_id="wf")
    assert links_under(workflow) == ("wf", "wf.3")
    assert links_under(_promise("wf", ROOT)) == ("wf", "wf")
    own = _promise("wf.3.0", parent_id="wf.3")
    check_owner(own, workflow, latent=False, early=False)
    check_owner(_promise("x"), workflow, latent=True, early=True)
    for taken, latent, early in [
        (_promise("x"), True, False),  # nobody's
        (_promise("x", parent_id="other"), True, False),  # another workflow's
        (_promise("x"), False, True),  # an early answer is no run step's record
    ]:
        with pytest.raises(PromiseAlreadyExists, match="not this workflow's step"):
            check_owner(taken, workflow, latent=latent, early=early)


def test_a_step_ends_with_its_root_saying_why() -> None:
    step = _promise("wf.0", parent_id="wf", root_id="wf")
    for state, reason in [
        (PromiseState.RESOLVED, "workflow ended"),
        (PromiseState.REJECTED, "workflow ended"),
        (PromiseState.REJECTED_CANCELED, "workflow cancelled"),
        (PromiseState.REJECTED_TIMEDOUT, "workflow timed out"),
    ]:
        root = _promise("wf", ROOT, state=state, settled_by="ops")
        done = ended(step, root, T0 + 5)
        assert (done.state, done.settle_time, done.settled_by) == (
            PromiseState.REJECTED_CANCELED, T0 + 5, "ops",
        )  # fmt: skip
        assert json.loads(done.value.data) == {
            "reason": reason, "workflow": "wf", "workflow_state": state.value,
        }  # fmt: skip


def test_a_worker_reaches_only_its_groups_workflows_and_its_own_promises() -> None:
    a = Principal("w-a", frozenset({Role.WORKER}), frozenset({"ga"}))
    every = Principal("w-all", frozenset({Role.WORKER}), frozenset({ANY_GROUP}))
    hybrid = Principal("w-gw", frozenset({Role.WORKER, Role.GATEWAY}), frozenset({"gb"}))
    gateway = Principal("gw", frozenset({Role.GATEWAY}))
    root_a = _promise("wf", {"troth:invoke": "ga"})
    step_a = _promise("wf.0", parent_id="wf", root_id="wf")
    child_b = _promise("wf.1", {"troth:invoke": "gb"}, parent_id="wf", root_id="wf")
    standalone = _promise("loose", started_by="gw")
    own = _promise("mine", started_by="w-a")
    for promise, parent_group in ((root_a, None), (step_a, "ga"), (child_b, "ga"), (own, None)):
        check_worker_reach(a, promise, parent_group, "read")
    for reader in (hybrid, gateway, LOCAL_DEVELOPER):
        check_worker_reach(reader, standalone, None, "read")
    check_worker_reach(every, step_a, "gb", "read")  # '*': every group's workflows,
    with pytest.raises(OutsideWorkersGroups):
        check_worker_reach(every, standalone, None, "read")  # but no group is no workflow
    assert reach_parent(step_a, a) == "wf" and reach_parent(step_a, hybrid) is None
    cases = [
        (root_a, None, "group ga", hybrid),
        (step_a, "gb", "group gb", a),
        (step_a, None, "step of workflow 'wf'", a),
        (standalone, None, "belongs to no workflow", a),
    ]
    for promise, parent_group, why, reader in cases:
        if reader is hybrid:
            check_worker_reach(reader, promise, parent_group, "read")  # a gateway too
            continue
        with pytest.raises(OutsideWorkersGroups, match=why) as refused:
            check_worker_reach(reader, promise, parent_group, "settle")
        assert refused.value.reason is Reason.GROUP_NOT_ALLOWED
        assert refused.value.metadata["promise_id"] == promise.id
        assert "may not settle promise" in refused.value.message
    check_worker_start(a, "wf-new", {"troth:invoke": "ga"})
    check_worker_start(a, "loose-2", {})
    check_worker_start(hybrid, "wf-new", {"troth:invoke": "ga"})
    with pytest.raises(OutsideWorkersGroups, match="workflow of the group 'gb'"):
        check_worker_start(a, "wf-new", {"troth:invoke": "gb"})
    with pytest.raises(OutsideWorkersGroups, match="early"):
        check_worker_early(a, "approval-7")
    check_worker_early(gateway, "approval-7")
