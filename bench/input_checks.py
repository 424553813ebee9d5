"""What the input checks of issue 10 cost per request, in process (no server, no I/O).

Every request is now decoded by `api._decode.deserializer`: protobuf's
`FromString`, then `api._checks.check_request` (list lengths, Timestamp and
Duration ranges; and, only when the bytes hold a 0 byte, the walk of every text
field for NUL). This times, on requests as the SDK sends them: `FromString`
alone, the deserializer as served, and the full walk (what a request whose bytes
hold a 0 byte pays, e.g. a payload with binary data). It prints the median over
`--repeat` rounds of `--number` calls each, in microseconds per request, and
what the deserializer adds to `FromString`.

Usage::

    .venv/bin/python bench/input_checks.py [--number 2000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "sdk"), str(ROOT / "server")]

from google.protobuf.duration_pb2 import Duration  # noqa: E402

from troth.v1 import promises_pb2 as pb  # noqa: E402
from troth.v1 import tasks_pb2  # noqa: E402
from troth.v1 import types_pb2 as types  # noqa: E402
from troth_server.api._checks import check_request  # noqa: E402
from troth_server.api._decode import deserializer  # noqa: E402
from troth_server.config import Limits  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

    from google.protobuf.message import Message

JSON = {"content-type": "application/json"}
STEP_TAGS = {
    "troth:kind": "promise",
    "troth:group": "workers",
    "troth:args": "29a33d9c92a0cec5",
    "team": "editors",
}
FENCE = types.TaskFence(
    task_id="9f8e7d6c5b4a39281706f5e4d3c2b1a0", counter=3, worker_id="host-1-4711"
)

REQUESTS = {
    "CreatePromise (a step: 4 tags, title, message)": pb.CreatePromiseRequest(
        id="publish-post-7.0",
        param=types.Payload(headers=JSON, data=b'{"post": 7, "channel": "blog"}'),
        tags=STEP_TAGS,
        ttl=Duration(seconds=259_200),
        title="Publish post 7?",
        message="The draft is ready for review. " * 4,
        idempotency_key="publish-post-7.0",
        fence=FENCE,
    ),
    "ResolvePromise (a human's decision)": pb.ResolvePromiseRequest(
        id="publish-post-7.0",
        value=types.Payload(headers=JSON, data=b'{"approved": true, "channel": "blog"}'),
        idempotency_key="click-5f1c",
    ),
    "GetPromise": pb.GetPromiseRequest(id="publish-post-7.0"),
    "CompleteTask (suspend_on 100 ids)": tasks_pb2.CompleteTaskRequest(
        task_id=FENCE.task_id,
        counter=3,
        worker_id=FENCE.worker_id,
        suspend_on=[f"fan-out-7.{i}" for i in range(100)],
    ),
    "CreatePromise (32 tags, 64 headers: the maxima)": pb.CreatePromiseRequest(
        id="wide-1",
        param=types.Payload(headers={f"x-h{i}": "v" * 20 for i in range(64)}, data=b"{}"),
        tags={f"tag-{i}": "value-" + "v" * 20 for i in range(32)},
    ),
    "CompleteTask (suspend_on 10,000 ids: the maximum)": tasks_pb2.CompleteTaskRequest(
        task_id=FENCE.task_id,
        counter=3,
        worker_id=FENCE.worker_id,
        suspend_on=[f"fan-out-7.{i}" for i in range(10_000)],
    ),
}


def median_us(stmt: Callable[[], object], number: int, repeat: int) -> float:
    rounds = timeit.repeat(stmt, number=number, repeat=repeat)
    return statistics.median(rounds) / number * 1e6


def row(name: str, message: Message, number: int, repeat: int, limits: Limits) -> str:
    data = message.SerializeToString()
    cls = type(message)
    parse = deserializer(cls, limits)
    decoded = cls.FromString(data)
    assert parse(data) == decoded
    plain = median_us(lambda: cls.FromString(data), number, repeat)
    served = median_us(lambda: parse(data), number, repeat)
    full = median_us(lambda: check_request(decoded, limits), number, repeat)
    return f"{name:<50} {plain:>9.2f} {served:>9.2f} {served - plain:>+9.2f} {full:>10.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--number", type=int, default=2000, help="calls per round")
    parser.add_argument("--repeat", type=int, default=15, help="rounds (the median is printed)")
    args = parser.parse_args()
    limits = Limits()
    print("microseconds per request (median of rounds)")
    print(f"{'request':<50} {'FromString':>9} {'served':>9} {'added':>9} {'text walk':>10}")
    for name, message in REQUESTS.items():
        big = message.ByteSize() > 50_000
        number = max(1, args.number // 50) if big else args.number
        print(row(name, message, number, args.repeat, limits))


if __name__ == "__main__":
    main()
