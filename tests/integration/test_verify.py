"""`dpone verify` on real databases: a backfill proven chunk by chunk, tampered chunks found with
their ranges, nothing written on either side.

- Postgres: source, target and ledger in a throwaway schema of the test server;
- SQLite: the demo project (scripts/demo_seed.py, golden/internal_default).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dpone.cli import main
from dpone.connectors.base import SourceSpec, TableRef
from dpone.connectors.postgres import PostgresSource
from dpone.connectors.sqlite import SqliteSource

ROOT = Path(__file__).resolve().parents[2]
DEMO_CATALOG = str(ROOT / "golden" / "internal_default" / "workloads.yaml")

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow:
      image: example/dpone:1
      mapping: {mode: summary, max_items: 6, max_active: 3, pool: dpone_test}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: wh, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-31}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit, require_distributed_lock: true}}
"""


def _last_error(err: str) -> dict[str, object]:
    last: dict[str, object] = json.loads(err.strip().splitlines()[-1])
    return last


@pytest.fixture
def pg_project(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str]]:
    schema = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, "
                "order_date date NOT NULL, amount numeric(12,2), note text)"
            )
        # 100 rows a day over 30 days; the target has an extra column the source lacks
        conn.execute(f"ALTER TABLE {schema}.orders ADD COLUMN loaded_at timestamptz DEFAULT now()")
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 30), "
            f"(g % 1000) / 4.0, CASE WHEN g % 7 = 0 THEN NULL ELSE 'n' || g END "
            f"FROM generate_series(1, 3000) g"
        )
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    monkeypatch.delenv("DPONE_AIRFLOW_MAPPING_ITEM", raising=False)
    monkeypatch.delenv("DPONE_AIRFLOW_RUN_IDENTITY", raising=False)
    monkeypatch.delenv("DPONE_EVIDENCE_DIR", raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    (tmp_path / "workloads.yaml").write_text(CATALOG)
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema))
    yield str(tmp_path / "workloads.yaml"), schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def _digest(dsn: str, schema: str) -> list[object]:
    """Every row of the target and of the ledger's tables, to prove verify writes nothing."""
    with psycopg.connect(dsn) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) FROM "
                "information_schema.tables WHERE table_schema IN (%s, %s) ORDER BY 1",
                (schema, f"{schema}_audit"),
            )
        ]
        return [
            (
                t,
                conn.execute(
                    f"SELECT md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), ''))"
                    f" FROM {t} x"
                ).fetchone(),
            )
            for t in tables
        ]


