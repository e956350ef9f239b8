"""The runtime's modules import each other downward only: no cycle, counting imports inside
functions too (a lazy import hides a cycle from Python, not from a reader). The entry point
`dpone.cli` is imported by nothing in the runtime or the generator."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime" / "src"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(RUNTIME).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The dpone modules `path` imports anywhere in its body, resolved to the known module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import submodule` imports the submodule; `from mod import name`, the module
            names = [
                (
                    f"{node.module}.{alias.name}"
                    if f"{node.module}.{alias.name}" in known
                    else node.module
                )
                for alias in node.names
            ]
        for name in names:
            module = name
            while module and module not in known:
                module = module.rpartition(".")[0]
            if module and module != "dpone":
                found.add(module)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in RUNTIME.joinpath("dpone").rglob("*.py")}
    known = set(paths)
    return {name: _imports(path, known) - {name} for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_runtime_modules_import_each_other_without_a_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_nothing_imports_the_entry_point() -> None:
    graph = _graph()
    importers = sorted(name for name, deps in graph.items() if "dpone.cli" in deps)
    assert importers == ["dpone.__main__"]
    for path in (ROOT / "generator").rglob("*.py"):
        assert "dpone.cli" not in _imports(path, set(graph)), path


def test_the_run_entry_loads_no_connector_code() -> None:
    """A mapped item whose chunks are all committed (a cleared task, a retry) imports the CLI,
    the runner and the orchestrator and moves nothing: the connectors (about 9 ms of its start-up)
    are imported only once a chunk is to move."""
    probe = (
        "import sys; import dpone.cli, dpone.runner, dpone.orchestrator; "
        "print(sorted(m for m in sys.modules if m.startswith('dpone.connectors')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(RUNTIME)},
    )
    assert done.stdout.strip() == "[]"
