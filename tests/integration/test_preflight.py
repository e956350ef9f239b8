"""`dpone run` refuses tables that cannot work before any lease (DPONE_PREFLIGHT_FAILED, exit 3,
at the process's manifest location) instead of failing every chunk; on the real Postgres and on
SQLite."""

from __future__ import annotations

import json
import sqlite3
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
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {source}
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: {column}, type: date, start: 2023-01-01, end: 2023-01-31}}
      inner_mode: {inner}
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit}}
"""
TABLE = "{{connection: wh, table: {{schema: {s}, name: raw_orders}}}}"


@pytest.fixture
def pg_project(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, str]]:
    schema = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.raw_orders (order_id bigint PRIMARY KEY, "
            "order_date date NOT NULL, amount integer NOT NULL)"
        )
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 30), g "
            "FROM generate_series(1, 300) g"
        )
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    for key in ("DPONE_AIRFLOW_MAPPING_ITEM", "DPONE_AIRFLOW_RUN_IDENTITY", "DPONE_EVIDENCE_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    (tmp_path / "workloads.yaml").write_text(CATALOG)
    yield tmp_path, schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def _write(
    root: Path, schema: str, source: str = TABLE, column: str = "order_date", inner: str = "replace"
) -> str:
    (root / "orders.yaml").write_text(
        MANIFEST.format(s=schema, source=source.format(s=schema), column=column, inner=inner)
    )
    return str(root / "workloads.yaml")


def _refusal(capsys: pytest.CaptureFixture[str], root: Path) -> dict[str, object]:
    err = capsys.readouterr().err
    last: dict[str, object] = json.loads(err.strip().splitlines()[-1])
    assert last["code"] == "DPONE_PREFLIGHT_FAILED", err
    assert last["file"] == str(root / "orders.yaml") and last["line"] == 3, last
    # refused before data moved: every count 0 (dpone.run-result.v1), not 12 selected and none
    # accounted for
    backfill = json.loads((root / "xcom.json").read_text())["backfill"]
    counts = {k: v for k, v in backfill.items() if k.startswith("chunks_")}
    assert counts and set(counts.values()) == {0}, counts
    return last


def _ledger_counts(dsn: str, schema: str) -> dict[str, int]:
    """Chunk transitions in the ledger by state (none when no chunk was ever leased)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT state, count(*) FROM {schema}_audit.chunk_transition GROUP BY state"
        ).fetchall()
    return {str(state): int(n) for state, n in rows}


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("ddl", "inner", "needle"),
    [
        ("", "replace", "target table '{s}.orders' cannot be read"),
        (
            "CREATE TABLE {s}.orders (order_id bigint PRIMARY KEY, order_date date)",
            "merge",
            "target table '{s}.orders' has no column(s) 'amount'",
        ),
        (
            "CREATE TABLE {s}.orders (order_id bigint PRIMARY KEY, Order_Date date, amount int)",
            "replace",
            "has no column(s) 'order_date'",  # Postgres: a quoted name must match exactly
        ),
    ],
    ids=["no-target", "target-lacks-a-moved-column", "target-column-case"],
)
def test_postgres_target_problems_refuse_before_any_lease(
    pg_project: tuple[Path, str],
    pg_dsn: str,
    capsys: pytest.CaptureFixture[str],
    ddl: str,
    inner: str,
    needle: str,
) -> None:
    root, schema = pg_project
    if ddl:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(ddl.replace("Order_Date", '"Order_Date"').format(s=schema))
    catalog = _write(root, schema, inner=inner)
    assert main(["run", "--catalog", catalog, "--workload", "orders", "--no-progress"]) == 3
    last = _refusal(capsys, root)
    assert needle.format(s=schema) in str(last["message"])
    assert _ledger_counts(pg_dsn, schema) == {}, "a chunk was leased"


