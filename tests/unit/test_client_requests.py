"""Client without a server: the requests it builds and how it reads the answers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from troth import Client, ConfigurationError, JsonCodec, Payload, PromiseState
from troth.v1 import promises_pb2, types_pb2

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def wire_promise(**fields: Any) -> types_pb2.Promise:
    message = types_pb2.Promise(id="p", state=types_pb2.PROMISE_STATE_PENDING, create_time=NOW)
    for name, value in fields.items():
        if isinstance(value, datetime):
            getattr(message, name).FromDatetime(value)
        elif isinstance(value, types_pb2.Payload):
            getattr(message, name).CopyFrom(value)
        elif name == "tags":
            message.tags.update(value)
        else:
            setattr(message, name, value)
    return message


class Recorder:
    """Replaces Transport.call: records requests, answers with the next canned response."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.responses: list[Any] = []

    def __call__(self, method: object, request: Any, *, timeout: float | None, **_: Any) -> Any:
        self.requests.append(request)
        return self.responses.pop(0)


@pytest.fixture
def client() -> Iterator[Client]:
    with Client("127.0.0.1:7070", timeout=3.0) as c:
        yield c


@pytest.fixture
def recorder(client: Client, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(client._transport, "call", rec)
    return rec


def test_create_builds_the_request_and_reads_the_promise(
    client: Client, recorder: Recorder
) -> None:
    recorder.responses.append(
        promises_pb2.CreatePromiseResponse(
            promise=wire_promise(
                id="a",
                param=types_pb2.Payload(headers={"content-type": "application/json"}, data=b"[1]"),
                tags={"t": "1"},
                expire_time=NOW + timedelta(hours=1),
            ),
            created=True,
        )
    )
    result = client.create("a", [1], tags={"t": "1"}, ttl=timedelta(minutes=5), strict=True)
    (request,) = recorder.requests
    assert request.id == "a"
    assert request.param.data == b"[1]"
    assert dict(request.param.headers) == {"content-type": "application/json"}
    assert dict(request.tags) == {"t": "1"}
    assert request.WhichOneof("expiry") == "ttl"
    assert request.ttl.ToTimedelta() == timedelta(minutes=5)
    assert request.strict and not request.never_expires
    # No key is invented for creates: identical keyless repeats must stay deduplicated.
    assert request.idempotency_key == ""
    assert result.created
    promise = result.promise
    assert promise.state is PromiseState.PENDING
    assert client.decode(promise.param) == [1]
    assert promise.tags == {"t": "1"}
    assert promise.create_time == NOW and promise.create_time.tzinfo is not None
    assert promise.expire_time == NOW + timedelta(hours=1)
    assert promise.settle_time is None
    assert not promise.is_settled


def test_create_with_expire_time_and_never_expires(client: Client, recorder: Recorder) -> None:
    recorder.responses += [promises_pb2.CreatePromiseResponse(promise=wire_promise())] * 2
    client.create("a", expire_time=NOW)
    client.create("b", never_expires=True, idempotency_key="k")
    first, second = recorder.requests
    assert first.WhichOneof("expiry") == "expire_time"
    assert first.expire_time.ToDatetime(tzinfo=UTC) == NOW
    assert second.WhichOneof("expiry") is None and second.never_expires
    assert second.idempotency_key == "k"
    assert not first.HasField("param") or first.param.ByteSize() == 0


def test_create_refuses_two_expiries_and_naive_datetimes(client: Client) -> None:
    with pytest.raises(ValueError, match="ttl and never_expires"):
        client.create("a", ttl=timedelta(seconds=1), never_expires=True)
    with pytest.raises(ValueError, match="no timezone"):
        client.create("a", expire_time=datetime(2030, 1, 1))


@pytest.mark.parametrize("created", [True, False])
def test_start_sends_the_workflow_and_tells_whether_it_created_the_run(
    client: Client, recorder: Recorder, created: bool
) -> None:
    """No idempotency key unless given: the server recognises a repeat by workflow,
    group and arguments, and the caller's own key vouches for any arguments."""
    recorder.responses.append(
        promises_pb2.CreatePromiseResponse(promise=wire_promise(id="w-1"), created=created)
    )
    handle = client.start("publish", "post-7", id="w-1", group="editors")
    assert handle.created is created and handle.id == "w-1"
    (sent,) = recorder.requests
    # A start made inside a span also carries `troth:traceparent`; whether one is open
    # depends on what ran before in this process (OpenTelemetry's provider is global).
    tags = {k: v for k, v in sent.tags.items() if k != "troth:traceparent"}
    assert tags == {"troth:invoke": "editors", "troth:func": "publish"}
    assert sent.idempotency_key == "" and not sent.HasField("ttl")
    assert JsonCodec().decode(Payload(dict(sent.param.headers), sent.param.data)) == ["post-7"]

    recorder.responses.append(
        promises_pb2.CreatePromiseResponse(promise=wire_promise(id="w-1"), created=False)
    )
    client.start("publish", id="w-1", ttl=timedelta(days=7), idempotency_key="req-42")
    sent = recorder.requests[-1]
    assert sent.idempotency_key == "req-42"
    assert sent.ttl.ToTimedelta() == timedelta(days=7)
    assert client.handle("w-1").created is False


def test_start_ttl_must_be_a_timedelta(client: Client) -> None:
    with pytest.raises(TypeError, match="ttl must be a timedelta"):
        client.start("publish", id="w-1", ttl=3600)  # type: ignore[arg-type]


def test_settle_generates_a_fresh_key(client: Client, recorder: Recorder) -> None:
    recorder.responses += [
        promises_pb2.ResolvePromiseResponse(
            promise=wire_promise(state=types_pb2.PROMISE_STATE_RESOLVED), applied=True
        )
    ] * 2
    client.resolve("a", {"ok": True})
    client.resolve("a", {"ok": True})
    first, second = recorder.requests
    assert len(first.idempotency_key) == 32
    int(first.idempotency_key, 16)
    assert first.idempotency_key != second.idempotency_key
    assert first.value.data == b'{"ok":true}'


def test_settle_recognises_its_own_earlier_attempt(client: Client, recorder: Recorder) -> None:
    # The server says applied=False to a repeat carrying the winner's key. With a
    # generated key the winner can only have been this call's lost first attempt.
    def answer(method: object, request: Any, **_: Any) -> Any:
        recorder.requests.append(request)
        return promises_pb2.CancelPromiseResponse(
            promise=wire_promise(
                state=types_pb2.PROMISE_STATE_REJECTED_CANCELED,
                idempotency_key_for_settle=request.idempotency_key,
            ),
            applied=False,
        )

    client._transport.call = answer  # type: ignore[method-assign]
    result = client.cancel("a")
    assert result.applied
    assert result.promise.state is PromiseState.REJECTED_CANCELED


def test_settle_with_own_key_reports_the_server_verdict(client: Client, recorder: Recorder) -> None:
    recorder.responses.append(
        promises_pb2.RejectPromiseResponse(
            promise=wire_promise(
                state=types_pb2.PROMISE_STATE_REJECTED, idempotency_key_for_settle="k"
            ),
            applied=False,
        )
    )
    result = client.reject("a", "boom", idempotency_key="k")
    assert not result.applied
    assert isinstance(recorder.requests[0], promises_pb2.RejectPromiseRequest)
    assert recorder.requests[0].idempotency_key == "k"


def test_search_pages(client: Client, recorder: Recorder) -> None:
    recorder.responses += [
        promises_pb2.SearchPromisesResponse(
            promises=[wire_promise(id="a"), wire_promise(id="b")], next_page_token="t1"
        ),
        promises_pb2.SearchPromisesResponse(promises=[wire_promise(id="c")]),
    ]
    ids = [p.id for p in client.search_all("a*", states=["RESOLVED"], tags={"k": "v"}, page_size=2)]
    assert ids == ["a", "b", "c"]
    first, second = recorder.requests
    assert first.id == "a*" and list(first.states) == [types_pb2.PROMISE_STATE_RESOLVED]
    assert dict(first.tags) == {"k": "v"} and first.page_size == 2 and first.page_token == ""
    assert second.page_token == "t1"


def test_search_page_token_none_at_end(client: Client, recorder: Recorder) -> None:
    recorder.responses.append(promises_pb2.SearchPromisesResponse())
    page = client.search()
    assert page.promises == () and page.next_page_token is None
    assert recorder.requests[0].id == "*" and recorder.requests[0].page_size == 0


def test_search_rejects_unknown_state(client: Client) -> None:
    with pytest.raises(ValueError, match="use one of PENDING"):
        client.search(states=["DONE"])


def test_none_is_the_empty_payload(client: Client) -> None:
    assert client.encode(None) == Payload()
    assert client.decode(Payload()) is None
    assert client.decode(JsonCodec().encode(None)) is None


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_bad_timeout_is_a_configuration_error(timeout: float) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        Client(timeout=timeout)


def test_codec_must_fit_the_protocol() -> None:
    with pytest.raises(ConfigurationError, match="codec"):
        Client(codec=object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"limit": 0}, ValueError),
        ({"limit": True}, TypeError),
        ({"states": ["SLEEPING"]}, ValueError),
        ({"created_after": datetime(2030, 1, 1)}, ValueError),  # naive: ambiguous
        ({"group": 7}, TypeError),
        ({"paused": "yes"}, TypeError),
    ],
)
def test_search_workflows_refuses_bad_arguments_before_any_call(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with Client("127.0.0.1:1") as client, pytest.raises(error):
        client.search_workflows(**kwargs)


def test_iter_workflows_and_retry_now_check_their_arguments_before_any_call() -> None:
    with Client("127.0.0.1:1") as client:
        with pytest.raises(ValueError, match="page_size"):
            next(client.iter_workflows(page_size=1001))
        with pytest.raises(TypeError):
            client.retry_workflow_now(None)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            client.workflow_steps(3)  # type: ignore[arg-type]
