"""Connections handed from one connector to the next within a run (dpone.lifecycle.sessions).

On the real Postgres:
- a mapped item opens four connections (the ledger's, the source's, the gate's sibling and the
  sink's), not six: the preflight's read-only ones are taken over by the source and the sink;
  every connection the run opened is closed when it returns;
- a handed-over connection takes the read-only mode of its new connector: on for a read-only
  one, back to the session's own default (the DSN's, kept) for a read-write one;
- nothing is handed over outside a run's scope, nor a connection inside a transaction, nor one
  whose session ended while it waited (a new one is opened); the scope's end closes what is
  left idle.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone.cli import main
from dpone.connectors.postgres import PgConnection
from dpone.lifecycle.sessions import shared_sessions

pytestmark = pytest.mark.postgres

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow:
      image: example/dpone:1
      dag_id: orders_sessions
      mapping: {{mode: summary, max_items: 3, max_active: 3, pool: dpone_test}}
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
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-10}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit, require_distributed_lock: true}}
"""


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    schema = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, "
                "order_date date NOT NULL, amount integer NOT NULL)"
            )
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 9), g % 1000 "
            "FROM generate_series(1, 900) g"
        )
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    for key in ("DPONE_AIRFLOW_MAPPING_ITEM", "DPONE_AIRFLOW_RUN_IDENTITY", "LOG_FORMAT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    (tmp_path / "workloads.yaml").write_text(CATALOG.format())
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema))
    yield str(tmp_path / "workloads.yaml")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def test_a_mapped_item_opens_four_connections_and_closes_them_all(
    project: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[psycopg.Connection[Any]] = []
    connect = psycopg.Connection.connect

    def counted(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = connect(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(psycopg.Connection, "connect", counted)
    monkeypatch.setattr(psycopg, "connect", counted)
    base = ["run", "--catalog", project, "--workload", "orders", "--process", "orders"]
    assert main([*base, "--item", "1"]) == 0
    result = json.loads((tmp_path / "xcom.json").read_text())
    assert result["backfill"]["chunks_committed"] == 3
    # the ledger's, the source's, the read-back gate's sibling and the sink's
    assert len(opened) == 4
    assert all(conn.closed for conn in opened)


def _pid(conn: PgConnection) -> int:
    return conn.get().info.backend_pid


def _read_only(conn: PgConnection) -> str:
    row = conn.get().execute("SHOW default_transaction_read_only").fetchone()
    assert row is not None
    return str(row[0])


def _alive(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return bool(row and row[0])


def test_a_read_only_session_handed_to_a_writer_is_read_write_again(pg_dsn: str) -> None:
    with shared_sessions():
        reader = PgConnection(pg_dsn, "reader")
        reader.read_only = True
        pid = _pid(reader)
        assert _read_only(reader) == "on"
        reader.release()
        writer = PgConnection(pg_dsn, "writer")
        assert _pid(writer) == pid
        assert _read_only(writer) == "off"
        writer.release()
        again = PgConnection(pg_dsn, "reader again")
        again.read_only = True
        assert _pid(again) == pid
        assert _read_only(again) == "on"
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            again.get().execute(f"CREATE SCHEMA dpone_never_{uuid.uuid4().hex[:8]}")
        again.release()
    assert not _alive(pg_dsn, pid)  # the scope's end closed it


def test_a_writer_keeps_the_read_only_default_its_dsn_asks_for(pg_dsn: str) -> None:
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, options="-c default_transaction_read_only=on")
    with shared_sessions():
        reader = PgConnection(dsn, "reader")
        reader.read_only = True
        pid = _pid(reader)
        reader.release()
        writer = PgConnection(dsn, "writer")
        assert _pid(writer) == pid
        assert _read_only(writer) == "on"  # the DSN's default, not dpone's read-write
        writer.release()


def test_nothing_is_handed_over_outside_a_run_or_from_inside_a_transaction(pg_dsn: str) -> None:
    first = PgConnection(pg_dsn, "first")
    pid = _pid(first)
    first.release()
    second = PgConnection(pg_dsn, "second")
    assert _pid(second) != pid
    second.release()
    with shared_sessions():
        busy = PgConnection(pg_dsn, "busy")
        busy_pid = _pid(busy)
        busy.get().execute("BEGIN")
        busy.release()  # a transaction is open: closed, not handed over
        other = PgConnection(pg_dsn, "other")
        assert _pid(other) != busy_pid
        other.release()
    assert not _alive(pg_dsn, pid) and not _alive(pg_dsn, busy_pid)


def test_a_session_that_ended_while_idle_is_replaced_by_a_new_one(pg_dsn: str) -> None:
    with shared_sessions():
        first = PgConnection(pg_dsn, "first")
        pid = _pid(first)
        first.release()
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 10
        while _alive(pg_dsn, pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = PgConnection(pg_dsn, "second")
        assert _pid(second) != pid
        assert _read_only(second) == "off"
        second.release()
