"""`dpone run` of full refreshes on the real Postgres and on SQLite files: a full_refresh process
(no backfill section, no ledger, one transaction) and a backfill's inner_mode full_refresh over a
one-chunk window (under the ledger). Rows the source does not have must leave the target; a
failure must leave the target exactly as it was.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone.authoring.schema import load_schema, validate
from dpone.cli import main

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  customers:
    manifest: customers.yaml
    airflow: {image: "example/dpone:1"}
"""

FULL_REFRESH = """\
schema: dpone.pipeline.v1
processes:
  - name: customers
    source: {{connection: {src}, table: {{schema: {src_schema}, name: customers}}}}
    sink:
      connection: {dst}
      table: {{schema: {dst_schema}, name: customers}}
      strategy: {{mode: full_refresh}}
"""

ONE_CHUNK = """\
schema: dpone.pipeline.v1
processes:
  - name: customers
    source: {{connection: {src}, table: {{schema: {src_schema}, name: customers}}}}
    sink:
      connection: {dst}
      table: {{schema: {dst_schema}, name: customers}}
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: signup, type: date, start: 2024-01-02, end: 2024-01-03}}
      inner_mode: full_refresh
    state: {state}
"""

DDL = (
    "CREATE TABLE {} (id bigint PRIMARY KEY, name text, signup date NOT NULL,"
    " score integer NOT NULL CHECK (score >= 0))"
)
SECRET = "SECRET-CUSTOMER-4411"
SOURCE_ROWS = [(i, f"name {i}", f"2024-01-0{1 + i % 4}", i * 3) for i in range(1, 41)]
# A wrong copy of some source rows, and rows the source never had (in and out of the window).
STALE_ROWS = [(i, "stale", f"2024-01-0{1 + i % 4}", 0) for i in range(1, 41, 5)] + [
    (900, "gone", "2024-01-02", 1),
    (901, "gone", "2023-06-30", 1),
]

Rows = list[tuple[Any, ...]]


def _canon(rows: Any) -> Rows:
    return sorted((int(r[0]), r[1], str(r[2]), int(r[3])) for r in rows)


class PgSide:
    """One schema in the test database holding a customers table."""

    def __init__(self, dsn: str, rows: Rows) -> None:
        self.dsn = dsn
        self.schema = "t_" + uuid.uuid4().hex[:10]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
            conn.execute(DDL.format(f"{self.schema}.customers"))
            self.insert(rows, conn)

    def insert(self, rows: Rows, conn: psycopg.Connection[Any] | None = None) -> None:
        with conn or psycopg.connect(self.dsn, autocommit=True) as c:
            c.cursor().executemany(
                f"INSERT INTO {self.schema}.customers VALUES (%s, %s, %s, %s)", rows
            )

    def run(self, statement: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement.format(t=f"{self.schema}.customers"))

    def rows(self) -> Rows:
        with psycopg.connect(self.dsn) as conn:
            return _canon(conn.execute(f"SELECT * FROM {self.schema}.customers").fetchall())

    def drop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema}_audit CASCADE")


