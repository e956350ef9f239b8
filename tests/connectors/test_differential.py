"""Differential property test of a whole chunk move: random schemas and rows go through each
connector pair (Postgres, MariaDB, SQLite, both directions and same-kind), with target columns as
wide as the source's or narrower; then source and target are read back with the plain drivers and
compared row by row in Python (never with dpone's checksum). Every move must either fail (the
read-back gate, or the sink refusing a value) or leave the target equal to the source. A move whose
target types are as wide as the source's must commit (the gate raises no false alarm).

DPONE_PROPERTY_EXAMPLES raises the number of examples per pair (default 10).
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from dpone.connectors.base import ChunkWindow, SinkOptions, SinkSpec, SourceSpec, TableRef
from dpone.connectors.factory import open_sink, open_source
from dpone.connectors.mysql import parse_dsn
from dpone.connectors.sqlite import to_sqlite
from dpone.errors import DponeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .mysql_support import My

pytestmark = pytest.mark.postgres

EXAMPLES = int(os.environ.get("DPONE_PROPERTY_EXAMPLES", "10"))
KINDS = ("postgres", "mysql", "sqlite")
WINDOW = ChunkWindow("id", "integer", 0, 1_000_000)


@dataclass(frozen=True)
class Column:
    """One moved column: its kind (int, dec, text, ts) and its width parameters."""

    name: str
    kind: str
    precision: int = 0  # dec: digits; text: length; ts: fractional digits
    scale: int = 0  # dec only

    def ddl(self, db: str) -> str:
        if self.kind == "int":
            return {"postgres": "bigint", "mysql": "BIGINT", "sqlite": "INTEGER"}[db]
        if db == "sqlite":
            return "TEXT"  # SQLite keeps what it is given; dpone writes decimals and times as text
        if self.kind == "dec":
            return (
                "numeric" if db == "postgres" else "DECIMAL"
            ) + f"({self.precision},{self.scale})"
        if self.kind == "text":
            return f"varchar({self.precision})"
        return ("timestamp" if db == "postgres" else "DATETIME") + f"({self.precision})"


WIDE = {"int": (0, 0), "dec": (18, 6), "text": (24, 0), "ts": (6, 0)}


def _values(kind: str) -> st.SearchStrategy[Any]:
    if kind == "int":
        return st.integers(-(2**53), 2**53)
    if kind == "dec":  # at most 14 significant digits: exact as a float too
        return st.decimals(
            min_value=Decimal("-99999999.999999"),
            max_value=Decimal("99999999.999999"),
            places=6,
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "text":
        return st.text(
            st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=("Cs",)),
            max_size=24,
        )
    return st.datetimes(dt.datetime(1971, 1, 1), dt.datetime(2037, 12, 31))


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Column], list[Column], list[tuple[Any, ...]]]:
    kinds = draw(st.lists(st.sampled_from(("int", "dec", "text", "ts")), min_size=1, max_size=4))
    source = [Column(f"c{i}", k, *WIDE[k]) for i, k in enumerate(kinds)]
    target = []
    for col in source:
        if col.kind == "dec":
            target.append(
                Column(
                    col.name,
                    "dec",
                    draw(st.sampled_from((18, 10))),
                    draw(st.sampled_from((6, 2, 0))),
                )
            )
        elif col.kind == "text":
            target.append(Column(col.name, "text", draw(st.sampled_from((24, 4)))))
        elif col.kind == "ts":
            target.append(Column(col.name, "ts", draw(st.sampled_from((6, 3, 0)))))
        else:
            target.append(col)
    ids = draw(st.lists(st.integers(1, 999_999), max_size=8, unique=True))
    rows = [(i, *(draw(st.none() | _values(c.kind)) for c in source)) for i in ids]
    return source, target, rows


# --- plain-driver access to the three databases ---------------------------------------------------
@dataclass
class Db:
    kind: str
    dsn: str
    execute: Callable[[str, list[tuple[Any, ...]] | None], list[tuple[Any, ...]]]
    schema: str | None

    def create(self, name: str, columns: list[Column], rows: list[tuple[Any, ...]]) -> TableRef:
        q = '"' if self.kind != "mysql" else "`"
        cols = ", ".join(f"{q}{c.name}{q} {c.ddl(self.kind)}" for c in columns)
        table = f"{q}{self.schema}{q}.{q}{name}{q}" if self.schema else f"{q}{name}{q}"
        key = {"postgres": "bigint", "mysql": "BIGINT", "sqlite": "INTEGER"}[self.kind]
        self.execute(f"CREATE TABLE {table} ({q}id{q} {key} PRIMARY KEY, {cols})", None)
        if rows:
            marks = ", ".join(
                "?" if self.kind == "sqlite" else "%s" for _ in range(len(columns) + 1)
            )
            if self.kind == "sqlite":
                rows = [tuple(to_sqlite(v) for v in row) for row in rows]
            self.execute(f"INSERT INTO {table} VALUES ({marks})", rows)
        return TableRef(self.schema, name)

    def read(self, table: TableRef, columns: list[Column]) -> list[tuple[Any, ...]]:
        q = '"' if self.kind != "mysql" else "`"
        names = ", ".join(f"{q}{c}{q}" for c in ["id", *(c.name for c in columns)])
        where = (
            f"{q}{table.schema}{q}.{q}{table.name}{q}" if table.schema else f"{q}{table.name}{q}"
        )
        got = self.execute(f"SELECT {names} FROM {where} ORDER BY {q}id{q}", None)
        return [
            (int(row[0]), *(_plain(c.kind, v) for c, v in zip(columns, row[1:], strict=True)))
            for row in got
        ]


def _plain(kind: str, value: Any) -> Any:
    """A driver's value as a Python value comparable across databases (the oracle's own form)."""
    if value is None:
        return None
    if kind == "int":
        return int(value)
    if kind == "dec":
        return Decimal(repr(value)) if isinstance(value, float) else Decimal(str(value))
    if kind == "ts":
        return dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return str(value)


@pytest.fixture
def dbs(pg_dsn: str, mysql_dsn: str, tmp_path: Path) -> Iterator[dict[str, Db]]:
    schema = "dpone_pt_" + uuid.uuid4().hex[:10]
    pg = psycopg.connect(pg_dsn, autocommit=True)
    pg.execute(f'CREATE SCHEMA "{schema}"')
    my = My(mysql_dsn)
    database = my.database("dpone_pt")
    myconn = pymysql.connect(**parse_dsn(my.dsn(database)).connect_args(), autocommit=True)
    path = tmp_path / "pt.db"
    lite = sqlite3.connect(path, isolation_level=None)

    def pg_exec(query: str, rows: list[tuple[Any, ...]] | None) -> list[tuple[Any, ...]]:
        with pg.cursor() as cur:
            if rows is not None:
                cur.executemany(query, rows)
                return []
            cur.execute(query)
            return list(cur.fetchall()) if cur.description else []

    def my_exec(query: str, rows: list[tuple[Any, ...]] | None) -> list[tuple[Any, ...]]:
        with myconn.cursor() as cur:
            if rows is not None:
                cur.executemany(query, rows)
                return []
            cur.execute(query)
            return list(cur.fetchall()) if cur.description else []

    def lite_exec(query: str, rows: list[tuple[Any, ...]] | None) -> list[tuple[Any, ...]]:
        if rows is not None:
            lite.executemany(query, rows)
            return []
        return lite.execute(query).fetchall()

    yield {
        "postgres": Db("postgres", pg_dsn, pg_exec, schema),
        "mysql": Db("mysql", my.dsn(database), my_exec, database),
        "sqlite": Db("sqlite", f"sqlite:///{path}", lite_exec, None),
    }
    pg.execute(f'DROP SCHEMA "{schema}" CASCADE')
    pg.close()
    myconn.close()
    my.close()
    lite.close()


@pytest.mark.parametrize("src", KINDS)
@pytest.mark.parametrize("dst", KINDS)
def test_every_move_is_refused_or_equal(dbs: dict[str, Db], src: str, dst: str) -> None:
    source_db, target_db = dbs[src], dbs[dst]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(cases())
    def move(case: tuple[list[Column], list[Column], list[tuple[Any, ...]]]) -> None:
        source_cols, target_cols, rows = case
        name = "t" + uuid.uuid4().hex[:12]
        source = source_db.create(name + "_s", source_cols, rows)
        target = target_db.create(name + "_t", target_cols, [])
        wide = target_cols == source_cols or dst == "sqlite"
        try:
            with (
                open_source(SourceSpec("src", table=source), source_db.dsn) as reader,
                open_sink(SinkSpec("dst", target, "replace"), target_db.dsn, SinkOptions()) as sink,
            ):
                sink.write_chunk(reader, WINDOW)
        except DponeError as exc:
            assert not wide, f"a move into types as wide as the source's failed: {exc.code}"
            assert target_db.read(target, target_cols) == [], "a failed move left rows behind"
            return
        expected = source_db.read(source, source_cols)
        assert target_db.read(target, target_cols) == expected

    move()
