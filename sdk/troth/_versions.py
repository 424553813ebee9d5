"""Workflow code versions: what a worker registers, and which parked workflows it may run.

A workflow suspended for days must resume on the code that started it: replay
re-runs the generator from the top against the recorded steps, and code that
changed in between would take different branches on the same history. So each
registered workflow has a version (by default a digest of its source), the
server records on a workflow's root the version of the worker that first took
it, and only workers running that version (or declaring it compatible) get the
workflow's later tasks. A worker also checks each task it receives, in case a
server routes without versions.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import textwrap
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import CodeType
from typing import Any

from troth.errors import RegistrationError

VERSION_LENGTH = 12
"""Hex digits of a derived version: enough that two edits never collide in practice."""
MAX_VERSION_LENGTH = 128
"""The longest version the server accepts."""


@dataclass(frozen=True, slots=True)
class WorkflowRegistration:
    """A workflow as a worker registered it.

    Attributes:
        name: What `client.start` and `ctx.start` name.
        fn: The generator function.
        version: The version of its code: given, or derived from its source.
        compatible: Older versions this code may resume, as declared by its author.
        fail_on: Exception types that fail the workflow (reject its root) when they
            leave its code; any other unexpected exception fails only the task,
            which is retried (`troth.WorkflowFailed`).

    .. versionadded:: 0.2.0
    """

    name: str
    fn: Callable[..., Any]
    version: str
    compatible: tuple[str, ...] = ()
    fail_on: tuple[type[BaseException], ...] = ()

    def runs(self, version: str) -> bool:
        """Whether this code may run a workflow recorded with `version`."""
        return version == self.version or version in self.compatible

    def listed(self) -> Iterator[tuple[str, str]]:
        """(name, version) pairs for the Poll request: its own version first, the one
        the server records on the workflows this worker starts."""
        yield self.name, self.version
        for older in self.compatible:
            yield self.name, older


def code_version(fn: Callable[..., Any]) -> str:
    """A short digest of the function's code: its source text, or where that is not
    available (no source file), its bytecode and constants.

    Any edit of the function's source gives a new version, comments included: a
    version means "exactly this code", and a workflow whose edit is harmless
    says so with `compatible=`.
    """
    digest = hashlib.sha256()
    for part in _parts(fn):
        digest.update(part)
    return digest.hexdigest()[:VERSION_LENGTH]


def _parts(fn: Any) -> Iterator[bytes]:
    if isinstance(fn, functools.partial):
        yield repr((fn.args, sorted(fn.keywords.items()))).encode()
        yield from _parts(fn.func)
        return
    target = fn if inspect.isroutine(fn) or inspect.isclass(fn) else type(fn)
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):
        code = getattr(inspect.unwrap(fn), "__code__", None)
        if isinstance(code, CodeType):
            yield from _code_parts(code)
        else:
            # Nothing to read the code from: the name at least changes with a rename.
            module = getattr(target, "__module__", "")
            yield f"{module}.{getattr(target, '__qualname__', '')}".encode()
        return
    # Dedented, so that the same function nested at another depth is the same code.
    yield b"source:" + textwrap.dedent(source).encode()


def _code_parts(code: CodeType) -> Iterable[bytes]:
    yield b"code:" + code.co_code
    yield repr(code.co_names).encode()
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _code_parts(const)
        else:
            yield repr(const).encode()


def check_version(name: str, version: str, what: str = "version") -> str:
    """The version if the server will accept it; else a RegistrationError saying why."""
    if (
        not isinstance(version, str)
        or not version
        or len(version) > MAX_VERSION_LENGTH
        or not version.isprintable()
        or version.strip() != version
    ):
        raise RegistrationError(
            name,
            f"workflow {name!r} has {what} {version!r}: a version is 1 to "
            f"{MAX_VERSION_LENGTH} printable characters without leading or trailing spaces, "
            "e.g. '2' or '2024-06-01'",
        )
    return version


def check_fail_on(name: str, fail_on: object) -> tuple[type[BaseException], ...]:
    """`fail_on` as a tuple of exception types (one type alone is accepted); else a
    RegistrationError saying what to give."""
    given = (fail_on,) if isinstance(fail_on, type) else fail_on
    if isinstance(given, tuple | list) and all(
        isinstance(t, type) and issubclass(t, BaseException) for t in given
    ):
        return tuple(given)
    raise RegistrationError(
        name,
        f"workflow {name!r} has fail_on={fail_on!r}: give exception types, e.g. "
        "fail_on=(ValueError, KeyError)",
    )


def registration(
    name: str,
    fn: Callable[..., Any],
    version: str | None,
    compatible: Iterable[str],
    fail_on: object = (),
) -> WorkflowRegistration:
    """Check and build a registration; the version defaults to the code's digest."""
    if isinstance(compatible, str):
        raise RegistrationError(
            name,
            f"compatible={compatible!r} is one string; give a tuple: compatible=({compatible!r},)",
        )
    own = check_version(name, version if version is not None else code_version(fn))
    older = tuple(
        dict.fromkeys(check_version(name, v, "compatible version") for v in compatible if v != own)
    )
    return WorkflowRegistration(name, fn, own, older, check_fail_on(name, fail_on))


class Registry:
    """A worker's registered workflows by name; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, WorkflowRegistration] = {}

    def add(
        self,
        fn: Callable[..., Any],
        name: str | None,
        version: str | None = None,
        compatible: Iterable[str] = (),
        fail_on: object = (),
    ) -> WorkflowRegistration:
        """Register `fn` under `name` (default: its `__name__`); the same function
        again is a no-op.

        Raises:
            RegistrationError: `fn` is not callable, has no name, is a plain
                function without `yield`, or the name is another function's; or
                a version or `fail_on` is malformed.
        """
        if not callable(fn):
            raise RegistrationError(str(name), f"workflow {fn!r} is not callable")
        key = name if name is not None else str(getattr(fn, "__name__", ""))
        if not key:
            raise RegistrationError(
                key, f"workflow {fn!r} has no name; register it with @worker.workflow(name=...)"
            )
        if inspect.isfunction(fn) and not inspect.isgeneratorfunction(fn):
            raise RegistrationError(
                key,
                f"workflow {key!r} is a plain function, not a generator: a workflow must "
                "`yield` its steps (write `result = yield ctx.run(fn, ...)`)",
            )
        registered = registration(key, fn, version, compatible, fail_on)
        with self._lock:
            existing = self._by_name.get(key)
            if existing is not None and existing.fn is not fn:
                raise RegistrationError(
                    key,
                    f"a workflow named {key!r} is already registered on this worker "
                    f"({_describe(existing.fn)}); register {_describe(fn)} under another "
                    "name with @worker.workflow(name=...)",
                )
            self._by_name[key] = registered
        return registered

    def copy(self) -> dict[str, WorkflowRegistration]:
        """The registrations by name, as they are now."""
        with self._lock:
            return dict(self._by_name)


def _describe(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{name}" if module else str(name)


__all__ = ["Registry", "WorkflowRegistration", "check_version", "code_version", "registration"]
