"""Write the runtime's bytecode before a benchmark starts processes, as installing a wheel does.

This environment may run with PYTHONDONTWRITEBYTECODE, and an editable install then compiles
every module in every process: a pod never pays that, so no benchmark should.
"""

from __future__ import annotations

import compileall
import importlib.util


def compile_bytecode(extra_folder: str | None = None) -> None:
    """Compile the imported ``dpone`` package's folders (and ``extra_folder``, another
    runtime's source compared side by side)."""
    spec = importlib.util.find_spec("dpone")
    assert spec is not None and spec.submodule_search_locations
    for folder in [*spec.submodule_search_locations, *([extra_folder] if extra_folder else [])]:
        compileall.compile_dir(folder, quiet=1)
