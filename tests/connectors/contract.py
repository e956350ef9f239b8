"""The connector contract kit: what every connector must do, stated once, run on every connector.

A connector is described by a :class:`Connector` (how to reach an ``orders`` table holding
:data:`support.ROWS` and an empty ``dst`` table of the same shape in that database, and how to make
a write fail with a secret in the driver's text). ``test_contract.py`` runs each behaviour below
against every registered connector: a new connector is proven by adding one fixture function to
:data:`CONNECTORS` (see docs/contributing/connectors.md).

Postgres and MariaDB are the real servers of the test suite; SQLite real files; MSSQL the
recording T-SQL double of ``mssql_double.py`` (its SQL is parsed as T-SQL, not run by SQL Server).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.connectors.base import (
    ChunkWindow,
    InnerMode,
    Row,
    Sink,
    SinkOptions,
    SinkSpec,
    Source,
    SourceSpec,
    TableRef,
)
from dpone.connectors.factory import open_sink, open_source
from dpone.connectors.mssql import MssqlSink, MssqlSource

from .mssql_double import Engine, FakeOdbcError, Table
from .mysql_support import My
from .support import SECRET, Pg, create_pg, create_sqlite
from .test_mssql import DSN as MSSQL_DSN
from .test_mssql import TYPES as MSSQL_TYPES
from .test_mssql import load as mssql_load
from .test_mysql import create_my


@dataclass
class Connector:
    """One connector under the contract, with its ``orders`` (full) and ``dst`` (empty) tables."""

    kind: str
    #: a Source of kind ``kind`` reading ``table`` ("orders" or "dst") of this database
    source: Callable[[str], Source]
    #: a Sink of kind ``kind`` writing ``dst`` in ``mode`` (merge keys: id)
    sink: Callable[[InnerMode, SinkOptions], Sink]
    #: a Sink whose next write fails in the driver with SECRET in the driver's own text
    broken_sink: Callable[[], Sink]
    #: a Source whose read runs for seconds unless interrupted (None: the connector cannot cancel)
    slow_source: Callable[[], Source] | None = None
    closing: list[Callable[[], None]] = field(default_factory=list)


def sink_spec(kind: str, schema: str | None, mode: InnerMode) -> SinkSpec:
    return SinkSpec(kind, TableRef(schema, "dst"), mode, ("id",) if mode == "merge" else ())


class Tampered(Source):
    """``inner``'s rows with one value changed on the way (as a lossy driver or type would); its
    checksum and siblings are ``inner``'s own, so the read-back gate must see the difference."""

    def __init__(self, inner: Source) -> None:
        super().__init__(inner.spec, "tampered://")
        self.inner = inner
        self.kind = inner.kind

    def columns(self) -> tuple[str, ...]:
        return self.inner.columns()

    def rows(self, window: ChunkWindow | None, batch_rows: int) -> Generator[list[Row], None, None]:
        first = True
        for batch in self.inner.rows(window, batch_rows):
            if not (first and batch):
                yield batch
                continue
            row = list(batch[0])
            row[self.columns().index("customer")] = "changed on the way"
            first = False
            yield [tuple(row), *batch[1:]]

    def checksum(self, window: ChunkWindow | None) -> str:
        return self.inner.checksum(window)

    def sibling(self, columns: tuple[str, ...] | None = None) -> Source:
        return self.inner.sibling(columns)

    def close(self) -> None:
        self.inner.close()


# --- the registered connectors ------------------------------------------------------------------
def postgres(pg: Pg) -> Connector:
    schema = pg.schema()
    create_pg(pg, schema, "orders")
    create_pg(pg, schema, "dst", rows=())
    missing = pg.dsn.rsplit("/", 1)[0] + f"/{SECRET}"  # libpq names the database it misses
    return Connector(
        "postgres",
        source=lambda table: open_source(SourceSpec("wh", TableRef(schema, table)), pg.dsn),
        sink=lambda mode, options: open_sink(sink_spec("wh", schema, mode), pg.dsn, options),
        broken_sink=lambda: open_sink(sink_spec("wh", schema, "replace"), missing),
        slow_source=lambda: open_source(
            SourceSpec(
                "wh", query=f"SELECT o.* FROM \"{schema}\".orders AS o WHERE pg_sleep(1)::text = ''"
            ),
            pg.dsn,
        ),
    )


