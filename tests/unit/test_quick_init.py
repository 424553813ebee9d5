"""`quick_init`: a frozen record built by its quick `__init__` is the record the
dataclass's own `__init__` builds, for every class that uses it; misuse is refused
at decoration."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import sys
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from troth._records import quick_init

QUICK_MODULES = (
    "troth._promise",
    "troth._engine",
    "troth_server.domain.promise",
    "troth_server.domain.task",
    "troth_server.domain.steps",
    "troth_server.writes.batch",
    "troth_server.writes.ops.create",
    "troth_server.writes.ops.settle",
    "troth_server.writes.ops.complete",
    "troth_server.writes.ops.carried",
)


def _quick_classes() -> list[type]:
    found = []
    for name in QUICK_MODULES:
        __import__(name)
        for value in vars(sys.modules[name]).values():
            if (
                isinstance(value, type)
                and value.__module__ == name
                and dataclasses.is_dataclass(value)
                and value.__init__.__code__.co_filename.startswith("<quick_init ")
            ):
                found.append(value)
    return found


QUICK = _quick_classes()


def _reference(cls: type) -> type:
    """The same fields, built by `dataclass(frozen=True, slots=True)` alone."""
    namespace: dict[str, Any] = {"__annotations__": {}}
    for f in dataclasses.fields(cls):
        namespace["__annotations__"][f.name] = Any
        if f.default is not dataclasses.MISSING:
            namespace[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f.name] = field(default_factory=f.default_factory)
    return dataclass(frozen=True, slots=True)(type(cls.__name__, (), namespace))


def test_the_hot_records_use_it() -> None:
    names = {c.__name__ for c in QUICK}
    assert {"Promise", "Payload", "Task", "CreateOp", "SettleOp", "StateChange"} <= names
    assert {"CreateResult", "SettleResult", "CreateStep", "Suspend", "Done"} <= names


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_same_signature_as_the_dataclass(cls: type) -> None:
    ours = inspect.signature(cls)
    theirs = inspect.signature(_reference(cls))
    assert list(ours.parameters) == list(theirs.parameters)
    for name, param in ours.parameters.items():
        other = theirs.parameters[name]
        assert param.kind is other.kind
        if other.default is inspect.Parameter.empty:
            assert param.default is inspect.Parameter.empty
        elif repr(other.default) == "<factory>":
            assert repr(param.default) == "<factory>"
        else:
            assert param.default is other.default


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
@settings(max_examples=40)
@given(data=st.data())
def test_builds_what_the_dataclass_builds(cls: type, data: st.DataObject) -> None:
    reference = _reference(cls)
    fields = dataclasses.fields(cls)
    values: dict[str, Any] = {}
    for f in fields:
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required or data.draw(st.booleans()):
            values[f.name] = data.draw(st.integers() | st.text(max_size=3) | st.none())
    positional = data.draw(st.integers(0, len(values)))
    names = [f.name for f in fields if f.name in values]
    # Positional only up to the first omitted field, as a call may pass them.
    leading = [f.name for f in fields][: len(names)]
    positional = positional if names[:positional] == leading[:positional] else 0
    args = [values[n] for n in names[:positional]]
    kwargs = {n: values[n] for n in names[positional:]}
    ours, theirs = cls(*args, **kwargs), reference(*args, **kwargs)
    for f in fields:
        if f.name not in values and f.default_factory is not dataclasses.MISSING:
            # A factory's value, drawn for each record (an instance number, say).
            assert type(getattr(ours, f.name)) is type(getattr(theirs, f.name)), f.name
        else:
            assert getattr(ours, f.name) == getattr(theirs, f.name), f.name
    assert dataclasses.replace(ours) == ours
    assert pickle.loads(pickle.dumps(ours)) == ours


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_still_frozen_and_refuses_what_the_dataclass_refuses(cls: type) -> None:
    fields = dataclasses.fields(cls)
    required = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    record = cls(**dict.fromkeys(required))
    with pytest.raises(FrozenInstanceError):
        setattr(record, fields[0].name, 1)
    with pytest.raises(TypeError):
        cls(**dict.fromkeys(required), not_a_field=1)
    if required:
        with pytest.raises(TypeError):
            cls()


def test_each_record_gets_its_own_factory_default() -> None:
    @quick_init
    @dataclass(frozen=True, slots=True)
    class Holder:
        name: str
        items: list[int] = field(default_factory=list)
        size: int = 3

    one, two = Holder("a"), Holder("b", size=4)
    assert one.items == [] and one.items is not two.items
    assert (one.name, one.size, two.size) == ("a", 3, 4)
    assert Holder("c", [1]).items == [1]
    assert Holder("a") == one


def test_hashes_as_the_dataclass_does() -> None:
    @quick_init
    @dataclass(frozen=True, slots=True)
    class Key:
        name: str
        n: int = 0

    assert hash(Key("x", 1)) == hash(Key("x", n=1)) == hash(("x", 1))
    assert {Key("x"), Key("x", 0)} == {Key("x")}


@pytest.mark.parametrize(
    "declare",
    [
        lambda: dataclass(slots=True)(type("Open", (), {"__annotations__": {"x": int}})),
        lambda: dataclass(frozen=True)(type("NoSlots", (), {"__annotations__": {"x": int}})),
        lambda: dataclass(frozen=True, slots=True)(
            type("Post", (), {"__annotations__": {"x": int}, "__post_init__": lambda self: None})
        ),
        lambda: dataclass(frozen=True, slots=True)(
            type("Hidden", (), {"__annotations__": {"x": int}, "x": field(init=False, default=1)})
        ),
        lambda: dataclass(frozen=True, slots=True, kw_only=True)(
            type("Keywords", (), {"__annotations__": {"x": int}})
        ),
        lambda: type("Plain", (), {}),
    ],
    ids=["not frozen", "no slots", "post_init", "init=False", "kw_only", "not a dataclass"],
)
def test_refuses_what_it_cannot_build(declare: Any) -> None:
    with pytest.raises(TypeError, match="quick_init"):
        quick_init(declare())
