"""Routing of tasks to Poll streams by workflow version (domain/routing.py), pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from troth_server.domain import routing
from troth_server.domain import task as tasks
from troth_server.domain.routing import ANY, Candidate, Deployments, Registration, Route
from troth_server.domain.task import Task, TaskKind

NAMES = ["publish", "billing"]
VERSIONS = ["v1", "v2", "v3"]


def task(
    workflow: str | None = "publish",
    version: str | None = None,
    *,
    kind: TaskKind = TaskKind.RESUME,
    preferred: str | None = None,
) -> Task:
    return tasks.create(
        "t1", "root", "g", kind, preferred=preferred, workflow=workflow, workflow_version=version
    )


def registered(*pairs: tuple[str, str]) -> Registration:
    return routing.registration(pairs)


def routes_of(*streams: Registration, deployments: Deployments | None = None) -> list[Route]:
    deployments = deployments or Deployments()
    for stream in streams:
        deployments.register("g", stream)
    return routing.routes("g", list(streams), deployments)


def test_the_first_version_listed_for_a_name_is_the_current_one() -> None:
    stream = registered(("publish", "v2"), ("publish", "v1"), ("billing", "b1"))
    assert dict(stream.current) == {"publish": "v2", "billing": "b1"}
    assert stream.accepted == {("publish", "v2"), ("publish", "v1"), ("billing", "b1")}
    assert not stream.any_task and registered().any_task


def test_a_stream_listing_nothing_takes_every_task() -> None:
    (route,) = routes_of(registered())
    assert route is ANY
    for version in (None, "v1", "v9"):
        for workflow in ("publish", None):
            assert route.accepts(workflow, version)
    assert route.version_for("publish") is None  # it records nothing


def test_a_versioned_task_goes_only_to_a_stream_listing_that_version() -> None:
    old, new, compat = routes_of(
        registered(("publish", "v1")),
        registered(("publish", "v2")),
        registered(("publish", "v3"), ("publish", "v1")),
    )
    assert old.accepts("publish", "v1") and not old.accepts("publish", "v2")
    assert new.accepts("publish", "v2") and not new.accepts("publish", "v1")
    assert compat.accepts("publish", "v1") and compat.accepts("publish", "v3")
    assert not compat.accepts("publish", "v2")
    assert not old.accepts("billing", "v1")  # same version, other workflow


def test_unversioned_tasks_go_to_the_newest_version_connected() -> None:
    deployments = Deployments()
    old, new = routes_of(
        registered(("publish", "v1")), registered(("publish", "v2")), deployments=deployments
    )
    assert new.accepts("publish", None) and not old.accepts("publish", None)
    assert new.version_for("publish") == "v2" and old.version_for("publish") == "v1"
    # Alone again, the old version takes new starts.
    (alone,) = routing.routes("g", [registered(("publish", "v1"))], deployments)
    assert alone.accepts("publish", None)


def test_newest_is_the_latest_first_registration_not_the_latest_connection() -> None:
    deployments = Deployments()
    v1, v2 = registered(("publish", "v1")), registered(("publish", "v2"))
    deployments.register("g", v1)
    deployments.register("g", v2)
    deployments.register("g", v1)  # an old worker reconnects: still the older version
    old, new = routing.routes("g", [v1, v2], deployments)
    assert new.accepts("publish", None) and not old.accepts("publish", None)


def test_a_version_declaring_another_compatible_is_the_newer_whatever_the_order() -> None:
    deployments = Deployments()
    v2 = registered(("publish", "v2"), ("publish", "v1"))
    v1 = registered(("publish", "v1"))
    deployments.register("g", v2)  # a server restarted: the new worker came back first
    deployments.register("g", v1)
    newer, older = routing.routes("g", [v2, v1], deployments)
    assert newer.accepts("publish", None) and not older.accepts("publish", None)


def test_a_workflow_no_stream_lists_goes_to_any_stream() -> None:
    (route,) = routes_of(registered(("publish", "v1")))
    assert route.accepts("typo", None)  # its worker rejects it as not registered
    assert route.accepts(None, None)
    assert route.version_for("typo") is None
    assert not route.accepts("typo", "v1")  # a recorded version is never run elsewhere


def test_routes_are_per_group() -> None:
    deployments = Deployments()
    v1, v2 = registered(("publish", "v1")), registered(("publish", "v2"))
    deployments.register("a", v1)
    deployments.register("b", v2)
    (a_route,) = routing.routes("a", [v1], deployments)
    assert a_route.accepts("publish", None)


def test_equal_registrations_have_equal_hashable_routes() -> None:
    one, two = routes_of(registered(("publish", "v1")), registered(("publish", "v1")))
    assert one == two and len({one, two}) == 1


def test_choose_stream_prefers_the_preferred_worker_then_room() -> None:
    old, new = routes_of(registered(("publish", "v1")), registered(("publish", "v2")))
    streams = [
        Candidate("w-old", old, 1),
        Candidate("w-new-a", new, 1),
        Candidate("w-new-b", new, 5),
        Candidate("w-new-c", new, 0),
    ]
    assert routing.choose_stream(task(version="v1"), streams) == streams[0]
    assert routing.choose_stream(task(version="v2"), streams) == streams[2]
    assert routing.choose_stream(task(version="v2", preferred="w-new-a"), streams) == streams[1]
    assert routing.choose_stream(task(version=None, kind=TaskKind.INVOKE), streams) == streams[2]
    assert routing.choose_stream(task(version="v3"), streams) is None
    full = [Candidate("w-old", old, 0)]
    assert routing.choose_stream(task(version="v1"), full) is None


def test_waiting_for_names_the_version_and_what_is_connected() -> None:
    old, new = routes_of(registered(("publish", "v1")), registered(("publish", "v2")))
    only_new = [Candidate("w-new", new, 3)]
    assert routing.waiting_for(task(version="v1"), "g", only_new) == (
        "waiting for a worker of group 'g' running workflow 'publish' version 'v1' "
        "(connected here: 'publish' versions 'v2')"
    )
    busy = [Candidate("w-old", old, 0), Candidate("w-new", new, 3)]
    assert routing.waiting_for(task(version="v1"), "g", busy).startswith(
        "waiting for a free worker of group 'g' (1 connected here can run it"
    )
    assert routing.waiting_for(task(version="v2"), "g", busy) == (
        "being delivered to a worker of group 'g'"
    )
    assert routing.waiting_for(task(version="v1"), "g", []) == (
        "waiting for a worker of group 'g' running workflow 'publish' version 'v1' "
        "(connected here: no worker of group 'g')"
    )
    assert routing.waiting_for(task(version=None, kind=TaskKind.INVOKE), "g", []) == (
        "waiting for a worker of group 'g': none is connected to this server"
    )
    (billing,) = routes_of(registered(("billing", "b1")))
    assert routing.waiting_for(task(version="v1"), "g", [Candidate("w", billing, 1)]).endswith(
        "(connected here: no worker running 'publish')"
    )


def test_a_task_waiting_for_its_version_says_since_when_none_was_connected() -> None:
    old, new = routes_of(registered(("publish", "v1")), registered(("publish", "v2")))
    only_new = [Candidate("w-new", new, 3)]
    waiting = task(version="v1")
    assert routing.version_absent(waiting, only_new)
    assert routing.version_absent(waiting, [])
    assert not routing.version_absent(waiting, [Candidate("w-old", old, 0)])  # busy, not absent
    assert not routing.version_absent(task(version=None, kind=TaskKind.INVOKE), only_new)
    left = routing.Absence(1_780_000_000_000, left=True)  # 2026-05-28T20:26:40Z
    assert routing.waiting_for(waiting, "g", only_new, left) == (
        "waiting for a worker of group 'g' running workflow 'publish' version 'v1' "
        "(none connected since 2026-05-28T20:26:40Z; connected here: 'publish' versions 'v2')"
    )
    started = routing.Absence(1_780_000_000_000, left=False)
    assert "(none connected since this server started at 2026-05-28T20:26:40Z; " in (
        routing.waiting_for(waiting, "g", only_new, started)
    )


pairs = st.tuples(st.sampled_from(NAMES), st.sampled_from(VERSIONS))
streams_st = st.lists(st.lists(pairs, max_size=4), min_size=1, max_size=4)
tasks_st = st.tuples(st.sampled_from([*NAMES, "other", None]), st.sampled_from([*VERSIONS, None]))


@given(streams=streams_st, wanted=tasks_st)
def test_routing_rules_hold_for_any_fleet(
    streams: list[list[tuple[str, str]]], wanted: tuple[str | None, str | None]
) -> None:
    workflow, version = wanted
    registrations = [routing.registration(s) for s in streams]
    routes = routes_of(*registrations)
    takers = [r for r, route in zip(registrations, routes, strict=True) if route.accepts(*wanted)]
    for reg, route in zip(registrations, routes, strict=True):
        if reg.any_task:
            assert route.accepts(*wanted)  # rule 1
        elif version is not None:
            # Rule 2: a recorded version runs only where it is listed.
            assert route.accepts(*wanted) == ((workflow, version) in reg.accepted)
    if version is None and workflow in {n for r in registrations for n in r.current}:
        # Rule 3: exactly one current version of the workflow takes new starts.
        current = {r.current[workflow] for r in takers if not r.any_task}
        assert len(current) == 1
    if version is None:
        assert takers  # an unversioned task always has somewhere to go (rule 4)
