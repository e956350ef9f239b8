"""The sink fence (issue 9): a chunk's sink transaction claims its fence row with the ledger's
attempt before it writes, so a stale attempt can never commit rows after a newer one claimed the
chunk. Postgres and SQLite for real; MSSQL through the recording double (UNVERIFIED live).
Multi-process stalls with real `dpone run` processes are in tests/chaos/test_chaos_fence.py.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable

import psycopg
import pytest
import sqlglot
from dpone import errors
from dpone.connectors import SinkOptions, SinkSpec, SourceSpec, TableRef
from dpone.connectors.base import ChunkFence
from dpone.connectors.mssql import MssqlSink
from dpone.connectors.postgres import PostgresSink, PostgresSource
from dpone.connectors.sqlite import SqliteSink, SqliteSource
from dpone.errors import DponeError
from psycopg import sql

from .mssql_double import Engine, Table
from .support import ROWS, WINDOWS, Pg, create_pg, create_sqlite, expected

MakeDb = Callable[[str], tuple[str, sqlite3.Connection]]
WINDOW = WINDOWS["date"]
RUN_KEY = "bf-0123456789abcdef01234567"


def fence(attempt: int, campaign: str = RUN_KEY, chunk: int = 3) -> ChunkFence:
    return ChunkFence(campaign, chunk, attempt)


def pg_pair(pg: Pg) -> tuple[str, PostgresSource, PostgresSink]:
    schema = pg.schema()
    create_pg(pg, schema, "src")
    create_pg(pg, schema, "dst", rows=())
    source = PostgresSource(SourceSpec("wh", TableRef(schema, "src")), pg.dsn)
    sink = PostgresSink(SinkSpec("wh", TableRef(schema, "dst"), "replace"), pg.dsn, SinkOptions())
    return schema, source, sink


def pg_count(pg: Pg, schema: str) -> int:
    return int(pg.rows(sql.SQL("SELECT count(*) FROM {}.dst").format(sql.Identifier(schema)))[0][0])


def test_postgres_a_superseded_attempt_is_rolled_back(pg: Pg) -> None:
    schema, source, sink = pg_pair(pg)
    with source, sink:
        sink.write_chunk(source, WINDOW, fence=fence(2))
        pg.run(sql.SQL("DELETE FROM {}.dst").format(sql.Identifier(schema)))
        with pytest.raises(DponeError) as refused:
            sink.write_chunk(source, WINDOW, fence=fence(1))
        assert refused.value.code == errors.CHUNK_LEASE_LOST
        assert "superseded by attempt 2" in refused.value.message
        assert "rolled back" in refused.value.message
        assert pg_count(pg, schema) == 0  # the stale attempt's delete+insert never committed
        sink.write_chunk(source, WINDOW, fence=fence(3))  # a newer attempt goes on
    assert pg_count(pg, schema) == len(expected(WINDOW))
    stored = pg.rows(
        sql.SQL("SELECT campaign, chunk_index, attempt FROM {}.dpone_chunk_fence").format(
            sql.Identifier(schema)
        )
    )
    assert stored == [(RUN_KEY, 3, 3)]


def test_postgres_campaigns_and_chunks_never_share_a_fence_row(pg: Pg) -> None:
    schema, source, sink = pg_pair(pg)
    with source, sink:
        sink.write_chunk(source, WINDOW, fence=fence(5))
        sink.write_chunk(source, WINDOW, fence=fence(1, campaign="bf-other-campaign"))
        sink.write_chunk(source, WINDOW, fence=fence(1, chunk=4))
    rows = pg.rows(
        sql.SQL(
            "SELECT campaign, chunk_index, attempt FROM {}.dpone_chunk_fence ORDER BY 1, 2"
        ).format(sql.Identifier(schema))
    )
    assert rows == [(RUN_KEY, 3, 5), (RUN_KEY, 4, 1), ("bf-other-campaign", 3, 1)]


def test_postgres_an_open_stale_transaction_makes_the_newer_attempt_wait(
    pg: Pg, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale attempt still inside its transaction holds the fence row: the newer one waits at
    most DPONE_FENCE_LOCK_TIMEOUT (then BUSY, nothing written) and goes on once it ends."""
    schema, source, sink = pg_pair(pg)
    with source, sink:
        sink.write_chunk(source, WINDOW, fence=fence(1))  # creates the table and the row
    table = sql.Identifier(schema, "dpone_chunk_fence")
    stale = psycopg.connect(pg.dsn)
    stale.execute(
        sql.SQL("UPDATE {} SET attempt = attempt WHERE campaign = %s").format(table), (RUN_KEY,)
    )  # an open transaction holding the row lock, like a frozen attempt
    monkeypatch.setenv("DPONE_FENCE_LOCK_TIMEOUT", "1")
    pg.run(sql.SQL("DELETE FROM {}.dst").format(sql.Identifier(schema)))
    _, source2, sink2 = (
        schema,
        PostgresSource(source.spec, pg.dsn),
        PostgresSink(sink.spec, pg.dsn, SinkOptions()),
    )
    with source2, sink2:
        started = time.monotonic()
        with pytest.raises(DponeError) as busy:
            sink2.write_chunk(source2, WINDOW, fence=fence(2))
        assert busy.value.code == errors.CHUNK_BUSY and busy.value.retryable
        assert 0.9 < time.monotonic() - started < 10
        assert pg_count(pg, schema) == 0
        monkeypatch.setenv("DPONE_FENCE_LOCK_TIMEOUT", "30")
        threading.Timer(1.0, stale.rollback).start()
        sink2.write_chunk(source2, WINDOW, fence=fence(2))  # waits for the stale one, then goes
    stale.close()
    assert pg_count(pg, schema) == len(expected(WINDOW))


