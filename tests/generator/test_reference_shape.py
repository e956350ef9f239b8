"""Generated DAG files keep the proven reference shape (tests/airflow/reference/).

The reference files are hand-written and proven on Airflow 2.10.5, 2.11.2, 3.2.2 and 3.3.2. The
templates copy their imports and operator classes verbatim; when the reference changes, resync with

    .venv/bin/python tests/generator/test_reference_shape.py --sync

then regenerate the goldens (python -m dpone_generator.update_goldens) and review both diffs.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from dpone.authoring.loader import TASK_OPTIONS, pod_option_names

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "airflow" / "reference"
TEMPLATES = ROOT / "templates"
GOLDEN = ROOT / "golden"
FLAVOUR_REFERENCE = {"kubernetes": "kubernetes_summary.py", "subprocess": "subprocess_summary.py"}
SECRET_IMPORT = "    from airflow.providers.cncf.kubernetes.secret import Secret\n"
TEMPLATE_HEAD = (
    "{{#- The {flavour} flavour's imports and operator code, verbatim from the proven reference\n"
    "    tests/airflow/reference/{ref} (tests/generator/test_reference_shape.py holds them\n"
    "    equal; its --sync rewrites this file). #}}\n"
)
RUNTIME_CLASS = {
    "kubernetes": "DponeRuntimeOperator",
    "subprocess": "DponeRuntimeSubprocessOperator",
}


def reference_preamble(flavour: str) -> str:
    """The reference file from ``from __future__`` up to (not including) ``with DAG(``."""
    src = (REFERENCE / FLAVOUR_REFERENCE[flavour]).read_text(encoding="utf-8")
    start = src.index("from __future__ import annotations")
    end = src.index("\nwith DAG(")
    return src[start:end].rstrip("\n") + "\n"


def template_text(flavour: str) -> str:
    """What templates/operator_<flavour>.py.jinja must hold for the current reference."""
    body = reference_preamble(flavour)
    if flavour == "kubernetes":
        assert SECRET_IMPORT in body
        body = body.replace(
            SECRET_IMPORT, "{% if dag.secrets %}\n" + SECRET_IMPORT + "{% endif %}\n"
        )
    head = TEMPLATE_HEAD.format(flavour=flavour, ref=FLAVOUR_REFERENCE[flavour])
    return head + body


def sync() -> None:
    for flavour in FLAVOUR_REFERENCE:
        path = TEMPLATES / f"operator_{flavour}.py.jinja"
        path.write_text(template_text(flavour), encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")


@pytest.mark.parametrize("flavour", sorted(FLAVOUR_REFERENCE))
def test_operator_code_is_the_reference_code(flavour: str) -> None:
    path = TEMPLATES / f"operator_{flavour}.py.jinja"
    assert path.read_text(encoding="utf-8") == template_text(flavour), (
        f"{path.name} differs from {FLAVOUR_REFERENCE[flavour]}; resync with: "
        ".venv/bin/python tests/generator/test_reference_shape.py --sync"
    )


def golden_files() -> list[Path]:
    return sorted(GOLDEN.glob("*/expected/*.py"))


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _kwargs(call: ast.Call, shared: dict[str, set[str]] | None = None) -> set[str]:
    """The keyword names a call passes, a ``**NAME`` of a module-level dict literal expanded."""
    names = {k.arg for k in call.keywords if k.arg}
    for keyword in call.keywords:
        if keyword.arg is None and isinstance(keyword.value, ast.Name):
            names |= (shared or {}).get(keyword.value.id, set())  # not **kwargs
    return names


def _shared(tree: ast.Module) -> dict[str, set[str]]:
    """Module-level ``NAME = {"key": ...}`` dicts with literal string keys: NAME -> its keys."""
    found: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            keys = node.value.keys
            if all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = {k.value for k in keys}  # type: ignore[union-attr]
    return found


def _reference_calls(flavour: str) -> dict[str, set[str]]:
    """Keyword names per constructor in the reference: DAG, hook, runtime partial, expand."""
    tree = ast.parse((REFERENCE / FLAVOUR_REFERENCE[flavour]).read_text(encoding="utf-8"))
    found = _call_kwargs(tree, flavour)
    mapped_only = {"pool", "max_active_tis_per_dag", "map_index_template"}
    if flavour == "kubernetes":
        internal = ast.parse((REFERENCE / "kubernetes_internal.py").read_text(encoding="utf-8"))
        found["task"] = _call_kwargs(internal, flavour)["task"]
        assert found["task"] == (found["partial"] - mapped_only) | {"env_vars"}
    else:  # no internal subprocess reference: the mapped one without its mapping arguments
        found["task"] = (found["partial"] - mapped_only) | {"env_vars"}
    return found


def _call_kwargs(tree: ast.Module, flavour: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    runtime = RUNTIME_CLASS[flavour]
    shared = _shared(tree)
    for call in _calls(tree):
        func = call.func
        names = _kwargs(call, shared)
        if isinstance(func, ast.Name) and func.id == "DAG":
            found["dag"] = names
        elif isinstance(func, ast.Attribute) and func.attr == "partial":
            found["partial"] = names
        elif isinstance(func, ast.Attribute) and func.attr == "expand":
            found["expand"] = names
        elif isinstance(func, ast.Name) and func.id in ("DponePodOperator", runtime):
            kind = "hook" if "validate_result" in names or func.id != runtime else "task"
            found[kind] = names
    return found


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_generated_calls_use_the_reference_arguments(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    flavour = (
        "subprocess" if "DponeRuntimeSubprocessOperator(BaseOperator)" in source else "kubernetes"
    )
    ours = _call_kwargs(ast.parse(source), flavour)
    ref = _reference_calls(flavour)
    extras = {"retries", "container_resources", "max_active_runs"}  # what the catalog adds
    options = set(TASK_OPTIONS) | (set(pod_option_names()) if flavour == "kubernetes" else set())
    optional = {"secrets"}  # only when the catalog projects connections
    assert ref["dag"] <= ours["dag"] <= ref["dag"] | extras
    for kind in ("partial", "hook", "task"):
        if kind in ours:
            assert ref[kind] - optional <= ours[kind] <= ref[kind] | extras | options, kind
    if "partial" in ours:
        assert ours["expand"] == ref["expand"] == {"env_vars"}


def test_pod_options_and_task_arguments_never_share_a_name() -> None:
    assert set(TASK_OPTIONS).isdisjoint(pod_option_names())


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_what_the_tasks_share_is_written_once(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    kubernetes = "DponeRuntimeSubprocessOperator(BaseOperator)" not in source
    shared = _shared(tree)
    expected = ["POD_OPTIONS", "TASK_ARGS"] if kubernetes else ["TASK_ARGS"]
    assert all(name in shared for name in expected) and "TASK_ENV" in shared
    if kubernetes:  # a task takes both: a name in each would be a TypeError at parse time
        assert not shared["POD_OPTIONS"] & shared["TASK_ARGS"]
    tasks = 0
    for call in _calls(tree):
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "partial" or (name.startswith("Dpone") and name.endswith("Operator")):
            tasks += 1
            spread = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
            assert spread == expected, ast.unparse(call)[:200]
            own = {k.arg for k in call.keywords if k.arg}
            for mapping in expected:  # an option is either shared or the task's own, never both
                assert not own & shared[mapping], (path.name, own & shared[mapping])
    assert tasks >= 1
    # The run identity: once per runtime task, in TASK_ENV; mapped items and hooks refer to it.
    runtime = len(shared["TASK_ENV"])
    assert source.count('"DPONE_AIRFLOW_RUN_IDENTITY": ') == runtime
    assert source.count("image=") == 0


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_generated_files_import_only_airflow_the_provider_and_stdlib(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            # kubernetes.client: the provider's own dependency (the pod options' models)
            assert (
                top in sys.stdlib_module_names or top == "airflow" or module == "kubernetes.client"
            )
            if module.startswith("airflow.providers."):
                assert module.startswith("airflow.providers.cncf.kubernetes."), module


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_header_names_catalog_workload_and_pack_without_time_or_machine(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    case = path.parent.parent.name
    assert lines[0] == "# Generated by dpone — do not edit."
    assert lines[1] == f"# catalog: golden/{case}/workloads.yaml"
    assert re.fullmatch(r"# workload: [A-Za-z][A-Za-z0-9_]*", lines[2])
    assert re.fullmatch(r"# pack: sha256:[0-9a-f]{64}", lines[3])
    campaigns = [line for line in lines[4:] if line.startswith("# campaign ")]
    for line in campaigns:  # one per chunked process, right after the pack line
        assert re.fullmatch(
            r"# campaign [A-Za-z0-9_]+: run_key [A-Za-z0-9_.\-]+, \d+ chunks, "
            r"plan sha256:[0-9a-f]{64}",
            line,
        )
    rest = lines[4 + len(campaigns) :]
    header = "\n".join(lines[:3] + rest[:2])  # pack and campaign lines are hex: checked above
    assert "/work/" not in header and "/home/" not in header and "/tmp" not in header
    assert not re.search(r"\d{1,2}:\d{2}|\d{4}-\d{2}-\d{2}|version|0\.1\.0", header)


if __name__ == "__main__":
    if sys.argv[1:] == ["--sync"]:
        sync()
    else:
        print(__doc__)
