"""The public surface of `troth` is what `__all__` says, and it stays light to import."""

from __future__ import annotations

import inspect
import subprocess
import sys

import troth
from troth import errors


def test_all_is_sorted() -> None:
    assert troth.__all__ == sorted(troth.__all__)


def test_all_is_complete() -> None:
    # Every public, non-module name reachable as troth.X is listed, and vice versa.
    # Names are imported when first used (PEP 562): dir() lists them, getattr loads them.
    public = {
        name
        for name in dir(troth)
        if not name.startswith("_")
        and not inspect.ismodule(getattr(troth, name))
        and name != "annotations"
    }
    assert set(troth.__all__) == public


def test_every_error_class_is_exported() -> None:
    classes = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, (errors.TrothError, errors.Cancelled))
    }
    assert classes <= set(troth.__all__)
    assert "Reason" in troth.__all__


def test_sdk_imports_without_the_server_stack() -> None:
    server_stack = {"sqlalchemy", "alembic", "psycopg", "structlog", "troth_server"}
    code = (
        "import sys, troth, troth.client, troth.codec, troth.errors, troth._cli\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {server_stack!r})\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_sdk_imports_no_opentelemetry_until_a_span_is_made() -> None:
    # Tracing is optional (troth[otel]): importing the SDK, or a client making no
    # call, never imports it.
    code = (
        "import sys, troth, troth.client, troth.worker, troth._cli\n"
        "troth.Client('127.0.0.1:1').close()\n"
        "heavy = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_import_troth_loads_each_name_when_first_used() -> None:
    # PEP 562: `import troth` is cheap; `troth.Worker` imports the worker, once.
    code = (
        "import sys, troth\n"
        "assert 'troth.worker' not in sys.modules and 'troth.client' not in sys.modules\n"
        "assert troth.Worker.__module__ == 'troth.worker' and 'troth.worker' in sys.modules\n"
        "assert 'Worker' in vars(troth)  # found once, kept\n"
        "from troth import Client, Reason\n"
        "assert Client.__module__ == 'troth.client' and Reason.__module__ == 'troth.errors'\n"
        "try:\n"
        "    troth.NoSuchName\n"
        "except AttributeError as exc:\n"
        "    assert \"module 'troth' has no attribute 'NoSuchName'\" in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