@pytest.mark.postgres
def test_postgres_backfill_proven_and_tampered_chunks_found(
    pg_project: tuple[str, str], pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog, schema = pg_project
    verify = ["verify", "--catalog", catalog, "--workload", "orders"]
    assert main([*verify]) == 1  # nothing has run: every chunk's target is empty
    out = capsys.readouterr().out
    assert out.count("MISMATCH orders/orders chunk ") == 30
    assert "chunk 1 [2023-01-01, 2023-01-02): rows: source 100, target 0" in out

    assert main(["run", "--catalog", catalog, "--workload", "orders", "--no-progress"]) == 0
    capsys.readouterr()
    assert main([*verify, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["matches"] is True and doc["chunks_checked"] == doc["chunks_matching"] == 30
    assert doc["source_rows"] == doc["target_rows"] == 3000 and doc["mismatches"] == []
    assert all(c["source_rows"] == 100 for c in doc["chunks"])
    # verify compares in the form the run's gate recorded
    with psycopg.connect(pg_dsn) as conn:
        recorded = dict(
            conn.execute(
                f"SELECT chunk_index, checksum FROM {schema}_audit.chunk_transition"
                " WHERE state = 'committed'"
            ).fetchall()
        )
    assert len(recorded) == 30
    for chunk in doc["chunks"]:
        assert chunk["source_checksum"].startswith("rowsum-pgchain64-v1:100:")
        assert chunk["source_checksum"] == chunk["target_checksum"] == recorded[chunk["index"]]

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # chunk 5: same rows, one value changed; chunk 20: a row lost; chunk 27: a NULL filled
        conn.execute(f"UPDATE {schema}.orders SET amount = amount + 0.01 WHERE order_id = 4")
        conn.execute(f"DELETE FROM {schema}.orders WHERE order_id = 19")
        conn.execute(f"UPDATE {schema}.orders SET note = '' WHERE order_id = 56")
        conn.execute(f"UPDATE {schema}.orders SET loaded_at = now() - interval '1 day'")
    before = _digest(pg_dsn, schema)
    assert main(verify) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[:3] == [
        "MISMATCH orders/orders chunk 5 [2023-01-05, 2023-01-06): same row count (100), "
        "different content",
        "MISMATCH orders/orders chunk 20 [2023-01-20, 2023-01-21): rows: source 100, target 99",
        "MISMATCH orders/orders chunk 27 [2023-01-27, 2023-01-28): same row count (100), "
        "different content",
    ]
    assert lines[3].startswith(
        "dpone verify: orders/orders: MISMATCH — 27 of 30 checked chunk(s) match (30 in the "
        "plan), 3 mismatched; 3,000 source rows, 2,999 target rows"
    )
    assert _last_error(captured.err)["code"] == "DPONE_VERIFY_MISMATCH"
    assert _digest(pg_dsn, schema) == before, "verify changed a table"

    assert main([*verify, "--chunks", "5,20-21", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [c["index"] for c in doc["chunks"]] == [5, 20, 21]
    assert [c["index"] for c in doc["mismatches"]] == [5, 20]
    assert doc["mismatches"][1]["lower"] == "2023-01-20"
    assert main([*verify, "--chunks", "1-4,6-19"]) == 0
    capsys.readouterr()


@pytest.mark.postgres
@pytest.mark.parametrize("chunks", ["0-3", "31", "4-2", "a-b", "1,,2", "\uff14", "1-\u0663"])
def test_bad_chunk_ranges_are_usage_errors(
    pg_project: tuple[str, str], chunks: str, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog, _ = pg_project
    code = main(["verify", "--catalog", catalog, "--workload", "orders", "--chunks", chunks])
    assert code == 2
    assert _last_error(capsys.readouterr().err)["code"] == "DPONE_USAGE"


@pytest.mark.postgres
def test_a_read_only_postgres_source_refuses_writes(
    pg_project: tuple[str, str], pg_dsn: str
) -> None:
    _, schema = pg_project
    spec = SourceSpec("wh", table=TableRef(schema, "raw_orders"))
    with PostgresSource(spec, pg_dsn).read_only() as source:
        assert source.checksum(None).split(":")[1] == "3000"
        conn = source._conn.get()
        assert conn.execute("SHOW transaction_read_only").fetchone() == ("on",)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute(f"DELETE FROM {schema}.raw_orders")
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {schema}.raw_orders").fetchone() == (3000,)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sqlite_demo_backfill_proven_and_a_changed_row_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import runpy

    monkeypatch.chdir(tmp_path)
    seed = runpy.run_path(str(ROOT / "scripts" / "demo_seed.py"))["seed"]
    seed(tmp_path / "demo.db")
    monkeypatch.setenv("DPONE_CONN_DEMO", "sqlite:///demo.db")
    monkeypatch.delenv("DPONE_AIRFLOW_MAPPING_ITEM", raising=False)
    monkeypatch.delenv("DPONE_AIRFLOW_RUN_IDENTITY", raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    verify = ["verify", "--catalog", DEMO_CATALOG, "--workload", "orders_history"]
    assert (
        main(["run", "--catalog", DEMO_CATALOG, "--workload", "orders_history", "--no-progress"])
        == 0
    )
    assert main(verify) == 0
    assert capsys.readouterr().out.startswith(
        "dpone verify: orders_history/orders: match — 9 of 9 checked chunk(s) match"
    )
    with sqlite3.connect(tmp_path / "demo.db") as conn:
        conn.execute("UPDATE orders SET customer = 'someone else' WHERE order_id = 300")
    before = _sha(tmp_path / "demo.db")
    assert main([*verify, "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(c["index"], c["lower"], c["upper"]) for c in doc["mismatches"]] == [
        (2, "2024-01-08", "2024-01-15")  # order 300 is on 2024-01-08 (40 orders a day)
    ]
    assert doc["mismatches"][0]["source_rows"] == doc["mismatches"][0]["target_rows"] == 280
    assert _sha(tmp_path / "demo.db") == before, "verify changed the database file"


def test_a_read_only_sqlite_source_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (a INTEGER)")
        conn.execute("INSERT INTO t VALUES (1)")
    source = SqliteSource(SourceSpec("x", table=TableRef(None, "t")), f"sqlite:///{path}")
    with source.read_only():
        assert source.checksum(None).split(":")[1] == "1"
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            source.db.get().execute("DELETE FROM t")


def test_verify_needs_the_connections(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DPONE_CONN_DEMO", raising=False)
    assert main(["verify", "--catalog", DEMO_CATALOG, "--workload", "orders_history"]) == 3
    err = capsys.readouterr().err
    assert _last_error(err)["code"] == "DPONE_CONNECTION_MISSING"


def test_verify_never_prints_a_dsn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DPONE_CONN_DEMO", "sqlite:///nosuch-secret-path/x.db")
    # a file that does not exist is a configuration error (exit 3), named by its file name only
    assert main(["verify", "--catalog", DEMO_CATALOG, "--workload", "orders_history"]) == 3
    captured = capsys.readouterr()
    assert "nosuch-secret-path" not in captured.out + captured.err
    assert "DPONE_CONFIG_INVALID" in captured.err and "'x.db' does not exist" in captured.err


@pytest.mark.postgres
def test_a_long_verify_groups_its_chunks_and_reports_its_progress(
    pg_project: tuple[str, str], pg_dsn: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """750 integer chunks of 4 ids: both sides sum consecutive chunks in grouped statements,
    each chunk's value the one its own checksum gives (a selection with gaps included), and
    stderr says how far the check is at each tenth, as text or JSON, or not at all."""
    catalog, schema = pg_project
    manifest = Path(catalog).parent / "orders.yaml"
    manifest.write_text(
        manifest.read_text().replace(
            "{column: order_date, type: date, start: 2023-01-01, end: 2023-01-31}",
            "{column: order_id, type: integer, start: 1, end: 3001, step: 4}",
        )
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {schema}.orders SELECT * FROM {schema}.raw_orders")
        conn.execute(f"UPDATE {schema}.orders SET note = 'x' WHERE order_id IN (6, 2990)")
    verify = ["verify", "--catalog", catalog, "--workload", "orders", "--format", "json"]
    assert main(verify) == 1
    captured = capfd.readouterr()
    doc = json.loads(captured.out)
    assert doc["chunks_checked"] == 750
    assert [c["index"] for c in doc["mismatches"]] == [2, 748]
    lines = [line for line in captured.err.splitlines() if "chunk(s) checked" in line]
    assert lines[-1] == "dpone verify: orders/orders: 750 of 750 chunk(s) checked, 2 mismatched"
    # a line at each further tenth reached, after each group of up to 200 chunks
    assert [line.split(": ")[2].split(" of")[0] for line in lines] == ["200", "400", "600", "750"]

    spec = SourceSpec(connection="wh", table=TableRef(schema, "raw_orders"))
    moved = ("amount", "note", "order_date", "order_id")  # not the target's loaded_at
    target = SourceSpec(
        connection="wh", table=TableRef(schema, "orders"), columns=moved, role="target"
    )
    picked = [1, 2, 3, 200, 201, 202, 748, 750]
    assert main([*verify, "--chunks", ",".join(map(str, picked)), "--no-progress"]) == 1
    captured = capfd.readouterr()
    assert "chunk(s) checked" not in captured.err
    chunks = json.loads(captured.out)["chunks"]
    from dpone.connectors.base import ChunkWindow, Source

    source_side, target_side = PostgresSource(spec, pg_dsn), PostgresSource(target, pg_dsn)
    try:
        Source.agree_both(source_side, target_side)
        for chunk in chunks:
            window = ChunkWindow("order_id", "integer", chunk["lower"], chunk["upper"])
            assert chunk["source_checksum"] == source_side.checksum(window)
            assert chunk["target_checksum"] == target_side.checksum(window)
    finally:
        source_side.close()
        target_side.close()
    assert [c["index"] for c in chunks] == picked

    with pytest.MonkeyPatch.context() as env:
        env.setenv("DPONE_LOG_FORMAT", "json")
        assert main(verify) == 1
    err = capfd.readouterr().err.splitlines()
    events = [json.loads(line) for line in err]  # every stderr line is JSON
    progress = [e for e in events if e.get("event") == "verify"]
    assert progress[-1] == {
        "schema": "dpone.progress.v1",
        "event": "verify",
        "label": "orders/orders",
        "done": 750,
        "total": 750,
        "mismatched": 2,
    }


def test_on_a_terminal_verify_rewrites_one_progress_line() -> None:
    import io

    from dpone.campaign.reconcile import VerifyProgress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    progress = VerifyProgress(screen, json_lines=False, workload="w")
    progress.start("p", 3)
    for done in (1, 2, 3):
        progress.advance(done, done - 1)
    assert screen.getvalue() == (
        "\r\x1b[Kdpone verify: w/p: 1 of 3 chunk(s) checked, 0 mismatched"
        "\r\x1b[Kdpone verify: w/p: 2 of 3 chunk(s) checked, 1 mismatched"
        "\r\x1b[Kdpone verify: w/p: 3 of 3 chunk(s) checked, 2 mismatched\n"
    )
