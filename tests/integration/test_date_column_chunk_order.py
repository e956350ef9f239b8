"""A timestamp chunk over a DATE column: SQLite compares the column's text with each bound's
('2024-01-01' < '2024-01-01 00:00:00'), so every day's rows would fall into the chunk before
theirs on the source and on the target alike, and the read-back and `dpone verify` would match
while the window's first day was never moved. Refused before any lease; `type: date` moves the
same rows. Postgres reads each bound as a date (its time of day dropped): hourly chunks over a
date column took the day before the window and never the window's last day; refused unless
every edge is at midnight. The real `dpone` executable; SQLite files, the real Postgres."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"

CATALOG = "schema: dpone.workload-catalog.v1\nworkloads:\n  days:\n    manifest: days.yaml\n"
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: days
    source: {{connection: src, table: {{name: src}}}}
    sink: {{connection: dst, table: {{name: dst}}, strategy: {{mode: backfill}}}}
    backfill:
      chunk: {chunk}
      inner_mode: replace
    state: {{backend: local_file, path: {ledger}}}
"""
TIMESTAMP = "{column: d, type: timestamp, start: '2024-01-01T00:00:00Z', end: '2024-01-03T00:00:00Z', unit: day}"
DATE = "{column: d, type: date, start: 2024-01-01, end: 2024-01-03}"


def _project(folder: Path, chunk: str) -> dict[str, str]:
    for name in ("src", "dst"):
        with sqlite3.connect(folder / f"{name}.db") as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {name} (d DATE NOT NULL, v INTEGER)")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {name}_d ON {name} (d)")
    with sqlite3.connect(folder / "src.db") as conn:
        conn.execute("DELETE FROM src")
        conn.executemany(
            "INSERT INTO src VALUES (?, ?)",
            [("2024-01-01", 1), ("2024-01-02", 2), ("2024-01-03", 3)],
        )
    (folder / "workloads.yaml").write_text(CATALOG)
    (folder / "days.yaml").write_text(MANIFEST.format(chunk=chunk, ledger=folder / "ledger"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update(
        DPONE_CONN_SRC=f"sqlite:///{folder / 'src.db'}",
        DPONE_CONN_DST=f"sqlite:///{folder / 'dst.db'}",
        DPONE_XCOM_PATH=str(folder / "xcom.json"),
    )
    return env


def _run(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DPONE), "run", "--catalog", "workloads.yaml", "--workload", "days", "--no-progress"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _target(folder: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(folder / "dst.db") as conn:
        return [(str(d), int(v)) for d, v in conn.execute("SELECT d, v FROM dst ORDER BY d")]


def test_a_timestamp_chunk_over_a_sqlite_date_column_is_refused(tmp_path: Path) -> None:
    done = _run(tmp_path, _project(tmp_path, TIMESTAMP))
    assert done.returncode == 3, done.stderr
    record = json.loads(done.stderr.strip().splitlines()[-1])
    assert record["code"] == "DPONE_PREFLIGHT_FAILED" and record["file"] is not None
    assert "type: date" in record["message"]
    assert _target(tmp_path) == [], "a row moved"
    assert (
        not (tmp_path / "ledger-time").exists()
        or "committed" not in (tmp_path / "ledger-time").read_text()
    )


def test_a_date_chunk_moves_the_window_exactly(tmp_path: Path) -> None:
    done = _run(tmp_path, _project(tmp_path, DATE))
    assert done.returncode == 0, done.stderr
    assert _target(tmp_path) == [("2024-01-01", 1), ("2024-01-02", 2)]


PG_MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: days
    source: {{connection: pg, table: {{schema: {s}, name: src}}}}
    sink: {{connection: pg, table: {{schema: {s}, name: dst}}, strategy: {{mode: backfill}}}}
    backfill:
      chunk: {chunk}
      inner_mode: replace
    state: {{backend: audit_schema, connection: pg, schema: {s}_audit}}
"""
HOURLY = (
    "{column: d, type: timestamp, start: '2024-03-10T12:00:00Z', end: '2024-03-12T12:00:00Z', "
    "step: 1, unit: hour}"
)
DAILY = (
    "{column: d, type: timestamp, start: '2024-03-10T00:00:00Z', end: '2024-03-12T00:00:00Z', "
    "unit: day}"
)


@pytest.mark.postgres
@pytest.mark.parametrize(("chunk", "refused"), [(HOURLY, True), (DAILY, False)])
def test_a_timestamp_chunk_over_a_postgres_date_column_needs_midnight_edges(
    tmp_path: Path, pg_dsn: str, chunk: str, refused: bool
) -> None:
    schema = "co_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("src", "dst"):
            conn.execute(f"CREATE TABLE {schema}.{table} (id bigint PRIMARY KEY, d date NOT NULL)")
        conn.execute(
            f"INSERT INTO {schema}.src SELECT g, date '2024-03-08' + g / 10 FROM "
            "generate_series(0, 59) g"
        )  # ten rows a day, 2024-03-08 .. 2024-03-13
    try:
        (tmp_path / "workloads.yaml").write_text(CATALOG)
        (tmp_path / "days.yaml").write_text(PG_MANIFEST.format(chunk=chunk, s=schema))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
        env.update(DPONE_CONN_PG=pg_dsn, DPONE_XCOM_PATH=str(tmp_path / "xcom.json"))
        done = _run(tmp_path, env)
        with psycopg.connect(pg_dsn) as conn:
            days = conn.execute(
                f"SELECT d::text, count(*) FROM {schema}.dst GROUP BY d ORDER BY d"
            ).fetchall()
        if refused:
            assert done.returncode == 3, done.stderr
            record = json.loads(done.stderr.strip().splitlines()[-1])
            assert record["code"] == "DPONE_PREFLIGHT_FAILED", record
            assert "type: date" in record["message"] and "midnight" in record["message"]
            assert days == [], "a row moved"
        else:
            assert done.returncode == 0, done.stderr
            assert days == [("2024-03-10", 10), ("2024-03-11", 10)]
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")
