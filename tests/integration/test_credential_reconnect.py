"""A connection reopened mid-run reads its credentials again (docs/security.md "Where a
connection's credentials may come from": never cached), for every connector and ledger store.

The shared servers trust 127.0.0.1 (a password is not checked there; the rotation of a checked
password is proved on a private SCRAM cluster in test_credential_rotation_pg.py), so these rotate
what they do act on: the DSN file rewritten to another database or another application_name.
MSSQL runs against the recording pyodbc double, whose connect strings are read back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from dpone import errors
from dpone.credentials.connections import resolve_dsn
from dpone.errors import DponeError

pytestmark = pytest.mark.postgres


def _rewrite(path: Path, dsn: str) -> None:
    path.write_text(dsn + "\n", encoding="utf-8")


def _terminate(pg_dsn: str, pid: int) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_postgres_connector_and_ledger_reread_the_dsn_file_when_they_reconnect(
    pg_dsn: str, tmp_path: Path
) -> None:
    from dpone.connectors.postgres import PgConnection
    from dpone.ledger.postgres import PostgresLedger
    from pg import drop_schema, fresh_schema_name

    file = tmp_path / "dsn"
    _rewrite(file, pg_dsn + "?application_name=before_rotation")
    dsn = resolve_dsn("wh", {"DPONE_CONN_WH_FILE": str(file)})
    shown = "SELECT current_setting('application_name')"
    schema = fresh_schema_name()
    table = PgConnection(dsn, "table t")
    ledger = PostgresLedger(dsn, schema)
    try:
        assert table.get().execute(shown).fetchone() == ("before_rotation",)
        assert ledger.list_campaigns() == []
        _rewrite(file, pg_dsn + "?application_name=after_rotation")
        _terminate(pg_dsn, table.get().info.backend_pid)
        assert ledger._conn is not None
        _terminate(pg_dsn, ledger._conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):
            table.get().execute("SELECT 1")
        table.forget_if_broken()
        assert table.get().execute(shown).fetchone() == ("after_rotation",)
        with pytest.raises(DponeError) as lost:
            ledger.list_campaigns()
        assert lost.value.code == errors.CONNECTION_FAILED
        assert ledger.list_campaigns() == []
        assert ledger._conn is not None
        assert ledger._conn.execute(shown).fetchone() == ("after_rotation",)
    finally:
        ledger.close()
        table.discard()
        drop_schema(pg_dsn, schema)


@pytest.fixture
def two_mysql_databases(mysql_dsn: str) -> Iterator[tuple[str, str]]:
    from dpone.connectors.mysql import parse_dsn

    names = (f"dpone_rot_a_{uuid.uuid4().hex[:8]}", f"dpone_rot_b_{uuid.uuid4().hex[:8]}")
    admin = pymysql.connect(**parse_dsn(mysql_dsn).connect_args(), autocommit=True)
    try:
        with admin.cursor() as cur:
            for name in names:
                cur.execute(f"CREATE DATABASE `{name}`")
        yield names
    finally:
        with admin.cursor() as cur:
            for name in names:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


def test_mysql_connection_rereads_the_dsn_file_when_it_reconnects(
    mysql_dsn: str, two_mysql_databases: tuple[str, str], tmp_path: Path
) -> None:
    from dpone.connectors.mysql import MysqlConnection

    first, second = two_mysql_databases
    server = mysql_dsn.rstrip("/")
    file = tmp_path / "dsn"
    _rewrite(file, f"{server}/{first}")
    db = MysqlConnection(resolve_dsn("m", {"DPONE_CONN_M_FILE": str(file)}), "t", sink=False)

    def database() -> Any:
        with db.get().cursor() as cur:
            cur.execute("SELECT DATABASE()")
            return cur.fetchone()[0]

    try:
        assert database() == first
        _rewrite(file, f"{server}/{second}")
        db.discard()  # what a lost connection does
        assert database() == second
        assert db.dsn.database == second
    finally:
        db.discard()


def test_mssql_ledger_and_connector_reread_the_password_file_when_they_reconnect(
    tmp_path: Path,
) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ledger"))
    from dpone.connectors.mssql import MssqlConnection
    from dpone.ledger.mssql import MssqlLedger
    from ledger_mssql_double import MssqlDouble

    secret = tmp_path / "password"
    secret.write_text("first-Pw1\n", encoding="utf-8")
    env = {
        "DPONE_CONN_MS": "mssql://dpone@double.invalid:1433/ledger",
        "DPONE_CONN_MS_PASSWORD_FILE": str(secret),
    }
    double = MssqlDouble(tmp_path)
    ledger = MssqlLedger(resolve_dsn("ms", env), driver=double)
    table = MssqlConnection(resolve_dsn("ms", env), "t", _Recorder(), autocommit=True)
    try:
        assert ledger.list_campaigns() == []
        table.get()
        secret.write_text("second-Pw2\n", encoding="utf-8")
        double.kill_connections()
        with pytest.raises(DponeError) as lost:
            ledger.list_campaigns()
        assert lost.value.code == errors.CONNECTION_FAILED
        assert ledger.list_campaigns() == []
        assert "second-Pw2" in double.connection_strings[-1]
        assert "first-Pw1" not in double.connection_strings[-1]
        table.discard()
        table.get()
        assert "PWD={second-Pw2}" in table.driver.connection_strings[-1]  # type: ignore[attr-defined]
    finally:
        ledger.close()


class _Recorder:
    """A pyodbc stand-in that records connect strings (the connector only connects here)."""

    class Error(Exception):
        pass

    def __init__(self) -> None:
        self.connection_strings: list[str] = []

    def connect(self, connection_string: str, autocommit: bool = False) -> Any:
        self.connection_strings.append(connection_string)
        return _Opened()


class _Opened:
    def add_output_converter(self, *args: object) -> None:
        pass

    def execute(self, *args: object) -> None:
        pass

    def close(self) -> None:
        pass
