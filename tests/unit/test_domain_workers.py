"""The connected-worker summaries of `SearchWorkers` and their page tokens (pure)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from troth_server import paging
from troth_server.domain.errors import InvalidPageToken
from troth_server.domain.workers import After, StreamView, for_tenant, page, summarize


def stream(
    worker: str,
    group: str = "g",
    *,
    principal: str | None = None,
    workflows: tuple[tuple[str, str], ...] = (),
    capacity: int = 1,
    held: tuple[str, ...] = (),
    connected: int = 100,
    seen: int = 100,
    stalled: bool = False,
) -> StreamView:
    return StreamView(worker, group, principal, workflows, capacity, held, connected, seen,
                      stalled)  # fmt: skip


def test_a_workers_streams_are_one_worker() -> None:
    (worker,) = summarize(
        [
            stream(
                "w1", workflows=(("a", "v1"),), capacity=2, held=("t2",), connected=50, seen=300
            ),
            stream(
                "w1", workflows=(("a", "v1"), ("b", "v2")), held=("t1",), seen=200, stalled=True
            ),
        ]
    )
    assert worker.worker_id == "w1" and worker.group == "g" and worker.streams == 2
    assert worker.workflows == (("a", "v1"), ("b", "v2"))
    assert worker.capacity == 3 and worker.task_ids == ("t1", "t2")
    assert (worker.connect_ms, worker.last_seen_ms, worker.stalled) == (50, 300, True)


def test_workers_are_by_group_worker_and_principal_and_filtered_by_group() -> None:
    streams = [stream("w2", "b"), stream("w1", "b"), stream("w1", "a"),
               stream("w1", "b", principal="p")]  # fmt: skip
    keys = [(w.group, w.worker_id, w.principal) for w in summarize(streams)]
    assert keys == [("a", "w1", None), ("b", "w1", None), ("b", "w1", "p"), ("b", "w2", None)]
    assert [w.group for w in summarize(streams, "a")] == ["a"]
    assert summarize(streams, "c") == []


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("xyz")), max_size=12),
       st.integers(1, 5))  # fmt: skip
def test_pages_show_every_worker_once_in_order(pairs: list[tuple[str, str]], size: int) -> None:
    workers = summarize(stream(w, g) for g, w in pairs)
    seen: list[After] = []
    after = None
    while True:
        shown, after = page(workers, size, after)
        assert len(shown) <= size
        seen += [w.key for w in shown]
        if after is None:
            break
        # Through the token, as a client pages.
        after = paging.decode_workers(paging.encode_workers(after, ""), "")
    assert seen == [w.key for w in workers]


def test_a_token_is_bound_to_its_group_filter() -> None:
    token = paging.encode_workers(After("g", "w1", "p"), "g")
    assert paging.decode_workers(token, "g") == After("g", "w1", "p")
    with pytest.raises(InvalidPageToken, match="different search"):
        paging.decode_workers(token, "other")


def _token(fields: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        _token({"group": "g", "worker": "w", "principal": ""}),  # no fingerprint
        _token({"group": "g", "worker": 1, "principal": "", "query": "0" * 16}),
        _token({"group": "g", "worker": "w", "principal": "", "query": "not hex"}),
        _token({"after": 3, "query": paging.fingerprint("*", frozenset(), {})}),  # a promise one
        "not a token!",
        "A" * 513,
    ],
)
def test_forged_tokens_are_refused(token: str) -> None:
    with pytest.raises(InvalidPageToken):
        paging.decode_workers(token, "")


def test_a_tenant_sees_workers_without_principals_or_tasks() -> None:
    streams = [
        stream("w1", "b", principal="p", held=("t1",), capacity=2),
        stream("w1", "b", principal="q", held=("t2",), seen=300),
        stream("w2", "b", principal="p", stalled=True),
    ]
    assert len(summarize(streams)) == 3
    seen = summarize(for_tenant(streams))
    assert [(w.group, w.worker_id, w.principal, w.task_ids) for w in seen] == [
        ("b", "w1", None, ()),
        ("b", "w2", None, ()),
    ]
    assert (seen[0].capacity, seen[0].streams, seen[0].last_seen_ms) == (3, 2, 300)
    assert seen[1].stalled
    _, more = page(seen, 1)
    assert more == After("b", "w1", "")  # the page token names no principal
