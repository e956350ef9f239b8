"""The hooks of .pre-commit-hooks.yaml run as pre-commit runs a `language: system` hook (the
entry split like a shell, then the args, no file names) and give the exit codes docs/ci.md
promises: 0 when the catalog is valid and the DAG folder up to date, 1 otherwise."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from docs_markdown import ROOT
from ruamel.yaml import YAML

DPONE = ROOT / ".venv" / "bin" / "dpone"
CASE = ROOT / "golden" / "summary_365_into_40"


def _hooks() -> dict[str, dict[str, object]]:
    loaded = YAML(typ="safe").load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    return {hook["id"]: hook for hook in loaded}


def _run(hook: dict[str, object], args: list[str], cwd: Path) -> int:
    entry = shlex.split(str(hook["entry"]))
    assert entry[0] == "dpone"
    done = subprocess.run(
        [str(DPONE), *entry[1:], *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    return done.returncode


def test_the_hooks_are_defined_as_documented() -> None:
    hooks = _hooks()
    assert set(hooks) == {"dpone-check", "dpone-generate-check"}
    for hook in hooks.values():
        assert hook["language"] == "system" and hook["pass_filenames"] is False
    ci = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    for hook_id in hooks:
        assert f"id: {hook_id}" in ci, f"{hook_id} is not documented in docs/ci.md"


def test_the_hooks_pass_a_clean_project_and_fail_a_stale_or_broken_one(tmp_path: Path) -> None:
    hooks = _hooks()
    for name in ("workloads.yaml", "orders_history.yaml"):
        shutil.copy(CASE / name, tmp_path / name)
    dags = ["workloads.yaml", "--out", "dags/"]
    assert (
        subprocess.run(
            [str(DPONE), "generate", *dags], cwd=tmp_path, capture_output=True, check=False
        ).returncode
        == 0
    )
    assert _run(hooks["dpone-check"], ["workloads.yaml"], tmp_path) == 0
    assert _run(hooks["dpone-generate-check"], dags, tmp_path) == 0

    manifest = tmp_path / "orders_history.yaml"
    manifest.write_text(manifest.read_text().replace("2024-01-01", "2024-02-01"))
    assert _run(hooks["dpone-check"], ["workloads.yaml"], tmp_path) == 0
    assert _run(hooks["dpone-generate-check"], dags, tmp_path) == 1, "stale DAGs must fail"

    manifest.write_text(manifest.read_text().replace("inner_mode:", "inner_mod:"))
    assert _run(hooks["dpone-check"], ["workloads.yaml"], tmp_path) == 1
