"""Fuzzing every RPC of troth.v1.PromiseService and troth.v1.TaskService on a live server
(issue 10, 5).

Each example sends a short sequence of calls to the real server (SQLite, then
PostgreSQL): typed requests drawn from the request descriptors with hostile
values in every field, raw bytes that do not decode, and hostile schema/value
pairs (a schema whose check is expensive, then a resolve value that makes it
so). Every answer must pass `_fuzz_oracle.problems`; after each example the
server must be alive and healthy, and after the run the store must pass
`_fuzz_integrity.check_store`.

CI runs `CI_EXAMPLES` examples per store; `TROTH_FUZZ_EXAMPLES=N` runs N.
A failure prints the request that failed (text form and base64 wire bytes).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _fuzz_calls import Caller
from _fuzz_edges import (
    REDOS_SCHEMA,
    TOKEN_EDITS,
    Pools,
    edited_token,
    hostile_schemas,
    hostile_values,
    json_headers,
    principals,
    texts,
)
from _fuzz_integrity import check_store
from _fuzz_oracle import Call, describe, problems
from _fuzz_proto import Method, methods, oversized_request, raw_requests, requests
from _fuzz_settings import fuzz_settings, server_trouble, timeout
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import currently_in_test_context, given, note
from hypothesis import strategies as st

from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from _support import ServerProcess

CI_EXAMPLES = 60
pytestmark = pytest.mark.fuzz

JSON = {"content-type": "application/json"}
_CREATE = "/troth.v1.PromiseService/CreatePromise"
_RESOLVE = "/troth.v1.PromiseService/ResolvePromise"
_SEARCH = "/troth.v1.PromiseService/SearchPromises"


# --- what the fuzzer sends -----------------------------------------------------------


def typed_calls(method: Method, pools: Pools) -> st.SearchStrategy[list[Call]]:
    return st.builds(
        lambda request, who: [Call(method.path, request, method.server_streaming, who)],
        requests(method.request, pools),
        principals(),
    )


def raw_calls(method: Method, pools: Pools) -> st.SearchStrategy[list[Call]]:
    return raw_requests(method.request, pools).map(
        lambda raw: [Call(method.path, raw[1], method.server_streaming, what=raw[0])]
    )


def _pair(promise_id: str, schema: str, data: bytes, headers: dict[str, str]) -> list[Call]:
    create = promises_pb2.CreatePromiseRequest(id=promise_id, schema=schema)
    resolve = promises_pb2.ResolvePromiseRequest(
        id=promise_id, value=types_pb2.Payload(headers=headers, data=data)
    )
    return [Call(_CREATE, create, False), Call(_RESOLVE, resolve, False)]


def hostile_pairs() -> st.SearchStrategy[list[Call]]:
    """A promise with a schema whose check is costly, then a value that makes it so."""
    fresh = st.uuids().map(lambda u: f"fz-s{u.hex[:12]}")
    matched = st.sampled_from(
        (
            (REDOS_SCHEMA, hostile_values()),
            ('{"type":"array","uniqueItems":true}', hostile_values()),
            (
                '{"$defs":{"n":{"properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}',
                hostile_values(),
            ),
        )
    ).flatmap(lambda pair: st.tuples(st.just(pair[0]), pair[1]))
    anything = st.tuples(hostile_schemas(), hostile_values())
    return st.builds(
        lambda pid, schema_value, headers: _pair(pid, schema_value[0], schema_value[1], headers),
        fresh,
        st.one_of(matched, anything),
        st.one_of(st.just(JSON), json_headers()),
    )


def edited_tokens(pools: Pools) -> st.SearchStrategy[list[Call]]:
    """A real page token, edited, sent with the very query that issued it (so that
    the server's check of its fields, not of the query, is what answers)."""

    def search(index: int, edit: tuple[str, object], page_size: int) -> list[Call]:
        token = edited_token(pools.page_tokens[index], edit)
        query = _TOKEN_QUERIES[index]
        request = promises_pb2.SearchPromisesRequest(page_size=page_size, page_token=token, **query)
        return [Call(_SEARCH, request, False)]

    return st.builds(
        search,
        st.integers(0, len(pools.page_tokens) - 1),
        st.sampled_from(TOKEN_EDITS),
        st.integers(1, 3),
    )


def hostile_roots() -> st.SearchStrategy[list[Call]]:
    """A workflow root whose group or workflow name (the tags the server reads to
    make its task) is hostile: no worker may be left a task it can never poll."""
    tags = st.fixed_dictionaries(
        {"troth:invoke": st.one_of(texts(), st.just("fz-group")), "troth:func": texts()}
    )
    return st.builds(
        lambda u, t: [
            Call(_CREATE, promises_pb2.CreatePromiseRequest(id=f"fz-r{u.hex[:12]}", tags=t), False)
        ],
        st.uuids(),
        tags,
    )


def scenarios(all_methods: list[Method], pools: Pools) -> st.SearchStrategy[list[Call]]:
    """One to three steps, each a typed call (12 in 20), raw bytes (4), a hostile
    schema/value pair (2), an edited page token or a hostile workflow root (1 each)."""
    typed = st.one_of(*(typed_calls(m, pools) for m in all_methods))
    raw = st.one_of(*(raw_calls(m, pools) for m in all_methods))
    rare = [hostile_pairs(), hostile_pairs(), edited_tokens(pools), hostile_roots()]
    step = st.integers(0, 19).flatmap(
        lambda i: typed if i < 12 else raw if i < 16 else rare[i - 16]
    )
    return st.lists(step, min_size=1, max_size=3).map(lambda calls: [c for cs in calls for c in cs])


# --- what is already there when it starts ----------------------------------------------


def seed(server: ServerProcess) -> Pools:
    """A pending, a resolved and a schema'd promise, and a workflow root whose task the
    fuzzer learns the id and counter of (held once, so it has written a step)."""
    with grpc.insecure_channel(server.address) as channel:
        promises = promises_pb2_grpc.PromiseServiceStub(channel)
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        create = promises_pb2.CreatePromiseRequest
        promises.CreatePromise(create(id="fz-pending"), timeout=10)
        promises.CreatePromise(create(id="fz-resolved", idempotency_key="k"), timeout=10)
        promises.ResolvePromise(
            promises_pb2.ResolvePromiseRequest(id="fz-resolved", idempotency_key="k"), timeout=10
        )
        schema = '{"type":"object","required":["ok"]}'
        promises.CreatePromise(create(id="fz-schema", schema=schema), timeout=10)
        root_tags = {"troth:invoke": "fz-group", "troth:func": "fuzzed"}
        promises.CreatePromise(create(id="fz-wf", tags=root_tags), timeout=10)
        stream = tasks.Poll(
            tasks_pb2.PollRequest(group="fz-group", worker_id="fz-worker", capacity=1),
            timeout=10,
        )
        task = next(stream).task
        fence = types_pb2.TaskFence(task_id=task.id, counter=task.counter, worker_id="fz-worker")
        promises.CreatePromise(create(id="fz-wf.0", fence=fence), timeout=10)
        stream.cancel()
        tokens = [
            promises.SearchPromises(
                promises_pb2.SearchPromisesRequest(page_size=1, **query), timeout=10
            ).next_page_token
            for query in _TOKEN_QUERIES
        ]
    counters = (1, 2, task.counter, task.counter + 1)
    return Pools(tasks=(task.id, "fz-no-such-task"), counters=counters, page_tokens=tuple(tokens))


_TOKEN_QUERIES: list[dict[str, Any]] = [
    {},
    {"id": "fz*"},
    {"order": promises_pb2.PROMISE_ORDER_CREATED_DESC},
    {"order": promises_pb2.PROMISE_ORDER_EXPIRE_TIME_ASC},
    {"created_before": Timestamp(seconds=int(time.time()) + 3600)},
]


# --- the tests -----------------------------------------------------------------------


def _check(caller: Caller, call: Call) -> None:
    if currently_in_test_context():
        note(describe(call))
    answer = caller.call(call)
    found = problems(call, answer)
    assert not found, (
        f"\nrequest: {describe(call)}\nanswer: {answer.code.name} {answer.details[:2000]!r} "
        f"(ErrorInfo: {answer.info})\n- " + "\n- ".join(found)
    )


@pytest.mark.timeout(timeout(CI_EXAMPLES, 4))
def test_every_rpc_answers_every_request_with_a_documented_status(
    server: ServerProcess,
) -> None:
    pools = seed(server)
    all_methods = methods()
    caller = Caller(server.address, all_methods)

    @fuzz_settings(CI_EXAMPLES)
    @given(calls=scenarios(all_methods, pools))
    def fuzz(calls: list[Call]) -> None:
        for call in calls:
            _check(caller, call)
        assert server.proc.poll() is None, f"the server died:\n{server.log()[-3000:]}"
        assert caller.healthy(), "the server no longer answers health checks"

    try:
        fuzz()
    except BaseException:
        print(f"server log, warnings and slow calls:\n{server_trouble(server.log())}")
        raise
    finally:
        caller.close()
    found = check_store(server)
    assert not found, "the store is not sound after fuzzing:\n- " + "\n- ".join(found)


def test_a_request_over_the_transport_limit_leaves_the_server_serving(
    server: ServerProcess,
) -> None:
    what, raw = oversized_request()
    caller = Caller(server.address, methods())
    try:
        _check(caller, Call(_CREATE, raw, False, what=what))
        small = promises_pb2.CreatePromiseRequest(id=f"fz-after-{uuid.uuid4().hex[:8]}")
        _check(caller, Call(_CREATE, small, False))
        assert caller.healthy()
    finally:
        caller.close()
