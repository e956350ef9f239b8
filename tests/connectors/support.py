"""Test data shared by the connector tests: one orders table in every dialect, and its windows."""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
import uuid
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from dpone.connectors.base import ChunkWindow, canonical_text
from dpone.connectors.sqlite import to_sqlite
from psycopg import sql

OTHER_DATABASE = "dpone_test_connectors"


def with_param(dsn: str, key: str, value: str) -> str:
    """The same database under a different DSN string (so a sink takes the COPY path)."""
    return dsn + ("&" if "?" in dsn else "?") + f"{key}={value}"


def other_database_dsn(dsn: str) -> str:
    """The test DSN (a URL, as dpone requires) pointing at the second database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + OTHER_DATABASE))


class Pg:
    """One Postgres database for a test: unique schemas that are dropped afterwards."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.alt_dsn = with_param(dsn, "application_name", "dpone_alt")
        self.conn = psycopg.connect(dsn, autocommit=True)
        self._schemas: list[str] = []

    def schema(self, name: str | None = None) -> str:
        name = name or f"dpone_ct_{uuid.uuid4().hex[:12]}"
        self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        self._schemas.append(name)
        return name

    def run(self, query: str | sql.Composable, params: Sequence[Any] | None = None) -> None:
        self.conn.execute(query, params)  # type: ignore[arg-type]

    def rows(self, query: str | sql.Composable, params: Sequence[Any] | None = None) -> list[Any]:
        return self.conn.execute(query, params).fetchall()  # type: ignore[arg-type]

    def close(self) -> None:
        for name in self._schemas:
            with contextlib.suppress(psycopg.Error):
                self.conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )
        self.conn.close()


COLUMNS = ("id", "order_date", "created_at", "seq", "customer", "amount", "payload")
SECRET = "SECRET-ROW-VALUE-7f3a"
_CUSTOMERS = ['cust "quoted", ltd', "Zoë ✓ ünïcode", None, "semi;colon", "back\\slash\ttab\nnl"]

PG_DDL = """CREATE TABLE {} (
  id bigint PRIMARY KEY,
  order_date date NOT NULL,
  created_at timestamptz NOT NULL,
  seq integer NOT NULL,
  customer text,
  amount numeric(12,2),
  payload text
)"""
SQLITE_DDL = """CREATE TABLE {} (
  id INTEGER PRIMARY KEY,
  order_date TEXT NOT NULL,
  created_at TEXT NOT NULL,
  seq INTEGER NOT NULL,
  customer TEXT,
  amount NUMERIC,
  payload TEXT
)"""

WINDOWS = {
    "date": ChunkWindow("order_date", "date", "2024-01-02", "2024-01-04"),
    "timestamp": ChunkWindow(
        "created_at", "timestamp", "2024-01-02T00:00:00Z", "2024-01-05T00:00:00Z"
    ),
    "integer": ChunkWindow("seq", "integer", 200, 500),
}


def order_rows(n: int = 120) -> list[tuple[Any, ...]]:
    """Deterministic rows; some sit exactly on every window's lower and upper bound."""
    base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    rows = []
    for i in range(1, n + 1):
        micro = (i * 37_001) % 1_000_000 if i % 5 == 1 else 0
        rows.append(
            (
                i,
                dt.date(2024, 1, 1) + dt.timedelta(days=i % 6),
                base + dt.timedelta(hours=i * 3, microseconds=micro),
                i * 10,
                _CUSTOMERS[i % 5],
                Decimal(i * 125) / Decimal(100) if i % 7 else None,
                "p" * (i % 40) + ('"' if i % 3 == 0 else ""),
            )
        )
    return rows


ROWS = order_rows()


def in_window(row: Sequence[Any], window: ChunkWindow) -> bool:
    value = row[COLUMNS.index(window.column)]
    if window.type == "date":
        return (
            dt.date.fromisoformat(str(window.lower))
            <= value
            < dt.date.fromisoformat(str(window.upper))
        )
    if window.type == "timestamp":
        lower = dt.datetime.fromisoformat(str(window.lower))
        upper = dt.datetime.fromisoformat(str(window.upper))
        return bool(lower <= value < upper)
    return bool(window.lower <= value < window.upper)  # type: ignore[operator]


def expected(window: ChunkWindow, rows: Iterable[Sequence[Any]] = ROWS) -> list[tuple[Any, ...]]:
    return canon([r for r in rows if in_window(r, window)])


def canon(rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Rows as canonical text tuples sorted by id: comparable across database kinds."""
    return sorted((tuple(canonical_text(v) for v in row) for row in rows), key=lambda r: int(r[0]))


def pg_table(schema: str, name: str = "orders") -> sql.Identifier:
    return sql.Identifier(schema, name)


def create_pg(
    pg: Pg,
    schema: str,
    name: str = "orders",
    rows: Sequence[Sequence[Any]] = ROWS,
    ddl: str = PG_DDL,
) -> None:
    table = pg_table(schema, name)
    pg.run(sql.SQL(ddl).format(table))  # type: ignore[arg-type]
    if rows:
        with (
            pg.conn.cursor() as cur,
            cur.copy(
                sql.SQL("COPY {} ({}) FROM STDIN").format(
                    table, sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
                )
            ) as copy,
        ):
            for row in rows:
                copy.write_row(row)


def pg_rows(
    pg: Pg, schema: str, name: str = "orders", window: ChunkWindow | None = None
) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(map(sql.Identifier, COLUMNS)), pg_table(schema, name)
    )
    found = pg.rows(query)
    if window is not None:
        found = [r for r in found if in_window(r, window)]
    return canon(found)


def create_sqlite(
    conn: sqlite3.Connection,
    name: str = "orders",
    rows: Sequence[Sequence[Any]] = ROWS,
    ddl: str = SQLITE_DDL,
) -> None:
    conn.execute(ddl.format('"' + name.replace('"', '""') + '"'))
    marks = ", ".join("?" for _ in COLUMNS)
    quoted = '"' + name.replace('"', '""') + '"'
    conn.executemany(
        f"INSERT INTO {quoted} VALUES ({marks})", [tuple(to_sqlite(v) for v in r) for r in rows]
    )


def sqlite_rows(conn: sqlite3.Connection, name: str = "orders") -> list[tuple[Any, ...]]:
    quoted = '"' + name.replace('"', '""') + '"'
    return canon(conn.execute(f"SELECT {', '.join(COLUMNS)} FROM {quoted}").fetchall())
