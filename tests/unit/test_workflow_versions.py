"""Workflow versions in the SDK: derivation from the code, registration, what Poll sends.

No server needed (connecting is lazy).
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from troth import Client, Context, RegistrationError, Worker
from troth._runner import foreign_version
from troth._versions import VERSION_LENGTH, code_version, registration
from troth.v1 import tasks_pb2


@pytest.fixture
def client() -> Iterator[Client]:
    with Client("127.0.0.1:1") as c:  # never contacted
        yield c


def publish(ctx: Context, post: str) -> Generator[Any, Any, str]:
    yield ctx.now()
    return post


def publish_edited(ctx: Context, post: str) -> Generator[Any, Any, str]:
    yield ctx.now()
    return post.upper()


def compiled(source: str, name: str) -> Any:
    """A function with no source file (as from exec, or a zipped module without source)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, "<generated>", "exec"), namespace)
    return namespace[name]


def test_a_derived_version_is_a_short_stable_digest_of_the_source() -> None:
    version = code_version(publish)
    assert len(version) == VERSION_LENGTH and int(version, 16) >= 0
    assert code_version(publish) == version
    assert code_version(publish_edited) != version


def test_the_same_source_nested_at_another_depth_is_the_same_version() -> None:
    def make() -> Any:
        def publish(ctx: Context, post: str) -> Generator[Any, Any, str]:
            yield ctx.now()
            return post

        return publish

    assert code_version(make()) == code_version(publish)


def test_without_source_the_version_comes_from_the_bytecode() -> None:
    first = compiled("def wf(ctx):\n    yield ctx.now()\n    return 1\n", "wf")
    same = compiled("def wf(ctx):\n    yield ctx.now()\n    return 1\n", "wf")
    changed = compiled("def wf(ctx):\n    yield ctx.now()\n    return 2\n", "wf")
    assert code_version(first) == code_version(same)
    assert code_version(first) != code_version(changed)


def test_a_partial_is_versioned_by_its_function_and_arguments() -> None:
    one = functools.partial(publish, post="a")
    assert code_version(one) == code_version(functools.partial(publish, post="a"))
    assert code_version(one) != code_version(functools.partial(publish, post="b"))
    assert code_version(one) != code_version(functools.partial(publish_edited, post="a"))


def test_registration_defaults_the_version_and_drops_its_own_from_compatible() -> None:
    registered = registration("publish", publish, None, ["old", code_version(publish), "old"])
    assert registered.version == code_version(publish)
    assert registered.compatible == ("old",)
    assert registered.runs(code_version(publish)) and registered.runs("old")
    assert not registered.runs("other")
    assert list(registered.listed()) == [("publish", registered.version), ("publish", "old")]


@pytest.mark.parametrize("bad", ["", " 2", "2 ", "x" * 129, "a\nb"])
def test_a_version_the_server_would_refuse_is_refused_at_registration(
    client: Client, bad: str
) -> None:
    worker = Worker(client)
    with pytest.raises(RegistrationError, match="a version is 1 to 128 printable characters"):
        worker.workflow(name="publish", version=bad)(publish)
    with pytest.raises(RegistrationError, match="compatible version"):
        worker.workflow(name="publish", version="2", compatible=(bad,))(publish)
    assert worker.workflows == {}


def test_compatible_must_be_a_collection_not_one_string(client: Client) -> None:
    worker = Worker(client)
    with pytest.raises(RegistrationError, match=r"compatible=\('1',\)"):
        worker.workflow(version="2", compatible="1")(publish)


def test_registrations_show_each_version(client: Client) -> None:
    worker = Worker(client)
    worker.workflow(publish)
    worker.workflow(name="edited", version="2", compatible=("1",))(publish_edited)
    found = worker.registrations
    assert found["publish"].version == code_version(publish)
    assert found["publish"].fn is publish and found["publish"].compatible == ()
    assert (found["edited"].version, found["edited"].compatible) == ("2", ("1",))
    assert worker.workflows == {"publish": publish, "edited": publish_edited}


def test_poll_lists_each_workflow_its_own_version_first(client: Client) -> None:
    worker = Worker(client, group="g")
    worker.workflow(publish)
    worker.workflow(name="edited", version="3", compatible=("1", "2"))(publish_edited)
    request = worker._poll_request()
    assert [(w.name, w.version) for w in request.workflows] == [
        ("publish", code_version(publish)),
        ("edited", "3"),
        ("edited", "1"),
        ("edited", "2"),
    ]
    assert Worker(client)._poll_request().workflows == []  # takes any task, as before


def _delivery(version: str, name: str = "publish") -> tasks_pb2.PollResponse:
    response = tasks_pb2.PollResponse()
    response.task.workflow_version = version
    response.root.id = "wf-1"
    response.root.tags["troth:func"] = name
    return response


def test_a_task_recorded_with_another_version_is_foreign(client: Client) -> None:
    worker = Worker(client)
    worker.workflow(version="2", compatible=("1",))(publish)
    assert foreign_version(worker.registrations, _delivery("2")) is None
    assert foreign_version(worker.registrations, _delivery("1")) is None
    assert foreign_version(worker.registrations, _delivery("")) is None  # not taken yet: runs it
    registered = worker.registrations
    assert foreign_version(registered, _delivery("0", name="unknown")) is None  # rejected later
    why = foreign_version(worker.registrations, _delivery("0"))
    assert why == (
        "workflow 'wf-1' ('publish') was started with version '0'; "
        "this worker runs publish version 2 (compatible with 1)"
    )
