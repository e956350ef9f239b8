"""`dpone check` and `dpone preview`: exit codes, dpone.error.v1 JSON, the preview document."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dpone import errors
from dpone.authoring.schema import load_schema
from dpone.cli import main
from jsonschema import Draft202012Validator
from syrupy.assertion import SnapshotAssertion

from .support import (
    BACKFILL_MANIFEST,
    GOLDEN_CATALOGS,
    GOLDEN_IDS,
    REPO,
    catalog_with,
    independent_fingerprint,
    write_project,
)

ERROR_SCHEMA = Draft202012Validator(load_schema("error.v1.schema.json"))
PLAN_SCHEMA = Draft202012Validator(load_schema("mapping-plan.v1.schema.json"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def broken_project(root: Path) -> Path:
    """Three problems in two files: a manifest schema error, a provider-owned env key and a bad
    policy; all of them are reported by one check."""
    catalog = catalog_with(
        "{mode: visible, max_items: 0}", extra_airflow="env: {DPONE_AIRFLOW_MAPPING_ITEM: x}"
    )
    manifest = BACKFILL_MANIFEST.replace("parallel_workers: 1", "parallel_workers: 0")
    return write_project(root, catalog, {"orders.yaml": manifest})


# --- dpone check -------------------------------------------------------------------------------


@pytest.mark.parametrize("catalog", GOLDEN_CATALOGS, ids=GOLDEN_IDS)
def test_check_golden_projects_exit_0(capsys: pytest.CaptureFixture[str], catalog: Path) -> None:
    code, out, err = run(capsys, "check", str(catalog))
    assert (code, err) == (0, "")
    assert out.startswith(f"dpone check: {catalog}: OK — ")


@pytest.mark.parametrize("catalog", GOLDEN_CATALOGS, ids=GOLDEN_IDS)
def test_check_json_of_a_clean_project_is_an_empty_list(
    capsys: pytest.CaptureFixture[str], catalog: Path
) -> None:
    code, out, _ = run(capsys, "check", str(catalog), "--format", "json")
    assert code == 0 and json.loads(out) == []


def test_check_errors_exit_1_with_located_lines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = broken_project(tmp_path)
    code, out, err = run(capsys, "check", str(path))
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert lines[-1] == f"dpone check: {len(lines) - 1} error(s) in {path}"
    assert lines[:-1] == [
        f"{tmp_path / 'orders.yaml'}:14:25: {errors.MANIFEST_INVALID}: "
        "processes.0.backfill.parallel_workers: must be >= 1, got 0",
        f"{path}:7:13: {errors.PROVIDER_OWNED_ENV}: workload 'orders': "
        "airflow.env.DPONE_AIRFLOW_MAPPING_ITEM is owned by dpone and cannot be set",
        f"{path}:6:43: {errors.MAPPING_POLICY_INVALID}: workloads.orders.airflow.mapping.max_items: "
        "max_items must be an integer 1..200, got 0",
    ]


def test_check_json_errors_validate_against_the_error_schema(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "check", str(broken_project(tmp_path)), "--format", "json")
    assert code == 1 and err == ""
    records: list[dict[str, Any]] = json.loads(out)
    assert len(records) == 3
    for record in records:
        ERROR_SCHEMA.validate(record)
        assert record["code"] in errors.REGISTRY
        assert record["file"] and record["line"] and record["column"]
    assert [r["code"] for r in records] == [
        errors.MANIFEST_INVALID,
        errors.PROVIDER_OWNED_ENV,
        errors.MAPPING_POLICY_INVALID,
    ]


def test_check_compile_errors_are_reported_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    catalog = catalog_with("{mode: visible, max_items: 5, max_active: 2}")
    path = write_project(tmp_path, catalog, {"orders.yaml": BACKFILL_MANIFEST})
    code, out, _ = run(capsys, "check", str(path), "--format", "json")
    assert code == 1
    records = json.loads(out)
    # the compile error, plus the DAG-level rules check also applies (this catalog has no image)
    assert records[0]["code"] == errors.MAPPING_TASK_LIMIT_EXCEEDED
    for record in records:
        ERROR_SCHEMA.validate(record)


def test_check_missing_file_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "check", str(tmp_path / "missing.yaml"), "--format", "json")
    assert code == 1
    assert [r["code"] for r in json.loads(out)] == [errors.FILE_NOT_FOUND]


@pytest.mark.parametrize(
    "argv",
    [["check"], ["check", "a.yaml", "--format", "yaml"], ["check", "a.yaml", "--bogus"]],
    ids=["no-catalog", "bad-format", "unknown-option"],
)
def test_check_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    error_line = json.loads(err.strip().splitlines()[-1])
    ERROR_SCHEMA.validate(error_line)
    assert error_line["code"] == errors.USAGE


def test_check_console_script_exit_codes(tmp_path: Path) -> None:
    dpone = Path(sys.executable).with_name("dpone")
    env = {**os.environ, "NO_COLOR": "1"}
    golden = GOLDEN_CATALOGS[0].relative_to(REPO)
    results = [
        subprocess.run(
            [str(dpone), *argv], cwd=REPO, capture_output=True, text=True, env=env, check=False
        ).returncode
        for argv in (["check", str(golden)], ["check", str(broken_project(tmp_path))], ["check"])
    ]
    assert results == [0, 1, 2]


# --- dpone preview -----------------------------------------------------------------------------


@pytest.mark.parametrize("catalog", GOLDEN_CATALOGS, ids=GOLDEN_IDS)
def test_preview_json_document_shape(capsys: pytest.CaptureFixture[str], catalog: Path) -> None:
    code, out, err = run(capsys, "preview", str(catalog), "--format", "json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert list(document) == ["workloads"] and document["workloads"]
    for workload in document["workloads"]:
        assert {"name", "dag_id", "pack_fingerprint", "mapping_source", "processes"} <= set(
            workload
        )
        assert workload["processes"]
        for process in workload["processes"]:
            assert {"name", "mode", "mapping_plan", "chunks_total", "limits"} <= set(process)
            plan = process["mapping_plan"]
            if process["mode"] == "internal":
                assert plan is None
                continue
            PLAN_SCHEMA.validate(plan)
            assert plan["mode"] == process["mode"]
            assert plan["chunks_total"] == process["chunks_total"]
            assert plan["backfill_plan_hash"] == process["backfill_plan_hash"]
            assert plan["items_total"] == len(plan["items"]) <= plan["limits"]["max_items"] <= 200
            body = {k: v for k, v in plan.items() if k != "plan_fingerprint"}
            assert plan["plan_fingerprint"] == independent_fingerprint(body)


@pytest.mark.parametrize("catalog", GOLDEN_CATALOGS, ids=GOLDEN_IDS)
def test_preview_text(
    capsys: pytest.CaptureFixture[str], catalog: Path, snapshot: SnapshotAssertion
) -> None:
    code, out, err = run(capsys, "preview", str(catalog))
    assert (code, err) == (0, "")
    _, out_json, _ = run(capsys, "preview", str(catalog), "--format", "json")
    document = json.loads(out_json)
    for workload in document["workloads"]:
        assert f"workload {workload['name']}  (dag {workload['dag_id']}" in out
        assert f"pack fingerprint   {workload['pack_fingerprint']}" in out
        for process in workload["processes"]:
            assert f"  process {process['name']}\n    mode             {process['mode']}\n" in out
            if process["mapping_plan"]:
                assert f"plan fingerprint {process['mapping_plan']['plan_fingerprint']}" in out
                assert f"items_total      {process['mapping_plan']['items_total']}\n" in out
    # Pinned: a change of any chunk, plan or pack byte shows up here as a reviewed diff.
    # Update deliberately with: .venv/bin/python -m pytest tests/unit -k preview_text --snapshot-update
    assert out == snapshot


def test_preview_one_workload(capsys: pytest.CaptureFixture[str]) -> None:
    catalog = REPO / "golden" / "multi_workload" / "workloads.yaml"
    code, out, _ = run(
        capsys, "preview", str(catalog), "--workload", "sessions_hourly", "--format", "json"
    )
    assert code == 0
    assert [w["name"] for w in json.loads(out)["workloads"]] == ["sessions_hourly"]
    code, _, err = run(capsys, "preview", str(catalog), "--workload", "nope")
    assert code == 2 and "workload 'nope' is not in" in err and "(has: customers_snapshot" in err


def test_preview_of_a_broken_project_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    catalog = str(broken_project(tmp_path))
    code, out, err = run(capsys, "preview", catalog)
    assert code == 1 and out == "" and "as dpone check reports them" in err
    # --format json: the problems as a dpone.error.v1 list, as dpone check --format json has them
    code, out, err = run(capsys, "preview", catalog, "--format", "json")
    assert code == 1 and err == ""
    assert out == run(capsys, "check", catalog, "--format", "json")[1]
    assert {r["schema"] for r in json.loads(out)} == {"dpone.error.v1"}
