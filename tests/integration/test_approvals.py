"""Human-in-the-loop decisions with a real server and a real Worker: typed approvals,
rejection and timeout as answers, settling before the wait exists, and cancellation
with compensation (issue 5, points 1, 2, 4 and 9).

The `server` fixture runs each test on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import enum
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic
import pytest
from _support import append, eventually, exists, lines

from troth import (
    Cancelled,
    Client,
    Context,
    InvalidArgumentError,
    NotFoundError,
    Payload,
    PromiseState,
    Rejected,
    TimedOut,
    Worker,
)
from troth.errors import DeadlineExceededError

if TYPE_CHECKING:
    from _support import ServerProcess


class Channel(enum.StrEnum):
    BLOG = "blog"
    NEWSLETTER = "newsletter"


@dataclass(frozen=True)
class Reviewer:
    name: str
    email: str | None = None


@dataclass(frozen=True)
class PublishDecision:
    approved: bool
    channel: Channel
    reviewer: Reviewer
    tags: list[str]
    note: str = ""


class Budget(pydantic.BaseModel):
    amount: int = pydantic.Field(ge=0, le=1000)
    currency: Literal["EUR", "USD"]


class PlainText:
    """A codec a gateway might use: its values are not JSON."""

    def encode(self, value: Any) -> Payload:
        return Payload({"content-type": "text/plain"}, str(value).encode())

    def decode(self, payload: Payload) -> Any:
        return payload.data.decode()


# --- workflows ----------------------------------------------------------------------


def typed_publish(ctx: Context, post: str) -> Generator[Any, Any, dict[str, Any]]:
    approval = yield ctx.promise(
        schema=PublishDecision,
        title=f"Publish {post}?",
        message=f"The draft of {post} is ready for review.",
        tags={"post": post},
    )
    decision = yield approval
    assert isinstance(decision, PublishDecision)  # typed, not a dict
    assert isinstance(decision.channel, Channel) and isinstance(decision.reviewer, Reviewer)
    return {
        "approved": decision.approved,
        "channel": decision.channel.value,
        "by": decision.reviewer.name,
    }


def typed_budget(ctx: Context) -> Generator[Any, Any, dict[str, Any]]:
    budget = yield (yield ctx.promise(schema=Budget, title="Budget?"))
    assert isinstance(budget, Budget)
    return {"amount": budget.amount, "currency": budget.currency}


def declined_is_an_answer(ctx: Context, path: str) -> Generator[Any, Any, dict[str, Any]]:
    approval = yield ctx.promise(schema={"type": "boolean"}, title="Run the tool?")
    try:
        yield approval
    except Rejected as declined:
        # The workflow carries on: the "model" gets a declined tool result.
        yield ctx.run(append, path, f"declined: {declined.reason}")
        return {"tool_result": {"declined": declined.reason}}
    return {"tool_result": "ran"}


def timeout_is_an_answer(ctx: Context) -> Generator[Any, Any, str]:
    approval = yield ctx.promise(timeout=timedelta(milliseconds=300))
    try:
        yield approval
    except TimedOut as exc:
        return f"nobody answered {exc.promise_id}; escalated"
    return "answered"


def uncaught_rejection(ctx: Context) -> Generator[Any, Any, str]:
    yield (yield ctx.promise())
    return "approved"


def uncaught_timeout(ctx: Context) -> Generator[Any, Any, str]:
    yield (yield ctx.promise(timeout=timedelta(milliseconds=300)))
    return "approved"


def known_id(ctx: Context, post: str) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(id=f"approval-{post}", schema={"type": "object"})
    return (yield approval)


def with_compensation(ctx: Context, path: str) -> Generator[Any, Any, str]:
    yield ctx.run(append, path, "reserved the slot")
    legal = yield ctx.promise(title="Legal review")
    editor = yield ctx.promise(title="Editor review")
    try:
        yield ctx.all([legal, editor])
    except Cancelled:
        # Compensation is a checkpointed step like any other: it runs once.
        yield ctx.run(append, path, "released the slot")
        raise
    return "published"


WORKFLOWS = [
    typed_publish, typed_budget, declined_is_an_answer, timeout_is_an_answer,
    uncaught_rejection, uncaught_timeout, known_id, with_compensation,
]  # fmt: skip


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def worker(client: Client) -> Iterator[Worker]:
    w = Worker(client, group="approvals", concurrency=8, lease=timedelta(seconds=5))
    for fn in WORKFLOWS:
        w.workflow(fn)
    w.start()
    yield w
    w.stop()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(client: Client, promise_id: str) -> None:
    eventually(lambda: exists(client, promise_id), what=f"promise {promise_id}")


# --- 1. typed approvals ---------------------------------------------------------------


def test_a_typed_approval_refuses_bad_decisions_by_field_and_types_good_ones(
    client: Client, worker: Worker, server: ServerProcess
) -> None:
    handle = client.start(typed_publish, "post-7", id=new_id("publish"), group="approvals")
    approval_id = f"{handle.id}.0"
    wait_for(client, approval_id)

    approval = client.get(approval_id)
    assert approval.title == "Publish post-7?"
    assert approval.message == "The draft of post-7 is ready for review."
    assert approval.requested_by == f"workflow {handle.id}"
    assert approval.tags["post"] == "post-7"
    assert approval.tags["troth:group"] == "approvals"
    assert approval.schema is not None and approval.schema["title"] == "PublishDecision"
    found = client.search(tags={"post": "post-7"}, states=["PENDING"]).promises
    assert [p.id for p in found] == [approval_id]
    assert found[0].title == "Publish post-7?"

    good = {"approved": True, "channel": "blog", "reviewer": {"name": "ana"}, "tags": []}
    bad_cases = {
        "value.channel": {**good, "channel": "tiktok"},
        "value.reviewer.name": {**good, "reviewer": {"name": 7}},
        "value.tags[1]": {**good, "tags": ["ok", 3]},
        "value": {"channel": "blog", "reviewer": {"name": "ana"}, "tags": []},  # no approved
    }
    for field, value in bad_cases.items():
        with pytest.raises(InvalidArgumentError) as refused:
            client.resolve(approval_id, value)
        assert refused.value.field == field, (field, str(refused.value))
        assert "schema" in str(refused.value)
    with (
        Client(server.address, codec=PlainText()) as plain,
        pytest.raises(InvalidArgumentError, match="must be JSON"),
    ):
        plain.resolve(approval_id, "yes")
    # Nothing was spent: the promise still waits, and the workflow with it.
    assert client.get(approval_id).state is PromiseState.PENDING
    with pytest.raises(DeadlineExceededError):
        handle.result(timeout=0.2)

    decision = PublishDecision(True, Channel.NEWSLETTER, Reviewer("ana", "ana@example.org"), ["x"])
    client.resolve(approval_id, decision)  # a dataclass encodes as its JSON object
    assert handle.result(timeout=10) == {"approved": True, "channel": "newsletter", "by": "ana"}


def test_a_pydantic_model_is_a_schema(client: Client, worker: Worker) -> None:
    handle = client.start(typed_budget, id=new_id("budget"), group="approvals")
    approval_id = f"{handle.id}.0"
    wait_for(client, approval_id)
    with pytest.raises(InvalidArgumentError) as refused:
        client.resolve(approval_id, {"amount": 5000, "currency": "EUR"})
    assert refused.value.field == "value.amount"
    client.resolve(approval_id, Budget(amount=250, currency="EUR"))
    assert handle.result(timeout=10) == {"amount": 250, "currency": "EUR"}


def test_a_schema_that_is_not_a_schema_is_refused_at_create(client: Client) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        client.create(new_id("bad-schema"), schema={"type": "no-such-type"})
    assert refused.value.field.startswith("schema")
    with pytest.raises(InvalidArgumentError) as refused:
        client.create(new_id("bad-schema"), title="x" * 5000)
    assert refused.value.field == "title"


# --- 2. rejection and timeout are answers -----------------------------------------------


def test_a_rejection_is_caught_and_the_workflow_carries_on(
    client: Client, worker: Worker, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    handle = client.start(
        declined_is_an_answer, str(effects), id=new_id("declined"), group="approvals"
    )
    wait_for(client, f"{handle.id}.0")
    # A rejection carries a reason, not a decision: the schema does not apply to it.
    client.reject(f"{handle.id}.0", {"reason": "off-brand"})
    assert handle.result(timeout=10) == {"tool_result": {"declined": "off-brand"}}
    assert lines(effects) == ["declined: off-brand"]


def test_a_timeout_is_caught_and_the_workflow_carries_on(client: Client, worker: Worker) -> None:
    handle = client.start(timeout_is_an_answer, id=new_id("timeout"), group="approvals")
    assert handle.result(timeout=10) == f"nobody answered {handle.id}.0; escalated"


def test_an_uncaught_rejection_or_timeout_fails_the_workflow_clearly(
    client: Client, worker: Worker
) -> None:
    rejected = client.start(uncaught_rejection, id=new_id("uncaught"), group="approvals")
    wait_for(client, f"{rejected.id}.0")
    client.reject(f"{rejected.id}.0", {"reason": "no budget"})
    with pytest.raises(Rejected) as failed:
        rejected.result(timeout=10)
    root = client.get(rejected.id)
    assert root.state is PromiseState.REJECTED
    error = client.decode(root.value)
    assert error["type"] == "troth.errors.PromiseRejectedError"
    assert f"{rejected.id}.0" in error["message"] and "no budget" in error["message"]
    assert "no budget" in str(failed.value)

    timed = client.start(uncaught_timeout, id=new_id("uncaught-timeout"), group="approvals")
    with pytest.raises(Rejected) as failed:
        timed.result(timeout=10)
    assert "timed out" in str(failed.value)
    error = client.decode(client.get(timed.id).value)
    assert error["type"] == "troth.errors.PromiseTimedOutError"
    assert f"{timed.id}.0" in error["message"] and "timed out" in error["message"]


# --- 4. settle before the wait exists ---------------------------------------------------


def test_a_decision_that_arrives_before_the_wait_is_kept(client: Client, worker: Worker) -> None:
    post = new_id("post")
    approval_id = f"approval-{post}"
    # Without asking for it, an unknown id stays NOT_FOUND and nothing is created.
    with pytest.raises(NotFoundError):
        client.resolve(approval_id, {"ok": True})
    assert not exists(client, approval_id)

    early = client.resolve(approval_id, {"ok": True}, create_if_missing=True)
    assert early.applied and early.promise.state is PromiseState.RESOLVED
    assert early.promise.tags == {"troth:early": "true"}

    handle = client.start(known_id, post, id=new_id("early"), group="approvals")
    assert handle.result(timeout=10) == {"ok": True}
    adopted = client.get(approval_id)
    assert adopted.tags["troth:kind"] == "promise" and "troth:early" not in adopted.tags
    assert adopted.requested_by == f"workflow {handle.id}"
    # A second early settle of the same id is an ordinary late settle: refused.
    with pytest.raises(Exception, match="already resolved"):
        client.resolve(approval_id, {"ok": False}, create_if_missing=True)


def test_an_early_rejection_reaches_the_workflow_too(client: Client, worker: Worker) -> None:
    post = new_id("post")
    client.reject(f"approval-{post}", {"reason": "too late"}, create_if_missing=True)
    handle = client.start(known_id, post, id=new_id("early-no"), group="approvals")
    with pytest.raises(Exception, match="too late"):
        handle.result(timeout=10)


def test_a_wait_created_first_is_settled_as_usual(client: Client, worker: Worker) -> None:
    post = new_id("post")
    handle = client.start(known_id, post, id=new_id("late"), group="approvals")
    wait_for(client, f"approval-{post}")
    result = client.resolve(f"approval-{post}", {"ok": 1}, create_if_missing=True)
    assert result.applied and result.promise.tags["troth:kind"] == "promise"
    assert handle.result(timeout=10) == {"ok": 1}


def troth_cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "troth"), "--server", address, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_the_cli_shows_the_metadata_and_settles_early(
    client: Client, worker: Worker, server: ServerProcess
) -> None:
    handle = client.start(typed_publish, "post-9", id=new_id("cli"), group="approvals")
    wait_for(client, f"{handle.id}.0")
    shown = troth_cli(server.address, "promises", "get", f"{handle.id}.0")
    assert shown.returncode == 0, shown.stderr
    assert "title:" in shown.stdout and "Publish post-9?" in shown.stdout
    assert f"requested by: workflow {handle.id}" in shown.stdout
    assert '"title":"PublishDecision"' in shown.stdout

    bad = '{"approved": 1, "channel": "blog", "reviewer": {"name": "ana"}, "tags": []}'
    refused = troth_cli(server.address, "promises", "resolve", f"{handle.id}.0", "--value", bad)
    assert refused.returncode == 1
    assert "value.approved" in refused.stderr and "schema" in refused.stderr

    early_id = f"approval-{new_id('post')}"
    missing = troth_cli(server.address, "promises", "resolve", early_id, "--value", "{}")
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    early = troth_cli(
        server.address, "promises", "resolve", early_id, "--value", "{}", "--create-if-missing"
    )
    assert early.returncode == 0, early.stderr
    assert "troth:early=true" in early.stdout


# --- 9. cancellation with compensation --------------------------------------------------


def test_cancel_rejects_pending_approvals_and_compensation_runs_once(
    client: Client, worker: Worker, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    handle = client.start(with_compensation, str(effects), id=new_id("cancel"), group="approvals")
    wait_for(client, f"{handle.id}.2")
    assert handle.cancel({"reason": "post withdrawn"}) is True
    with pytest.raises(Cancelled):
        handle.result(timeout=10)
    for approval in (f"{handle.id}.1", f"{handle.id}.2"):
        assert client.get(approval).state is PromiseState.REJECTED_CANCELED
    # The root says cancelled at once; the workflow's compensation follows.
    wait_for(client, f"{handle.id}.3")
    assert lines(effects) == ["reserved the slot", "released the slot"]
    compensation = client.get(f"{handle.id}.3")
    assert compensation.state is PromiseState.RESOLVED
    assert compensation.tags["troth:func"] == "append"
    # A human who answers afterwards is told the wait was cancelled.
    with pytest.raises(Exception, match="canceled"):
        client.resolve(f"{handle.id}.1", True)