@pytest.mark.postgres
def test_postgres_source_problems_refuse_before_any_lease(
    pg_project: tuple[Path, str], pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root, schema = pg_project
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {schema}.orders (order_id bigint PRIMARY KEY, order_date date, "
            "amount int, created date)"
        )
    run = ["run", "--catalog", str(root / "workloads.yaml"), "--workload", "orders"]
    missing_source = "{{connection: wh, table: {{schema: {s}, name: nope}}}}"
    _write(root, schema, source=missing_source)
    assert main([*run, "--no-progress"]) == 3
    assert "the source cannot be read" in str(_refusal(capsys, root)["message"])
    _write(root, schema, column="created")
    assert main([*run, "--no-progress"]) == 3
    assert "the source has no chunk column 'created'" in str(_refusal(capsys, root)["message"])
    query = (
        "{{connection: wh, query: 'SELECT order_id, order_date, amount FROM {s}.raw_orders', "
        "columns: [order_id, amount]}}"
    )
    _write(root, schema, source=query, inner="merge")  # chunk column not moved, but readable
    assert main([*run, "--no-progress"]) == 0
    capsys.readouterr()
    assert _ledger_counts(pg_dsn, schema)["committed"] == 30


@pytest.mark.postgres
def test_a_refused_first_run_leaves_no_campaign_so_the_fix_starts_it(
    pg_project: tuple[Path, str], pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The column list is part of the campaign's configuration: had the refused run recorded
    the campaign, the corrected list would meet DPONE_LEDGER_SHAPE_MISMATCH."""
    root, schema = pg_project
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {schema}.orders (order_id bigint PRIMARY KEY, order_date date, "
            "amount int)"
        )
    run = ["run", "--catalog", str(root / "workloads.yaml"), "--workload", "orders"]
    listed = "{{connection: wh, table: {{schema: {s}, name: raw_orders}}, columns: [{c}]}}"
    _write(root, schema, source=listed.replace("{c}", "order_id, order_date, amont"))
    assert main([*run, "--no-progress"]) == 3
    assert '"amont"' in str(_refusal(capsys, root)["message"])
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute(f"SELECT to_regclass('{schema}_audit.campaign')").fetchone()
        if found is not None and found[0] is not None:
            assert conn.execute(f"SELECT count(*) FROM {schema}_audit.campaign").fetchone() == (
                0,
            ), "the refused run recorded its campaign"
    _write(root, schema, source=listed.replace("{c}", "order_id, order_date, amount"))
    assert main([*run, "--no-progress"]) == 0, capsys.readouterr().err
    assert _ledger_counts(pg_dsn, schema)["committed"] == 30


@pytest.mark.postgres
def test_an_unreachable_database_stays_transient(
    pg_project: tuple[Path, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    pg_dsn: str,
) -> None:
    """The ledger opens first on a good DSN; then the source/target DSN is unreachable."""
    root, schema = pg_project
    catalog = _write(root, schema)
    text = (root / "orders.yaml").read_text()
    text = text.replace("source: {connection: wh", "source: {connection: down")
    (root / "orders.yaml").write_text(text)
    monkeypatch.setenv("DPONE_CONN_DOWN", "postgresql://postgres@127.0.0.1:1/nowhere")
    assert main(["run", "--catalog", catalog, "--workload", "orders", "--no-progress"]) == 4
    err = capsys.readouterr().err
    assert json.loads(err.strip().splitlines()[-1])["code"] == "DPONE_CONNECTION_FAILED"


def test_sqlite_missing_target_refuses_before_any_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import runpy

    root = Path(__file__).resolve().parents[2]
    catalog = str(root / "golden" / "internal_default" / "workloads.yaml")
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(root / "scripts" / "demo_seed.py"))["seed"](tmp_path / "demo.db")
    with sqlite3.connect(tmp_path / "demo.db") as conn:
        conn.execute("DROP TABLE orders")
    monkeypatch.setenv("DPONE_CONN_DEMO", "sqlite:///demo.db")
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    assert main(["run", "--catalog", catalog, "--workload", "orders_history"]) == 3
    err = capsys.readouterr().err
    last = json.loads(err.strip().splitlines()[-1])
    assert last["code"] == "DPONE_PREFLIGHT_FAILED"
    assert last["file"].endswith("orders_history.yaml") and last["line"] == 4
    assert "no such table: orders" in last["message"]
    assert main(["ledger", "status", "--catalog", catalog, "--workload", "orders_history"]) == 0
    assert "0 committed, 0 running, 0 failed, 9 pending" in capsys.readouterr().out
