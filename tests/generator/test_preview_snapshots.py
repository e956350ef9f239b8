"""`dpone preview` output of every golden case, pinned by snapshots (text and JSON).

Update after a deliberate change with:

    .venv/bin/pytest tests/generator/test_preview_snapshots.py --snapshot-update
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dpone.cli import main as dpone_main
from generator_support import golden_cases
from syrupy.assertion import SnapshotAssertion


@pytest.mark.parametrize("case", golden_cases())
def test_preview_text(
    case: str, in_root: Path, capsys: pytest.CaptureFixture[str], snapshot: SnapshotAssertion
) -> None:
    assert dpone_main(["preview", f"golden/{case}/workloads.yaml"]) == 0
    assert capsys.readouterr().out == snapshot


@pytest.mark.parametrize("case", golden_cases())
def test_preview_json(
    case: str, in_root: Path, capsys: pytest.CaptureFixture[str], snapshot: SnapshotAssertion
) -> None:
    assert dpone_main(["preview", f"golden/{case}/workloads.yaml", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == snapshot


def test_preview_json_of_a_catalog_with_errors_is_the_error_list(
    in_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Regression: it printed nothing on stdout (dpone check --format json prints the list)
    catalog = "tests/invalid_catalogs/duplicate_key/workloads.yaml"
    assert dpone_main(["preview", catalog, "--format", "json"]) == 1
    out, err = capsys.readouterr()
    records = json.loads(out)
    assert records and all(r["schema"] == "dpone.error.v1" and r["file"] for r in records)
    assert dpone_main(["check", catalog, "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out) == records and not err
