"""Payloads are data, never code (DESIGN §7, issue 11 part 7).

- Statically: no module of the server imports a deserializer that runs code
  (pickle, marshal, shelve, dill, yaml...) or calls eval/exec/compile/__import__;
  the SDK neither (its one `importlib.import_module` loads the module an
  operator names on the `troth replay` command line, never a payload).
- Against a real server, on SQLite and PostgreSQL: params and values whose
  bytes are malicious pickles, marshalled code and Python source, under
  content-type headers that claim exactly that, are stored and returned
  verbatim (and, on SQLite, sit in the row as sent), and nothing they would do
  if loaded happens.
"""

from __future__ import annotations

import ast
import base64
import json
import marshal
import pickle
import sqlite3
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _pg import fresh_schema
from _support import start_server
from google.protobuf.duration_pb2 import Duration

from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from collections.abc import Iterator

    from _support import ServerProcess

ROOT = Path(__file__).resolve().parents[2]

CODE_RUNNING_MODULES = frozenset(
    {
        "pickle", "_pickle", "cPickle", "pickletools", "copyreg", "marshal", "shelve",
        "dill", "cloudpickle", "jsonpickle", "joblib", "yaml", "ruamel", "runpy", "code",
        "codeop",
    }
)  # fmt: skip
"""Modules that turn bytes into running code (or exist to): none of them is imported."""
CODE_RUNNING_CALLS = frozenset({"eval", "exec", "compile", "__import__"})
"""Builtins that run (or build) code from data: never called as builtins."""


def _python_files(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "v1" not in p.relative_to(package).parts)


def _code_runners(path: Path, *, allow_import_module: bool = False) -> list[str]:
    """`path:line what` for every import or call that could run a payload as code."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in CODE_RUNNING_MODULES:
                found.append(f"{path}:{node.lineno} imports {name}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in CODE_RUNNING_CALLS:
                found.append(f"{path}:{node.lineno} calls {func.id}()")
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "import_module"
                and not allow_import_module
            ):
                found.append(f"{path}:{node.lineno} calls import_module()")
            if isinstance(func, ast.Attribute) and func.attr in CODE_RUNNING_CALLS:
                owner = func.value
                if isinstance(owner, ast.Name) and owner.id == "builtins":
                    found.append(f"{path}:{node.lineno} calls builtins.{func.attr}()")
    return found


def test_the_server_package_never_loads_code_from_data() -> None:
    files = _python_files(ROOT / "server" / "troth_server")
    assert len(files) > 40  # the scan sees the package
    assert [hit for path in files for hit in _code_runners(path)] == []


def test_the_sdk_never_loads_code_from_data() -> None:
    files = _python_files(ROOT / "sdk" / "troth")
    assert len(files) > 20
    hits = [hit for path in files for hit in _code_runners(path, allow_import_module=True)]
    assert hits == []


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    bait = tmp_path / "bait.py"
    bait.write_text(
        "import pickle\nfrom marshal import loads\nimport yaml.constructor\n"
        "eval('1')\nexec('x = 1')\nbuiltins.exec('y')\nimportlib.import_module('os')\n"
        "re.compile('ok')\nstmt.compile()\n"
    )
    hits = _code_runners(bait)
    assert [hit.split(" ", 1)[1] for hit in hits] == [
        "imports pickle",
        "imports marshal",
        "imports yaml.constructor",
        "calls eval()",
        "calls exec()",
        "calls builtins.exec()",
        "calls import_module()",
    ]


# -- a real server -----------------------------------------------------------------------


class _Boom:
    """Unpickled, it creates the marker file (what an attacker's pickle would do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def _hostile(marker: Path) -> dict[str, types_pb2.Payload]:
    source = f"open({str(marker)!r}, 'w')"
    return {
        "pickle": types_pb2.Payload(
            headers={"content-type": "application/python-pickle", "encoding": "pickle"},
            data=pickle.dumps(_Boom(str(marker))),
        ),
        "serialized": types_pb2.Payload(
            headers={"content-type": "application/x-python-serialize"},
            data=pickle.dumps(_Boom(str(marker)), protocol=0),
        ),
        "marshal": types_pb2.Payload(
            headers={"content-type": "application/x-python-code"},
            data=marshal.dumps(compile(source, "<bait>", "exec")),
        ),
        "source": types_pb2.Payload(
            headers={"content-type": "text/x-python", "x-exec": "true"}, data=source.encode()
        ),
        "base64-pickle": types_pb2.Payload(
            headers={"content-type": "application/json", "content-encoding": "pickle+base64"},
            data=b'"' + base64.b64encode(pickle.dumps(_Boom(str(marker)))) + b'"',
        ),
    }


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        proc = start_server(tmp_path_factory.mktemp("privacy"), db_url=db_url)
        yield proc
        assert proc.stop() == 0, proc.log()[-3000:]


def test_hostile_payloads_are_stored_and_returned_verbatim(
    server: ServerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    hostile = _hostile(marker)
    # The bait works: loaded here, it would leave the marker (then it is removed).
    pickle.loads(hostile["pickle"].data).close()
    assert marker.exists()
    marker.unlink()

    stored: dict[str, tuple[types_pb2.Payload, types_pb2.Payload]] = {}
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        for kind, payload in hostile.items():
            promise_id = f"hostile-{kind}-{uuid.uuid4().hex[:6]}"
            stub.CreatePromise(
                promises_pb2.CreatePromiseRequest(
                    id=promise_id, param=payload, ttl=Duration(seconds=3600)
                ),
                timeout=10,
            )
            stub.ResolvePromise(
                promises_pb2.ResolvePromiseRequest(id=promise_id, value=payload), timeout=10
            )
            stored[promise_id] = (payload, payload)
        # A workflow root with a pickle for its arguments: the server makes its task
        # without looking inside.
        root = f"hostile-root-{uuid.uuid4().hex[:6]}"
        stub.CreatePromise(
            promises_pb2.CreatePromiseRequest(
                id=root,
                param=hostile["pickle"],
                tags={"troth:invoke": "nobody-polls", "troth:func": "f"},
                ttl=Duration(seconds=3600),
            ),
            timeout=10,
        )
        stored[root] = (hostile["pickle"], types_pb2.Payload())

        for promise_id, (param, value) in stored.items():
            got = stub.GetPromise(promises_pb2.GetPromiseRequest(id=promise_id), timeout=10)
            assert got.promise.param == param, promise_id
            assert got.promise.value == value, promise_id
        found = stub.SearchPromises(
            promises_pb2.SearchPromisesRequest(id="hostile-*", page_size=100), timeout=10
        )
        by_id = {p.id: p for p in found.promises}
        assert set(by_id) == set(stored)
        for promise_id, (param, value) in stored.items():
            assert (by_id[promise_id].param, by_id[promise_id].value) == (param, value)

    if server.db_url.startswith("sqlite:///"):
        _assert_rows_verbatim(Path(server.db_url.removeprefix("sqlite:///")), stored)
    assert not marker.exists(), "a stored payload was loaded as code"


def _assert_rows_verbatim(
    db: Path, stored: dict[str, tuple[types_pb2.Payload, types_pb2.Payload]]
) -> None:
    with sqlite3.connect(db) as conn:
        for promise_id, (param, value) in stored.items():
            row = conn.execute(
                "SELECT param_headers, param_data, value_headers, value_data FROM promises "
                "WHERE id = ?",
                (promise_id,),
            ).fetchone()
            assert row is not None, promise_id
            assert (json.loads(row[0]), bytes(row[1])) == (dict(param.headers), param.data)
            assert (json.loads(row[2]), bytes(row[3])) == (dict(value.headers), value.data)
