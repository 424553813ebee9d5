"""Least privilege with authentication on (issue 26, items 5 and 7), on both stores.

One server per store with a token file: a gateway, two workers of two groups, a
principal that is both worker and gateway, an operator (and one scoped to
`acme-`), an admin. Shown here:

- a workflow's numbered step ids (`<id>.<n>`) are its own: nobody but the worker
  holding its task creates one, before the start or after, so a gateway cannot
  break `order-42` by creating `order-42.0` first;
- a worker reads and settles only the promises of workflows in its groups (and
  standalone promises it created itself);
- `SearchWorkers` shows a scoped operator neither workers' principals nor tasks;
- an `ALREADY_SETTLED` message never shows the winner's idempotency key.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from contextlib import ExitStack
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, write_token_file
from _pg import fresh_schema
from _support import error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth import Client, Context, Worker
from troth.errors import NotFoundError, Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from _support import ServerProcess

HOUR = Duration(seconds=3600)
GROUP_A, GROUP_B = "g-least-a", "g-least-b"
GRANTS = [
    Grant("gateway", ("gateway",)),
    Grant("worker-a", ("worker",), groups=(GROUP_A,)),
    Grant("worker-b", ("worker",), groups=(GROUP_B,)),
    Grant("worker-gateway", ("worker", "gateway"), groups=(GROUP_B,)),
    Grant("ops", ("operator",)),
    Grant("acme-ops", ("operator",), prefixes=("acme-",)),
    Grant("admin", ("admin",)),
]
Refusal = tuple[grpc.StatusCode, str, dict[str, str]]


class Site:
    """The server, and raw calls made as one principal or another."""

    def __init__(self, server: ServerProcess, channel: grpc.Channel, tokens: dict[str, str]):
        self.server = server
        self.tokens = tokens
        self.promises = promises_pb2_grpc.PromiseServiceStub(channel)
        self.tasks = tasks_pb2_grpc.TaskServiceStub(channel)

    def md(self, who: str) -> tuple[tuple[str, str], ...]:
        return bearer(self.tokens[who])

    def client(self, who: str) -> Client:
        return Client(self.server.address, timeout=10, token=self.tokens[who])

    def create(self, who: str, promise_id: str, **fields: Any) -> types_pb2.Promise:
        request = promises_pb2.CreatePromiseRequest(id=promise_id, ttl=HOUR, **fields)
        return self.promises.CreatePromise(request, metadata=self.md(who), timeout=10).promise  # type: ignore[no-any-return]

    def get(self, who: str, promise_id: str) -> types_pb2.Promise:
        request = promises_pb2.GetPromiseRequest(id=promise_id)
        return self.promises.GetPromise(request, metadata=self.md(who), timeout=10).promise  # type: ignore[no-any-return]

    def resolve(self, who: str, promise_id: str, **fields: Any) -> Any:
        request = promises_pb2.ResolvePromiseRequest(id=promise_id, **fields)
        return self.promises.ResolvePromise(request, metadata=self.md(who), timeout=10)

    def start(self, who: str, workflow_id: str, group: str) -> types_pb2.Promise:
        tags = {"troth:invoke": group, "troth:func": "f"}
        return self.create(who, workflow_id, tags=tags, param=types_pb2.Payload(data=b"[]"))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def site(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Site]:
    workdir = tmp_path_factory.mktemp("least")
    tokens = write_token_file(workdir / "tokens.toml", GRANTS)
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"), db_url=db_url)
        try:
            with server.channel() as channel:
                yield Site(server, channel, tokens)
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _refused(call: Callable[[], object]) -> Refusal:
    with pytest.raises(grpc.RpcError) as info:
        call()
    detail = error_info(info.value)
    return info.value.code(), detail.reason, dict(detail.metadata)  # type: ignore[attr-defined]


# -- item 5: a workflow's numbered step ids are its own --------------------------------


def _charge(order: str) -> str:
    return f"charged {order}"


def order(ctx: Context, order_id: str) -> Generator[Any, Any, dict[str, Any]]:
    receipt = yield ctx.run(_charge, order_id)
    approval = yield ctx.promise(title=f"ship {order_id}?")
    return {"receipt": receipt, "approval": (yield approval)}


def test_an_id_of_a_step_taken_in_advance_cannot_break_the_workflow(site: Site) -> None:
    wid = _id("order-")
    step, approval = f"{wid}.0", f"{wid}.1"
    denied = (grpc.StatusCode.PERMISSION_DENIED, Reason.RESERVED_FOR_WORKFLOW.value)
    attempts: dict[str, Callable[[], object]] = {
        "a create": lambda: site.create("gateway", step),
        "a create already settled": lambda: site.create(
            "gateway", step, resolved_with=types_pb2.Payload(data=b'"forged"')
        ),
        "an early settle": lambda: site.resolve("gateway", step, create_if_missing=True),
        "a start": lambda: site.start("gateway", step, GROUP_A),
        "a worker's create": lambda: site.create("worker-a", step),
        "an admin's create": lambda: site.create("admin", approval),
    }
    for what, attempt in attempts.items():
        code, reason, metadata = _refused(attempt)
        assert (code, reason) == denied, what
        assert metadata["promise_id"] in (step, approval), what
    with pytest.raises(grpc.RpcError) as again:
        site.create("gateway", step)
    assert "choose another id" in again.value.details()  # type: ignore[attr-defined]

    with site.client("worker-a") as worker_client, site.client("gateway") as gateway:
        worker = Worker(worker_client, group=GROUP_A, lease=timedelta(seconds=5))
        worker.workflow(order)
        worker.start()
        try:
            handle = gateway.start("order", wid, id=wid, group=GROUP_A)
            # After the start too: the approval it will create is its own.
            assert _refused(lambda: site.create("gateway", approval))[:2] == denied
            eventually(lambda: _pending(gateway, approval), what="the approval")
            assert gateway.resolve(approval, "yes").applied  # a human settles the latent step
            assert handle.result(timeout=30) == {"receipt": f"charged {wid}", "approval": "yes"}
        finally:
            worker.stop()
    assert site.get("gateway", step).parent_id == wid
    assert site.get("gateway", approval).parent_id == wid


def _pending(client: Client, promise_id: str) -> bool:
    try:
        return client.get(promise_id).state == "PENDING"
    except NotFoundError:  # not created yet
        return False


# -- item 7: idempotency keys only to their owner --------------------------------------


def test_an_already_settled_message_shows_the_winners_key_to_nobody(site: Site) -> None:
    promise_id = site.create("gateway", _id("keys-")).id
    site.resolve("gateway", promise_id, idempotency_key="the-winners-key")
    for who in ("worker-gateway", "admin"):
        with pytest.raises(grpc.RpcError) as lost:
            site.resolve(who, promise_id, idempotency_key="another-key")
        assert error_info(lost.value).reason == Reason.ALREADY_SETTLED
        details = lost.value.details()  # type: ignore[attr-defined]
        assert "the-winners-key" not in details and "the-winners-key" not in str(
            error_info(lost.value)
        )
        assert "by 'gateway'" in details and "with another idempotency key" in details
    # The winner's own strict repeat asking another state: its own key, not named either.
    with pytest.raises(grpc.RpcError) as strict:
        site.promises.RejectPromise(
            promises_pb2.RejectPromiseRequest(
                id=promise_id, idempotency_key="the-winners-key", strict=True
            ),
            metadata=site.md("gateway"),
            timeout=10,
        )
    assert "with this settle's idempotency key" in strict.value.details()  # type: ignore[attr-defined]
    # GetPromise shows it to its writer and admins only, as before.
    assert site.get("gateway", promise_id).idempotency_key_for_settle == "the-winners-key"
    assert site.get("ops", promise_id).idempotency_key_for_settle == ""