def test_sqlite_a_superseded_attempt_is_rolled_back(sqlite_db: MakeDb) -> None:
    dsn, conn = sqlite_db("fence")
    create_sqlite(conn, "src")
    create_sqlite(conn, "dst", rows=())
    source = SqliteSource(SourceSpec("db", TableRef(None, "src")), dsn)
    sink = SqliteSink(SinkSpec("db", TableRef(None, "dst"), "replace"), dsn, SinkOptions())
    with source, sink:
        sink.write_chunk(source, WINDOW, fence=fence(2))
        conn.execute("DELETE FROM dst")
        with pytest.raises(DponeError) as refused:
            sink.write_chunk(source, WINDOW, fence=fence(1))
        assert refused.value.code == errors.CHUNK_LEASE_LOST
    assert conn.execute("SELECT count(*) FROM dst").fetchone() == (0,)
    assert conn.execute(
        "SELECT campaign, chunk_index, attempt FROM dpone_chunk_fence"
    ).fetchall() == [(RUN_KEY, 3, 2)]


def test_mssql_fence_statements_and_refusal(sqlite_db: MakeDb) -> None:
    dsn, conn = sqlite_db("src")
    create_sqlite(conn, "src")
    source = SqliteSource(SourceSpec("db", TableRef(None, "src")), dsn)
    engine = Engine()
    engine.tables["dbo.orders"] = Table(
        {
            "id": "int",
            "order_date": "date",
            "created_at": "datetime2",
            "seq": "int",
            "customer": "nvarchar",
            "amount": "decimal",
            "payload": "nvarchar",
        }
    )
    spec = SinkSpec("wh", TableRef("dbo", "orders"), "replace")
    sink = MssqlSink(spec, "mssql://u:p@h/db", SinkOptions(), driver=engine)  # type: ignore[arg-type]
    with source:
        sink.write_chunk(source, WINDOW, fence=fence(2))
        assert engine.tables["dbo.dpone_chunk_fence"].rows[0]["attempt"] == 2
        written = len(engine.tables["dbo.orders"].rows)
        assert written == len(expected(WINDOW, ROWS))
        engine.tables["dbo.orders"].rows.clear()
        with pytest.raises(DponeError) as refused:
            sink.write_chunk(source, WINDOW, fence=fence(1))
        assert refused.value.code == errors.CHUNK_LEASE_LOST
        assert engine.tables["dbo.orders"].rows == []  # rolled back before any write
        sink.write_chunk(source, WINDOW, fence=fence(4))
    assert engine.tables["dbo.dpone_chunk_fence"].rows[0]["attempt"] == 4
    statements = engine.statements()
    for text in statements:
        sqlglot.parse_one(text, read="tsql")
    [select] = {
        s for s in statements if "dpone_chunk_fence" in s and s.startswith("SELECT attempt")
    }
    assert "WITH (UPDLOCK, HOLDLOCK)" in select  # the row lock held to commit
    assert any(s.startswith("SET LOCK_TIMEOUT") for s in statements)
    sink.close()


def _create_fence_tables_at_once(pg: Pg, schema: str, racers: int) -> list[BaseException]:
    """``racers`` sinks of one target create its fence table at the same moment."""
    sinks = [
        PostgresSink(SinkSpec("wh", TableRef(schema, "dst"), "replace"), pg.dsn, SinkOptions())
        for _ in range(racers)
    ]
    connections = [psycopg.connect(pg.dsn) for _ in sinks]
    start = threading.Barrier(racers)
    failures: list[BaseException] = []

    def create(sink: PostgresSink, conn: psycopg.Connection) -> None:  # type: ignore[type-arg]
        start.wait()
        try:
            sink._ensure_fence_table(conn)
            conn.commit()
        except BaseException as exc:
            failures.append(exc)

    pairs = zip(sinks, connections, strict=True)
    threads = [threading.Thread(target=create, args=pair) for pair in pairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for conn in connections:
        conn.close()
    return failures


def test_postgres_sinks_creating_the_fence_table_at_once_all_go_on(pg: Pg) -> None:
    """Workers of one run creating the fence table at the same moment: concurrent `CREATE
    TABLE IF NOT EXISTS` can lose a catalog race (the row type's name: DuplicateObject,
    SQLSTATE 42710); the losers find the table made and go on, none fails its chunk."""
    for _ in range(10):
        schema = pg.schema()
        assert _create_fence_tables_at_once(pg, schema, 6) == []
        table = sql.Identifier(schema, "dpone_chunk_fence")
        assert pg.rows(sql.SQL("SELECT count(*) FROM {}").format(table)) == [(0,)]
