"""`api/_batches.batched`: the messages ready together go as one, each message under the
size cap, in order, and an end among them stops the taking."""

from __future__ import annotations

from troth.v1 import tasks_pb2
from troth_server.api._batches import batched


def _answer(n: int, size: int = 0) -> tasks_pb2.CallsResponse:
    return tasks_pb2.CallsResponse(id=n, response=b"x" * size)


def _ids(messages: list[tasks_pb2.CallsResponse]) -> list[list[int]]:
    return [[m.id, *(more.id for more in m.more)] for m in messages]


def test_what_is_ready_goes_in_the_first_message_in_order() -> None:
    messages, ended = batched(_answer(1), [_answer(n) for n in range(2, 6)], 1 << 20)
    assert _ids(messages) == [[1, 2, 3, 4, 5]] and not ended


def test_a_message_that_would_pass_the_cap_starts_the_next_one() -> None:
    size = _answer(0, 400).ByteSize()
    ready = [_answer(n, 400) for n in range(2, 7)]
    messages, _ = batched(_answer(1, 400), ready, 2 * size + 10)
    assert _ids(messages) == [[1, 2], [3, 4], [5, 6]]
    assert all(m.ByteSize() <= 2 * size + 10 + 16 for m in messages)


def test_one_larger_than_the_cap_goes_alone() -> None:
    messages, _ = batched(_answer(1), [_answer(2, 5000), _answer(3)], 1000)
    assert _ids(messages) == [[1], [2], [3]]


def test_the_end_stops_the_taking_and_is_reported() -> None:
    taken: list[int] = []

    def ready():  # type: ignore[no-untyped-def]
        for item in (_answer(2), None, _answer(3)):
            taken.append(0 if item is None else item.id)
            yield item

    messages, ended = batched(_answer(1), ready(), 1 << 20)
    assert _ids(messages) == [[1, 2]] and ended
    assert taken == [2, 0]  # nothing after the end was taken
