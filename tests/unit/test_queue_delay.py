"""How long calls wait before the server starts them (CoDel's standing-queue test), and
the `troth-timeout-ms` metadata it is measured from: pure, on an injected clock."""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from troth.errors import Reason
from troth_server.api._admission import Admission, QueueDelay, waited_s
from troth_server.api._status import status_for
from troth_server.domain.errors import InvalidArgument


def test_a_standing_queue_is_one_where_every_call_of_an_interval_waited_too_long() -> None:
    queue = QueueDelay(limit_s=1.0, interval_s=0.1)
    t = 100.0
    for i in range(10):  # one window: every call waited 2 s or more
        queue.sample(2.0 + i / 10, t + i / 100)
    assert not queue.over(t + 0.099)  # the window has not ended: nothing decided yet
    assert queue.over(t + 0.1) and queue.standing(t + 0.1) == 2.0
    # One call of the next window started at once: that window is no standing queue.
    for i in range(5):
        queue.sample(5.0, t + 0.11 + i / 100)
    queue.sample(0.0, t + 0.17)
    assert queue.over(t + 0.19)  # still judged by the window before
    assert not queue.over(t + 0.2) and queue.standing(t + 0.2) == 0.0


def test_an_idle_interval_means_nothing_is_waiting() -> None:
    queue = QueueDelay(limit_s=1.0, interval_s=0.1)
    for i in range(4):
        queue.sample(3.0, 10.0 + i / 100)
    assert queue.over(10.1)
    # A whole window went by with no call started: the backlog is gone.
    assert not queue.over(10.35)
    for i in range(3):  # a few slow calls are no standing queue: one slow client is not
        queue.sample(3.0, 10.4 + i / 100)
    assert not queue.over(10.46)


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 0.05)), min_size=1, max_size=80))
def test_the_standing_delay_is_never_more_than_a_wait_seen(
    samples: list[tuple[float, float]],
) -> None:
    queue = QueueDelay(limit_s=1.0)
    now = 0.0
    for waited, step in samples:
        now += step
        queue.sample(waited, now)
        assert queue.standing_s == 0.0 or queue.standing_s in {w for w, _ in samples}
    assert queue.standing(now + 1.0) == 0.0


def test_a_calls_wait_is_its_timeout_less_what_remains() -> None:
    assert waited_s(None, 5.0) is None
    assert waited_s("7000", None) is None  # no deadline reached the server
    assert waited_s("7000", 4.5) == pytest.approx(2.5)
    assert waited_s("7000", 7.01) == 0.0  # rounding never makes a negative wait
    for bad in ("", "7s", "-5", "0", "1e3", "٣", "9" * 14):
        with pytest.raises(InvalidArgument) as info:
            waited_s(bad, 5.0)
        assert info.value.field == "troth-timeout-ms"


def test_the_refusal_names_the_flag_and_asks_for_the_standing_delay() -> None:
    admission = Admission.with_limits(8, 4, max_queue_delay_ms=500)
    assert admission.queue_refusal(0.0) is None
    for i in range(5):
        admission.queue.sample(2.5, 1.0 + i / 100)
    refusal = admission.queue_refusal(1.1)
    assert refusal is not None
    status = status_for(refusal)
    assert status.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refusal.reason is Reason.OVERLOADED and refusal.retry_after_ms == 2500
    assert "--max-queue-delay=500ms" in status.details
    assert "waited 2.5 s" in status.details
    assert admission.queue_refusal(1.3) is None  # an idle window after: admitted again
    assert math.isclose(admission.queue.limit_s, 0.5)
