"""The RPC x role table (and the README's copy of it, as `python -m
troth_server.domain.access` prints it) and the principal's scope checks (pure)."""

from __future__ import annotations

import re
from pathlib import Path

from troth.v1 import promises_pb2, tasks_pb2
from troth_server.domain.access import (
    ANY_GROUP,
    LOCAL_DEVELOPER,
    RPC_ROLES,
    Principal,
    Role,
    may_call,
    roles_table,
)

ROLE_TABLE_PAGE = Path(__file__).parents[2] / "docs" / "authentication.md"

ALL_RPCS = [
    method.name
    for module, service in ((promises_pb2, "PromiseService"), (tasks_pb2, "TaskService"))
    for method in module.DESCRIPTOR.services_by_name[service].methods
]


def test_the_table_names_every_rpc_of_both_services() -> None:
    assert set(RPC_ROLES) == set(ALL_RPCS)


def test_admin_may_call_everything_and_each_role_only_its_rows() -> None:
    admin = Principal("root", frozenset({Role.ADMIN}))
    assert all(may_call(admin, rpc) for rpc in RPC_ROLES)
    gateway = Principal("gw", frozenset({Role.GATEWAY}))
    assert may_call(gateway, "ResolvePromise")
    assert not may_call(gateway, "Poll")
    assert not may_call(gateway, "CancelPromise")
    operator = Principal("ops", frozenset({Role.OPERATOR}))
    assert may_call(operator, "CancelPromise") and may_call(operator, "SearchTasks")
    assert not may_call(operator, "ResolvePromise")
    worker = Principal("w", frozenset({Role.WORKER}), groups=frozenset({"billing"}))
    assert may_call(worker, "CompleteTask") and not may_call(worker, "SearchTasks")
    assert not may_call(worker, "NoSuchRpc")


def test_worker_groups_and_id_prefixes() -> None:
    worker = Principal("w", frozenset({Role.WORKER}), groups=frozenset({"billing"}))
    assert worker.may_work_for("billing") and not worker.may_work_for("payroll")
    anywhere = Principal("w", frozenset({Role.WORKER}), groups=frozenset({ANY_GROUP}))
    assert anywhere.may_work_for("payroll")
    gateway = Principal("gw", frozenset({Role.GATEWAY}), groups=frozenset({ANY_GROUP}))
    assert not gateway.may_work_for("payroll")  # a grant of groups is not the worker role
    tenant = Principal("acme", frozenset({Role.GATEWAY}), prefixes=("acme-", "acme/"))
    assert tenant.may_touch("acme-invoice-1") and tenant.may_touch("acme/x")
    assert not tenant.may_touch("globex-invoice-1") and not tenant.may_touch("acm")
    assert LOCAL_DEVELOPER.may_touch("anything") and LOCAL_DEVELOPER.may_work_for("any")


def test_the_docs_show_the_roles_table_as_the_code_has_it() -> None:
    text = ROLE_TABLE_PAGE.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- roles-table: start.*?-->\n(.*?)<!-- roles-table: end -->", text, re.DOTALL
    )
    assert found, "docs/authentication.md lacks the roles-table markers"
    assert found.group(1) == roles_table() + "\n", (
        "docs/authentication.md's RPC x role table is out of date; replace it with the output of "
        "`python -m troth_server.domain.access`"
    )
