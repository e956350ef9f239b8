"""Which campaign a catalog change starts, from the previously generated DAG file alone (no
database): `dpone preview --previous` per process, and the summary line of `generate --check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dpone.cli import main

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders_history:
    manifest: orders.yaml
    airflow:
      image: registry.example.com/dpone-runtime:0.1.0
      secrets: [{connection: warehouse, secret: dpone-conn-warehouse, key: dsn}]
      mapping: {mode: summary, max_items: 4, max_active: 2, pool: dpone_backfill}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: warehouse, table: {{schema: raw, name: orders}}}}
    sink:
      connection: warehouse
      table: {{schema: analytics, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
{pin}      chunk: {{column: order_date, type: date, start: {start}, end: {end}}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: warehouse, schema: dpone_audit, require_distributed_lock: true}}
"""


def write(root: Path, end: str, pinned: bool = True, start: str = "2024-01-01") -> str:
    pin = "      backfill_id: orders-2024\n" if pinned else ""
    (root / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    manifest = MANIFEST.format(pin=pin, start=start, end=end)
    (root / "orders.yaml").write_text(manifest, encoding="utf-8")
    return str(root / "workloads.yaml")


def preview(capsys: pytest.CaptureFixture[str], catalog: str, dags: Path) -> dict[str, object]:
    assert main(["preview", catalog, "--previous", str(dags), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    campaign: dict[str, object] = doc["workloads"][0]["processes"][0]["campaign"]
    return campaign


@pytest.mark.parametrize(
    ("end", "pinned", "start", "change", "words"),
    [
        ("2024-01-09", True, "2024-01-01", "keeps", "the same campaign"),
        ("2024-01-13", True, "2024-01-01", "extends", "extends 8 -> 12 chunks"),
        ("2024-01-13", False, "2024-01-01", "replaces", "every chunk moves again"),
        ("2024-01-07", True, "2024-01-01", "conflicts", "the ledger refuses it"),
        ("2024-01-09", True, "2023-12-30", "conflicts", "not an extension"),
    ],
    ids=["keep", "extend", "replace-derived-key", "shrink", "earlier-start"],
)
def test_preview_and_check_say_what_a_change_does_to_the_campaign(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    end: str,
    pinned: bool,
    start: str,
    change: str,
    words: str,
) -> None:
    dags = tmp_path / "dags"
    catalog = write(tmp_path, "2024-01-09", pinned=True)
    assert main(["generate", catalog, "--out", str(dags)]) == 0
    header = (dags / "orders_history.py").read_text(encoding="utf-8").splitlines()
    assert header[4].startswith("# campaign orders: run_key orders-2024, 8 chunks, plan sha256:")
    capsys.readouterr()

    catalog = write(tmp_path, end, pinned=pinned, start=start)
    campaign = preview(capsys, catalog, dags)
    assert campaign["change"] == change and words in str(campaign["detail"])
    assert campaign["previous"] == {"run_key": "orders-2024", "chunks": 8}
    assert main(["preview", catalog, "--previous", str(dags)]) == 0
    text = capsys.readouterr().out
    assert f"    campaign         {campaign['run_key']}  {change.upper()}: " in text

    code = main(["generate", catalog, "--out", str(dags), "--check"])
    err = capsys.readouterr().err
    if change == "keeps":
        assert code == 0 and "campaigns:" not in err
    else:
        assert code == 1
        (line,) = [x for x in err.splitlines() if x.startswith("  campaigns: ")]
        assert line.startswith(f"  campaigns: orders_history/orders {change.upper()}: ")
        assert words in line
    assert main(["generate", catalog, "--out", str(dags), "--check", "--format", "json"]) == code
    doc = json.loads(capsys.readouterr().out)
    assert [c["change"] for c in doc["campaigns"]] == ([] if change == "keeps" else [change])


def test_preview_without_previous_names_the_campaign_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = write(tmp_path, "2024-01-09")
    assert main(["preview", catalog]) == 0
    out = capsys.readouterr().out
    assert "    campaign         orders-2024\n" in out
    assert main(["preview", catalog, "--previous", str(tmp_path / "none")]) == 2
    assert "--previous" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    campaign = preview(capsys, catalog, empty)
    assert campaign["change"] == "new" and campaign["previous"] is None


@pytest.mark.parametrize("special", ["fifo", "device"])
def test_preview_refuses_a_previous_that_is_no_regular_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], special: str
) -> None:
    """Regression: a FIFO as --previous blocked for ever, /dev/zero read until memory ran out."""
    import os

    catalog = write(tmp_path, "2024-01-09")
    path = "/dev/zero"
    if special == "fifo":
        path = str(tmp_path / "old_dag.py")
        os.mkfifo(path)
    assert main(["preview", catalog, "--previous", path]) == 2
    assert "not a regular file or a folder" in capsys.readouterr().err
