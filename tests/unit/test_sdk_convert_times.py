"""The SDK reads a wire Timestamp as protobuf's own `ToDatetime` does, over its whole range."""

from __future__ import annotations

from datetime import UTC

from google.protobuf import timestamp_pb2
from hypothesis import given
from hypothesis import strategies as st

from troth._convert import datetime_from_proto

# Timestamp's valid range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z.
SECONDS = st.integers(-62_135_596_800, 253_402_300_799)
NANOS = st.integers(0, 999_999_999)


@given(seconds=SECONDS, nanos=NANOS)
def test_reads_a_timestamp_as_to_datetime_does(seconds: int, nanos: int) -> None:
    stamp = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
    read = datetime_from_proto(stamp)
    assert read == stamp.ToDatetime(tzinfo=UTC)
    assert read.tzinfo is UTC


def test_the_edges_and_the_unset_stamp() -> None:
    for seconds, nanos in ((0, 0), (-1, 999_999_999), (253_402_300_799, 999_999_999)):
        stamp = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
        assert datetime_from_proto(stamp) == stamp.ToDatetime(tzinfo=UTC)
    assert datetime_from_proto(timestamp_pb2.Timestamp()).isoformat() == "1970-01-01T00:00:00+00:00"
