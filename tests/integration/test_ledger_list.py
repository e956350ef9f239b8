"""`dpone ledger list` on the real Postgres ledger (two campaigns of two workloads, one complete,
one with a failed item) and on a local_file ledger."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dpone.cli import main

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow:
      image: example/dpone:1
      mapping: {mode: summary, max_items: 6, max_active: 3, pool: dpone_test}
  returns:
    manifest: returns.yaml
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: {name}
    source: {{connection: wh, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: {name}}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: {end}}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit, require_distributed_lock: true}}
"""


@pytest.fixture
def project(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str]]:
    schema = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.raw_orders (order_id bigint PRIMARY KEY, "
            "order_date date NOT NULL, amount integer NOT NULL)"
        )
        for table in ("orders", "returns"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, "
                "order_date date NOT NULL, amount integer NOT NULL CHECK (amount >= 0))"
            )
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 30), g % 1000 "
            "FROM generate_series(1, 3000) g"
        )
        conn.execute(f"INSERT INTO {schema}.raw_orders VALUES (99999, '2023-01-23', -1)")
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    for key in ("DPONE_AIRFLOW_MAPPING_ITEM", "DPONE_AIRFLOW_RUN_IDENTITY", "DPONE_EVIDENCE_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    (tmp_path / "workloads.yaml").write_text(CATALOG)
    (tmp_path / "orders.yaml").write_text(
        MANIFEST.format(s=schema, name="orders", end="2023-01-31")
    )
    (tmp_path / "returns.yaml").write_text(
        MANIFEST.format(s=schema, name="returns", end="2023-01-11")
    )
    yield str(tmp_path / "workloads.yaml"), schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


@pytest.mark.postgres
def test_ledger_list_shows_every_campaign(
    project: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    catalog, schema = project
    run = ["run", "--catalog", catalog, "--no-progress"]
    assert main([*run, "--workload", "returns"]) == 0
    assert main([*run, "--workload", "orders", "--process", "orders", "--item", "4"]) == 1
    capsys.readouterr()
    base = ["ledger", "list", "--connection", "wh", "--schema", f"{schema}_audit"]
    assert main([*base, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "dpone.ledger-list.v1"
    by_workload = {c["workload"]: c for c in doc["campaigns"]}
    assert set(by_workload) == {"orders", "returns"}
    returns, orders = by_workload["returns"], by_workload["orders"]
    assert returns["counts"] == {"committed": 10, "running": 0, "failed": 0, "pending": 0}
    assert returns["complete"] is True and returns["mode"] is None
    # item 4 = chunks 21-25: 21 and 22 committed, 23 failed (the CHECK), 24-25 not started
    assert orders["counts"] == {"committed": 2, "running": 0, "failed": 1, "pending": 27}
    assert orders["chunks_total"] == 30 and orders["complete"] is False
    assert doc["campaigns"][0]["workload"] == "orders"  # most recent activity first
    assert orders["last_activity"] > returns["last_activity"]

    assert main([*base, "--catalog", catalog, "--workload", "orders"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].split() == [
        "campaign", "workload/process", "mode", "chunks", "committed", "running", "failed",
        "pending", "last", "activity",
    ]  # fmt: skip
    assert lines[1].split()[1:8] == ["orders/orders", "summary", "30", "2", "0", "1", "27"]
    assert lines[-1] == f"1 campaign(s) in ledger wh schema {schema}_audit"


@pytest.mark.postgres
def test_ledger_list_shows_the_cancel_reason(
    project: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    catalog, schema = project
    assert main(["run", "--catalog", catalog, "--no-progress", "--workload", "returns"]) == 0
    cancel = ["ledger", "cancel", "--catalog", catalog, "--workload", "returns"]
    assert main([*cancel, "--reason", "source reloaded on 3 May"]) == 0
    capsys.readouterr()
    base = ["ledger", "list", "--connection", "wh", "--schema", f"{schema}_audit"]
    assert main([*base, "--format", "json"]) == 0
    (returns,) = json.loads(capsys.readouterr().out)["campaigns"]
    assert returns["cancelled"] is True
    assert returns["cancel_reason"] == "source reloaded on 3 May"
    assert main(base) == 0
    assert "cancelled: source reloaded on 3 May" in capsys.readouterr().out
    assert main([*cancel, "--undo"]) == 0
    capsys.readouterr()
    assert main([*base, "--format", "json"]) == 0
    (returns,) = json.loads(capsys.readouterr().out)["campaigns"]
    assert returns["cancelled"] is False and returns["cancel_reason"] is None


@pytest.mark.postgres
def test_a_cancel_reason_stored_by_other_means_is_shown_escaped_and_redacted(
    project: tuple[str, str],
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A reason written into the ledger by hand (not through `ledger cancel`, which checks it)
    holding ESC, a newline, a bidi override and a DSN with the connection's password: listed
    as `ledger status` shows it, escaped on one line, the password masked."""
    catalog, schema = project
    password = "List-Secret-9x"
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn.replace("postgres@", f"postgres:{password}@", 1))
    assert main(["run", "--catalog", catalog, "--no-progress", "--workload", "returns"]) == 0
    cancel = ["ledger", "cancel", "--catalog", catalog, "--workload", "returns"]
    assert main([*cancel, "--reason", "placeholder"]) == 0
    reason = f"evil\x1b[2J\nforged line \u202e postgresql://u:{password}@db/x"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {schema}_audit.campaign SET cancel_reason = %s WHERE cancel_reason IS NOT NULL",
            (reason,),
        )
    capsys.readouterr()
    base = ["ledger", "list", "--connection", "wh", "--schema", f"{schema}_audit"]
    assert main(base) == 0
    text = capsys.readouterr().out
    assert password not in text and "\x1b" not in text and "\u202e" not in text
    assert not any(line.startswith("forged") for line in text.splitlines())
    assert "evil\\x1b[2J\\nforged line \\u202e" in text
    assert main([*base, "--format", "json"]) == 0
    out = capsys.readouterr().out
    (returns,) = json.loads(out)["campaigns"]
    assert password not in out and password not in returns["cancel_reason"]


def test_ledger_list_needs_one_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["ledger", "list"]) == 2
    assert main(["ledger", "list", "--connection", "x", "--path", "y"]) == 2
    assert main(["ledger", "list", "--path", "nowhere/ledger"]) == 2
    assert "no local_file ledger at 'nowhere/ledger'" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists(), "listing must not create a ledger"


def test_ledger_list_reads_a_local_file_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import runpy

    root = Path(__file__).resolve().parents[2]
    catalog = str(root / "golden" / "internal_default" / "workloads.yaml")
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(root / "scripts" / "demo_seed.py"))["seed"](tmp_path / "demo.db")
    monkeypatch.setenv("DPONE_CONN_DEMO", "sqlite:///demo.db")
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    assert main(["run", "--catalog", catalog, "--workload", "orders_history", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["ledger", "list", "--path", ".dpone-demo/ledger", "--catalog", catalog]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[1:8] == ["orders_history/orders", "internal", "9", "9", "0", "0", "0"]
    assert out[1].endswith("complete")


@pytest.mark.parametrize("special", ["fifo", "device", "fifo-journal"])
def test_ledger_list_refuses_a_path_that_is_no_regular_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], special: str
) -> None:
    """Regression: a FIFO as the ledger (or its journal) blocked for ever, /dev/zero read until
    memory ran out."""
    import os

    path = "/dev/zero"
    if special.startswith("fifo"):
        path = str(tmp_path / "ledger")
        os.mkfifo(path + (".journal" if special == "fifo-journal" else ""))
        if special == "fifo-journal":
            Path(path).write_text("{}", encoding="utf-8")
    assert main(["ledger", "list", "--path", path]) == 3
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.postgres
def test_ledger_list_counts_a_chunk_moving_in_one_transaction_as_running(
    project: tuple[str, str], pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the ledger in the sink's database a chunk being moved has no committed running
    record: its lock is its lease (ADR 0021). `ledger list` counts it as `ledger status` does."""
    from dpone.ledger.sql import chunk_lock_class

    catalog, schema = project
    assert main(["run", "--catalog", catalog, "--workload", "returns", "--no-progress"]) == 0
    run_key = json.loads(_status_json(catalog, "returns", capsys))["run_key"]
    assert main(["run", "--catalog", catalog, "--workload", "orders", "--item", "0"]) == 0
    capsys.readouterr()
    with psycopg.connect(pg_dsn) as holder:  # a pod moving chunk 9 (item 1's) right now
        orders = json.loads(_status_json(catalog, "orders", capsys))
        key = chunk_lock_class(f"{schema}_audit", orders["run_key"])
        holder.execute("SELECT pg_advisory_xact_lock(%s, 9)", (key,))
        status = json.loads(_status_json(catalog, "orders", capsys))
        base = ["ledger", "list", "--connection", "wh", "--schema", f"{schema}_audit"]
        assert main([*base, "--format", "json"]) == 0
        listed = {c["workload"]: c for c in json.loads(capsys.readouterr().out)["campaigns"]}
        holder.rollback()
    assert status["counts"]["running"] == 1
    assert listed["orders"]["counts"] == status["counts"]
    assert listed["returns"]["run_key"] == run_key and listed["returns"]["counts"]["running"] == 0


def _status_json(catalog: str, workload: str, capsys: pytest.CaptureFixture[str]) -> str:
    argv = ["ledger", "status", "--catalog", catalog, "--workload", workload]
    assert main([*argv, "--format", "json"]) == 0
    return capsys.readouterr().out