def mysql(my: My) -> Connector:
    db = my.database()
    create_my(my, db, "orders")
    create_my(my, db, "dst", rows=())
    dsn = my.dsn(db)
    missing = my.dsn(SECRET)  # the server's text names the database it misses
    return Connector(
        "mysql",
        source=lambda table: open_source(SourceSpec("wh", TableRef(None, table)), dsn),
        sink=lambda mode, options: open_sink(sink_spec("wh", None, mode), dsn, options),
        broken_sink=lambda: open_sink(sink_spec("wh", None, "replace"), missing),
        slow_source=lambda: open_source(
            SourceSpec(
                "wh", query="SELECT o.* FROM orders AS o WHERE BENCHMARK(1e8, MD5(o.id)) = 0"
            ),
            dsn,
        ),
    )


def sqlite(tmp_path: Path) -> Connector:
    path = tmp_path / "contract.db"
    conn = sqlite3.connect(path, isolation_level=None)
    create_sqlite(conn, "orders")
    create_sqlite(conn, "dst", rows=())
    conn.close()
    dsn = f"sqlite:///{path}"
    busy = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000000) "
        "SELECT o.* FROM orders AS o WHERE (SELECT count(*) FROM c) > 0"
    )

    return Connector(
        "sqlite",
        source=lambda table: open_source(SourceSpec("wh", TableRef(None, table)), dsn),
        sink=lambda mode, options: open_sink(sink_spec("wh", None, mode), dsn, options),
        broken_sink=lambda: open_sink(
            sink_spec("wh", None, "replace"), f"sqlite:///{tmp_path}/{SECRET}/none.db"
        ),
        slow_source=lambda: open_source(SourceSpec("wh", query=busy), dsn),
    )


def mssql() -> Connector:
    engine = Engine()
    mssql_load(engine, "dbo.orders")
    engine.tables["dbo.dst"] = Table(dict(MSSQL_TYPES))

    def broken() -> Sink:
        text = f"[23000] [SQL Server]Violation of PRIMARY KEY: duplicate key ({SECRET}). (2627)"
        engine.fail = lambda kind, sql: FakeOdbcError("23000", text) if "DELETE" in sql else None
        spec = sink_spec("wh", "dbo", "replace")
        return MssqlSink(spec, MSSQL_DSN, SinkOptions(), driver=engine)  # type: ignore[arg-type]

    def source(table: str) -> Source:
        spec = SourceSpec("wh", TableRef("dbo", table))
        return MssqlSource(spec, MSSQL_DSN, driver=engine)  # type: ignore[arg-type]

    def sink(mode: InnerMode, options: SinkOptions) -> Sink:
        spec = sink_spec("wh", "dbo", mode)
        return MssqlSink(spec, MSSQL_DSN, options, driver=engine)  # type: ignore[arg-type]

    return Connector("mssql", source=source, sink=sink, broken_sink=broken)


@contextlib.contextmanager
def connector(kind: str, request: Any, tmp_path: Path) -> Iterator[Connector]:
    """The registered connector ``kind`` with fresh tables (pytest's ``request`` gives the
    server fixtures); closes its helpers afterwards."""
    if kind == "postgres":
        pg = Pg(request.getfixturevalue("pg_dsn"))
        try:
            yield postgres(pg)
        finally:
            pg.close()
    elif kind == "mysql":
        my = My(request.getfixturevalue("mysql_dsn"))
        try:
            yield mysql(my)
        finally:
            my.close()
    elif kind == "sqlite":
        yield sqlite(tmp_path)
    else:
        yield mssql()


#: Every connector the contract runs on; a new connector adds its name here and a branch above.
CONNECTORS = ("postgres", "mysql", "sqlite", "mssql")
