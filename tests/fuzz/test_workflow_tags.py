"""A workflow root's group comes from a tag: it must be a group a worker can poll.

Found by the fuzzer's store check (issue 10, item 5): `CreatePromise` with tag
`troth:invoke` naming a group no `Poll` or `SearchTasks` accepts (a space,
non-ASCII, over 256 characters) was accepted and left an INVOKE task that no
worker can ever receive; over 256 characters it was UNAVAILABLE on PostgreSQL
(the column's limit) and accepted on SQLite. A client's mistake is
INVALID_ARGUMENT naming the field, on both stores (DESIGN §4 rule 14).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _support import error_info

from troth.v1 import promises_pb2

if TYPE_CHECKING:
    from troth.v1 import promises_pb2_grpc

pytestmark = pytest.mark.fuzz


@pytest.mark.parametrize("group", ["two words", "caf\u00e9", "g" * 257, "nul\x00"])
def test_a_root_whose_group_no_worker_can_poll_is_invalid_argument(
    stub: promises_pb2_grpc.PromiseServiceStub, group: str
) -> None:
    request = promises_pb2.CreatePromiseRequest(
        id=f"root-{uuid.uuid4().hex[:8]}", tags={"troth:invoke": group, "troth:func": "f"}
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.CreatePromise(request, timeout=30)
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert error_info(error).metadata["field"].startswith("tags")