class SqliteSide:
    def __init__(self, path: Path, rows: Rows) -> None:
        self.dsn = f"sqlite:///{path}"
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute(DDL.format("customers").replace("bigint", "INTEGER"))
        self.insert(rows)

    def insert(self, rows: Rows) -> None:
        self.conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)", rows)

    def run(self, statement: str) -> None:
        self.conn.execute(statement.format(t="customers"))

    def rows(self) -> Rows:
        return _canon(self.conn.execute("SELECT * FROM customers").fetchall())


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("DPONE_AIRFLOW_MAPPING_ITEM", raising=False)
    monkeypatch.delenv("DPONE_AIRFLOW_RUN_IDENTITY", raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    monkeypatch.setenv("DPONE_EVIDENCE_DIR", str(tmp_path / "evidence"))
    return tmp_path


@pytest.fixture
def pg_sides(pg_dsn: str) -> Iterator[Callable[[Rows], PgSide]]:
    made: list[PgSide] = []

    def make(rows: Rows) -> PgSide:
        made.append(PgSide(pg_dsn, rows))
        return made[-1]

    yield make
    for side in made:
        side.drop()


def _write(tmp: Path, manifest: str, **fields: str) -> str:
    (tmp / "workloads.yaml").write_text(CATALOG)
    (tmp / "customers.yaml").write_text(manifest.format(**fields))
    return str(tmp / "workloads.yaml")


def _run(catalog: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    code = main(["run", "--catalog", catalog, "--workload", "customers", "--no-progress"])
    err = capsys.readouterr().err
    xcom = Path(catalog).parent / "xcom.json"
    assert xcom.exists(), f"exit {code}, no run result: {err}"
    result = json.loads(xcom.read_text())
    xcom.unlink()
    assert validate(result, load_schema("run-result.v1.schema.json")) == []
    return code, result, err


def _evidence(tmp: Path) -> list[dict[str, Any]]:
    folder = tmp / "evidence" / "fr-customers.customers"
    docs = [json.loads(p.read_text()) for p in sorted(folder.glob("internal.*.json"))]
    for doc in docs:
        assert validate(doc, load_schema("backfill-evidence.v1.schema.json")) == []
    return docs


def _refresh_twice(
    catalog: str, src: Any, dst: Any, method: str, env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refresh, change the source, refresh again: the second run must not be skipped."""
    code, result, err = _run(catalog, capsys)
    assert code == 0, err
    assert dst.rows() == src.rows() == _canon(SOURCE_ROWS)  # stale and target-only rows gone
    assert result["status"] == "passed" and result["mode"] == "internal"
    backfill = result["backfill"]
    assert backfill["run_key"] is None and backfill["campaign_complete"] is None
    assert (backfill["chunks_selected"], backfill["chunks_committed"]) == (1, 1)
    assert backfill["rows_written"] == len(SOURCE_ROWS)
    assert f"full refresh, 40 rows replaced the target via {method}" in err
    [evidence] = _evidence(env)
    [unit] = evidence["chunks"]
    assert unit["status"] == "committed" and unit["rows"] == 40
    # two Postgres sides compare in the chained form, any other two in the joined text
    scheme = "rowsum-pghash64-v1" if method == "executemany" else "rowsum-pgchain64-v1"
    assert unit["checksum"].startswith(f"{scheme}:40:")

    src.run("DELETE FROM {t} WHERE id <= 10")
    src.insert([(77, "new", "2024-01-04", 7)])
    code, result, err = _run(catalog, capsys)
    assert code == 0, err
    assert dst.rows() == src.rows() and len(dst.rows()) == 31
    assert result["backfill"]["chunks_committed"] == 1  # refreshed again, not skipped_resume
    assert len(_evidence(env)) == 2


@pytest.mark.postgres
def test_postgres_to_postgres_through_copy(
    env: Path,
    pg_dsn: str,
    pg_sides: Callable[[Rows], PgSide],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, dst = pg_sides(SOURCE_ROWS), pg_sides(STALE_ROWS)
    # another DSN string for the same server: the sink streams COPY instead of INSERT .. SELECT
    monkeypatch.setenv("DPONE_CONN_SRC", pg_dsn + "?application_name=dpone_src")
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    catalog = _write(
        env, FULL_REFRESH, src="src", src_schema=src.schema, dst="wh", dst_schema=dst.schema
    )
    _refresh_twice(catalog, src, dst, "copy-binary", env, capsys)


@pytest.mark.postgres
def test_postgres_same_database_insert_select(
    env: Path,
    pg_dsn: str,
    pg_sides: Callable[[Rows], PgSide],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, dst = pg_sides(SOURCE_ROWS), pg_sides(STALE_ROWS)
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    catalog = _write(
        env, FULL_REFRESH, src="wh", src_schema=src.schema, dst="wh", dst_schema=dst.schema
    )
    _refresh_twice(catalog, src, dst, "insert-select", env, capsys)


def test_sqlite_to_sqlite(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = SqliteSide(env / "src.db", SOURCE_ROWS)
    dst = SqliteSide(env / "dst.db", STALE_ROWS)
    monkeypatch.setenv("DPONE_CONN_SRC", src.dsn)
    monkeypatch.setenv("DPONE_CONN_DST", dst.dsn)
    catalog = _write(env, FULL_REFRESH, src="src", src_schema="main", dst="dst", dst_schema="main")
    _refresh_twice(catalog, src, dst, "executemany", env, capsys)


@pytest.mark.postgres
@pytest.mark.parametrize("same_db", [True, False])
def test_a_failed_refresh_leaves_the_target_unchanged(
    env: Path,
    pg_dsn: str,
    pg_sides: Callable[[Rows], PgSide],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    same_db: bool,
) -> None:
    src, dst = pg_sides(SOURCE_ROWS), pg_sides(STALE_ROWS)
    src.run("ALTER TABLE {t} DROP CONSTRAINT customers_score_check")
    src.insert([(666, SECRET, "2024-01-03", -1)])  # the target's CHECK refuses it, late
    before = dst.rows()
    monkeypatch.setenv("DPONE_CONN_SRC", pg_dsn + ("" if same_db else "?application_name=x"))
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    catalog = _write(
        env, FULL_REFRESH, src="src", src_schema=src.schema, dst="wh", dst_schema=dst.schema
    )
    code, result, err = _run(catalog, capsys)
    assert code == 1
    assert result["status"] == "failed" and result["error"]["code"] == "DPONE_SINK_FAILED"
    assert result["backfill"]["chunks_failed"] == 1 and result["backfill"]["rows_written"] == 0
    assert dst.rows() == before  # the DELETE of every row was rolled back with the insert
    last = json.loads(err.strip().splitlines()[-1])
    assert last["schema"] == "dpone.error.v1" and last["code"] == "DPONE_SINK_FAILED"
    assert "customers_score_check" in last["message"] and "rolled back" in last["message"]
    assert SECRET not in err and "-1)" not in err
    assert "full refresh, rolled back, target unchanged" in err
    [evidence] = _evidence(env)
    assert evidence["chunks"][0]["error_code"] == "DPONE_SINK_FAILED"


@pytest.mark.postgres
@pytest.mark.parametrize("ledger", ["audit_schema", "local_file"])
def test_inner_mode_full_refresh_of_a_one_chunk_window(
    env: Path,
    pg_dsn: str,
    pg_sides: Callable[[Rows], PgSide],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ledger: str,
) -> None:
    """Under the ledger (audit_schema: in the sink's own transaction); rows outside the window,
    which replace would keep, are deleted too; a second run is a resume no-op."""
    src, dst = pg_sides(SOURCE_ROWS), pg_sides(STALE_ROWS)
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    state = (
        f"{{backend: audit_schema, connection: wh, schema: {dst.schema}_audit}}"
        if ledger == "audit_schema"
        else f"{{backend: local_file, path: {env / 'ledger.json'}}}"
    )
    catalog = _write(
        env,
        ONE_CHUNK,
        src="wh",
        src_schema=src.schema,
        dst="wh",
        dst_schema=dst.schema,
        state=state,
    )
    code, result, err = _run(catalog, capsys)
    assert code == 0, err
    in_window = [r for r in SOURCE_ROWS if r[2] == "2024-01-02"]
    assert dst.rows() == _canon(in_window)  # 900 (in the window) and 901, 1.. (outside) gone
    assert result["backfill"]["run_key"].startswith("bf-")
    assert result["backfill"]["chunks_committed"] == 1 and result["backfill"]["rows_written"] == 10
    dst.insert([(902, "later", "2023-01-01", 1)])
    code, result, _ = _run(catalog, capsys)
    assert code == 0 and result["backfill"]["chunks_skipped_resume"] == 1
    assert len(dst.rows()) == 11  # a committed campaign is not moved again
