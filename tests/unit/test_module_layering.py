"""The runtime's modules import each other downward only: no cycle, counting imports inside
functions too (a lazy import hides a cycle from Python, not from a reader). The entry point
`dpone.cli` is imported by nothing in the runtime or the generator.

The runtime is grouped by concern into layers (docs/architecture.md shows the map): a module
imports only modules of its own unit (a sub-package, or a top-level module) or of a lower layer,
never a sibling unit of its own layer, never one above. Every runtime module belongs to a unit
listed here, so a new module is placed in a layer on purpose."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime" / "src"


# Bottom first. A unit is a sub-package of dpone or a top-level module.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("dpone.records",),  # the frozen record every runtime record is (stdlib only)
    ("dpone.errors", "dpone.suggest"),  # foundation: error codes, "did you mean" (stdlib only)
    ("dpone.plan",),  # the pure planning core (stdlib only)
    ("dpone.credentials", "dpone.lifecycle", "dpone.task"),  # DSNs; signals, limits; task env
    ("dpone.connectors", "dpone.ledger"),  # sources and sinks; the campaign ledger
    ("dpone.authoring",),  # catalog and manifests loaded and validated
    ("dpone.packing",),  # the pack compiled and checked against the task
    ("dpone.observability",),  # result, reporting, progress, metrics, lineage, timing
    ("dpone.run",),  # `dpone run`
    ("dpone.campaign",),  # `dpone ledger ...`, `dpone verify`, campaign changes
    ("dpone.cli",),  # the entry point
    ("dpone.__main__",),  # `python -m dpone`
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
# The pure core, and everything it imports, uses only the standard library and these units.
PURE = {
    "dpone.plan": {"dpone.errors", "dpone.suggest", "dpone.records"},
    "dpone.errors": {"dpone.records"},
    "dpone.records": set(),
    "dpone.suggest": {"dpone.records"},
}


def _unit(module: str) -> str:
    """`dpone.run.runner` -> `dpone.run`; `dpone.errors` -> `dpone.errors`."""
    return ".".join(module.split(".")[:2])


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


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a sibling unit of the same layer or of a higher layer."""
    wrong = []
    for name, deps in graph.items():
        for dep in deps:
            mine, theirs = _unit(name), _unit(dep)
            if mine != theirs and RANK[theirs] >= RANK[mine]:
                wrong.append(f"{name} imports {dep} ({theirs} is not below {mine})")
    return sorted(wrong)


def test_every_runtime_module_is_in_a_layer() -> None:
    unplaced = sorted(name for name in _graph() if name != "dpone" and _unit(name) not in RANK)
    assert unplaced == [], f"add these to LAYERS (and to docs/architecture.md): {unplaced}"


def test_imports_point_down_the_layers() -> None:
    assert _upward_imports(_graph()) == []


def test_the_layer_check_catches_an_upward_and_a_sideways_import() -> None:
    graph = {
        "dpone.plan.chunks": {"dpone.errors"},  # down: fine
        "dpone.run.runner": {"dpone.run.orchestrator"},  # within a unit: fine
        "dpone.ledger.sql": {"dpone.run.runner"},  # up
        "dpone.connectors.base": {"dpone.ledger.port"},  # sideways, same layer
    }
    assert _upward_imports(graph) == [
        "dpone.connectors.base imports dpone.ledger.port (dpone.ledger is not below dpone.connectors)",
        "dpone.ledger.sql imports dpone.run.runner (dpone.run is not below dpone.ledger)",
    ]


def test_the_pure_core_imports_only_the_stdlib_and_its_foundation() -> None:
    graph = _graph()
    for name, deps in graph.items():
        if _unit(name) in PURE:
            assert {_unit(d) for d in deps} - {_unit(name)} <= PURE[_unit(name)], name
    dpone = RUNTIME / "dpone"
    for path in [*dpone.joinpath("plan").rglob("*.py"), dpone / "errors.py", dpone / "suggest.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            roots = []
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                roots = [node.module.split(".")[0]]
            for root in roots:
                assert root == "dpone" or root in sys.stdlib_module_names, (path, root)


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
        "import sys; import dpone.cli, dpone.run.runner, dpone.run.orchestrator; "
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
