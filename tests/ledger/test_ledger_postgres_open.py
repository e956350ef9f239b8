"""Opening the Postgres ledger: the session set up and the schema checked in two statements.

Every pod opens the ledger, a no-op item included: the session's settings (the text forms a chunk
written in the ledger's transaction depends on, the server-side limits that free a lost pod's
locks) ride in the first statement together with the schema probe, outside any transaction, and
the version is the second. A reconnect after a loss sets the session up again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.postgres import PostgresLedger
from dpone.ledger.sql import SCHEMA_VERSION

pytestmark = pytest.mark.postgres

SESSION = {
    "TimeZone": "UTC",
    "DateStyle": "ISO, YMD",
    "idle_in_transaction_session_timeout": "1min",
    "statement_timeout": "1h",
}


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement a psycopg connection sends from here on, in order."""
    sent: list[str] = []
    execute = psycopg.Connection.execute

    def recorded(self: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", recorded)
    yield sent


def session_of(store: PostgresLedger) -> dict[str, str]:
    conn = store._connection()
    with conn.transaction():
        return {
            name: str(conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0])  # type: ignore[index]
            for name in SESSION
        }


def test_an_existing_ledger_opens_in_two_statements_outside_a_transaction(
    pg_dsn: str, pg_schema: str, statements: list[str]
) -> None:
    PostgresLedger(pg_dsn, pg_schema).close()  # creates the schema
    statements.clear()
    store = PostgresLedger(pg_dsn, pg_schema)
    try:
        assert len(statements) == 2, statements
        assert "set_config" in statements[0] and "to_regclass" in statements[0]
        assert "max(version)" in statements[1]
        conn = store._connection()
        assert not conn.autocommit  # every later call runs in its own transaction
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert session_of(store) == SESSION
    finally:
        store.close()


def test_a_reconnect_sets_the_session_up_again(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresLedger(pg_dsn, pg_schema)
    try:
        first = store._connection()
        first.close()  # as a lost connection is, before the next call reopens it
        assert store._connection() is not first
        assert session_of(store) == SESSION
    finally:
        store.close()


def test_no_schema_yet_is_one_statement_and_an_empty_ledger(
    pg_dsn: str, pg_schema: str, statements: list[str]
) -> None:
    store = PostgresLedger(pg_dsn, pg_schema, create=False)
    try:
        assert len(statements) == 1 and store.absent
        assert store.list_campaigns() == []
    finally:
        store.close()


@pytest.mark.parametrize("create", [True, False])
def test_another_tools_schema_version_table_is_refused(
    pg_dsn: str, pg_schema: str, create: bool
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        conn.execute(f"CREATE TABLE {pg_schema}.schema_version (version text)")
    with pytest.raises(DponeError) as refused:
        PostgresLedger(pg_dsn, pg_schema, create=create)
    assert refused.value.code == errors.LEDGER_UNAVAILABLE
    assert "not a dpone audit schema's" in refused.value.message


def test_a_newer_schema_is_refused(pg_dsn: str, pg_schema: str) -> None:
    PostgresLedger(pg_dsn, pg_schema).close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {pg_schema}.schema_version (version) VALUES (%s)", (SCHEMA_VERSION + 1,)
        )
    with pytest.raises(DponeError) as refused:
        PostgresLedger(pg_dsn, pg_schema)
    assert refused.value.code == errors.LEDGER_UNAVAILABLE
    assert "upgrade dpone" in refused.value.message


def test_a_connection_left_with_a_command_in_progress_is_replaced(
    pg_dsn: str, pg_schema: str
) -> None:
    """A send that failed as the server went away can leave libpq ACTIVE without marking the
    connection broken; every later call on it would fail ("another command is already in
    progress"). The next call opens a new connection and works."""
    store = PostgresLedger(pg_dsn, pg_schema)
    try:
        stuck = store._connection()
        stuck.pgconn.send_query(b"SELECT 1")  # a command whose result nobody reads
        assert stuck.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE
        assert store.list_campaigns() == []
        assert store._connection() is not stuck and stuck.closed
        assert session_of(store) == SESSION
    finally:
        store.close()
