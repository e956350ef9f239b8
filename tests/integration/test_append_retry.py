"""An append retried after its data committed and its completion did not: never twice.

With the ledger apart from the sink (the fenced placement) a process can end between the sink's
commit and the ledger's. A replace or merge retry rewrites the chunk; an append retry would add
its rows a second time. The real `dpone` executable is killed at that point
(``DPONE_TEST_FAULT=data_committed``), run again once its lease expired, and the target is then
counted in SQL: each day's rows once, the interrupted chunk failed with
DPONE_APPEND_ALREADY_WRITTEN (not retryable), the others committed. Postgres, MariaDB and
SQLite sinks; a Postgres source and ledger.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from dpone import errors
from dpone.connectors.mysql import parse_dsn

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"
LEASE_S = 5

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  appends:
    manifest: appends.yaml
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: appends
    source: {{connection: src, table: {{schema: {schema}, name: events}}}}
    sink:
      connection: dst
      table: {target}
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: d, type: date, start: 2024-01-01, end: 2024-01-04}}
      inner_mode: append
      lease_seconds: {lease}
    state: {{backend: audit_schema, connection: led, schema: {schema}_audit}}
"""
DDL = "CREATE TABLE {} (id integer, d date NOT NULL, v integer)"


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = "ap_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        conn.execute(DDL.format(f"{name}.events"))
        conn.execute(
            f"INSERT INTO {name}.events SELECT g, date '2024-01-01' + (g % 3), g "
            "FROM generate_series(1, 30) g"
        )
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {name}_audit CASCADE")


def _postgres_sink(pg_dsn: str, schema: str, _: Path) -> tuple[str, str, Any]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL.format(f"{schema}.target"))

    def per_day() -> list[tuple[Any, ...]]:
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(
                f"SELECT d::text, count(*) FROM {schema}.target GROUP BY d ORDER BY d"
            ).fetchall()
        return [tuple(r) for r in rows]

    return pg_dsn, f"{{schema: {schema}, name: target}}", per_day


def _mysql_sink(mysql_dsn: str, schema: str, _: Path) -> tuple[str, str, Any]:
    server = pymysql.connect(**parse_dsn(mysql_dsn).connect_args(), autocommit=True)
    with server.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{schema}`")
        cur.execute(DDL.format(f"`{schema}`.`target`"))
    server.close()
    dsn = mysql_dsn.split("?", 1)[0].rstrip("/") + "/" + schema

    def per_day() -> list[tuple[Any, ...]]:
        conn = pymysql.connect(**parse_dsn(dsn).connect_args())
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT CAST(d AS CHAR), count(*) FROM target GROUP BY d ORDER BY d")
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()

    return dsn, f"{{schema: {schema}, name: target}}", per_day


def _sqlite_sink(_: str, schema: str, root: Path) -> tuple[str, str, Any]:
    path = root / "target.db"
    with sqlite3.connect(path) as conn:
        conn.execute(DDL.format("target"))

    def per_day() -> list[tuple[Any, ...]]:
        with sqlite3.connect(path) as conn:
            return conn.execute("SELECT d, count(*) FROM target GROUP BY d ORDER BY d").fetchall()

    return f"sqlite:///{path}", "{name: target}", per_day


SINKS = {"postgres": _postgres_sink, "mysql": _mysql_sink, "sqlite": _sqlite_sink}


@pytest.mark.parametrize("kind", sorted(SINKS))
def test_an_append_whose_completion_was_lost_is_not_appended_again(
    kind: str, pg_dsn: str, mysql_dsn: str, schema: str, tmp_path: Path
) -> None:
    server = mysql_dsn if kind == "mysql" else pg_dsn
    dst, target, per_day = SINKS[kind](server, schema, tmp_path)
    try:
        (tmp_path / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
        manifest = MANIFEST.format(schema=schema, target=target, lease=LEASE_S)
        (tmp_path / "appends.yaml").write_text(manifest, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
        env.update(
            DPONE_CONN_SRC=pg_dsn,
            DPONE_CONN_DST=dst,
            DPONE_CONN_LED=pg_dsn,  # another connection than the sink's: the fenced placement
            DPONE_XCOM_PATH=str(tmp_path / "result.json"),
        )
        argv = [str(DPONE), "run", "--catalog", "workloads.yaml", "--workload", "appends"]

        def run(**extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*argv, "--no-progress"],
                cwd=tmp_path,
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )

        killed = run(DPONE_TEST_FAULT="data_committed:1")
        assert killed.returncode == -9, killed.stderr  # SIGKILL
        assert per_day() == [("2024-01-01", 10)]  # chunk 1's rows committed, no completion
        time.sleep(LEASE_S + 1.5)  # the killed attempt's lease expires

        again = run()
        assert again.returncode == 1, again.stderr
        record = json.loads(again.stderr.strip().splitlines()[-1])
        assert record["code"] == errors.APPEND_ALREADY_WRITTEN, record
        assert record["retryable"] is False and "chunk 1" in record["message"], record
        assert per_day() == [("2024-01-01", 10), ("2024-01-02", 10), ("2024-01-03", 10)]
        result = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
        assert result["status"] == "failed"
        assert result["backfill"]["chunks_committed"] == 2

        # Run after run, the chunk stays refused and nothing is appended twice.
        assert run().returncode == 1
        assert per_day() == [("2024-01-01", 10), ("2024-01-02", 10), ("2024-01-03", 10)]
    finally:
        if kind == "mysql":
            server_conn = pymysql.connect(**parse_dsn(mysql_dsn).connect_args(), autocommit=True)
            with server_conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
            server_conn.close()
