"""Importing users' code by `MODULE[:ATTR]`, for `troth replay --workflows` and
`troth worker`: a dotted module name (from the current directory too, as
`python -m` does) or a `.py` file (imported as a script is run, its directory
first on `sys.path`; `if __name__ == "__main__":` blocks do not run)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["UsageError", "add_import_paths", "import_file", "import_module", "split_spec"]


class UsageError(Exception):
    """Input that stops a command before it does anything: exit status 2."""


def add_import_paths(paths: Sequence[str] = ()) -> None:
    """Put `paths` and the current directory first on `sys.path`, as `python -m` makes
    the current directory importable (a console script's `sys.path[0]` is its bin/)."""
    sys.path[0:0] = [str(Path(directory).resolve()) for directory in (*paths, os.curdir)]


def split_spec(spec: str) -> tuple[str, str | None]:
    """`pkg.mod:attr` -> (`pkg.mod`, `attr`); without `:ATTR`, (`spec`, None)."""
    module, sep, attr = spec.rpartition(":")
    if sep and attr.isidentifier() and module:
        return module, attr
    return spec, None


def import_module(name: str) -> ModuleType:
    """The module, or UsageError saying why it cannot be imported (its traceback)."""
    try:
        if name.endswith(".py"):
            return import_file(Path(name))
        return importlib.import_module(name)
    except UsageError:
        raise
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == name.partition(".")[0]:
            raise UsageError(
                f"cannot import module {name!r}: no such module on the import path; "
                "give --path DIR for the directory that holds it, or a path to the .py file"
            ) from None
        trace = "".join(traceback.format_exception(exc)).rstrip()
        raise UsageError(f"importing {name} failed:\n{trace}") from None


def import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    resolved = path.resolve()
    # A name of its own, so it neither shadows nor is shadowed by an installed module.
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    module_name = f"_troth_user_{digest}_{resolved.stem}"
    if module_name in sys.modules:  # imported once, as `import` does
        return sys.modules[module_name]
    sys.path.insert(0, str(resolved.parent))
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
