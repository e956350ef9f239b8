"""MSSQL contract tests through a recording pyodbc double; every statement is parsed as T-SQL.

No SQL Server runs here, so these tests prove the statements' shape, quoting, parameter binding,
transactions and error handling, not that a live server accepts them (UNVERIFIED).
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
import sqlglot
from dpone import errors
from dpone.connectors import (
    ChunkWindow,
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    table_checksum,
)
from dpone.connectors.base import RowChecksum
from dpone.connectors.mssql import (
    MssqlSink,
    MssqlSource,
    load_driver,
    odbc_connection_string,
)
from dpone.connectors.sqlite import SqliteSink, SqliteSource
from dpone.errors import DponeError
from sqlglot import exp

from .mssql_double import Engine, FakeOdbcError, Table
from .support import COLUMNS, ROWS, SECRET, WINDOWS, Pg, canon, create_pg, create_sqlite, expected

DSN = "mssql://dpone:pw@sql.example:1433/wh?driver=ODBC+Driver+18+for+SQL+Server&Encrypt=yes"
TYPES = {
    "id": "int",
    "order_date": "date",
    "created_at": "datetime2",
    "seq": "int",
    "customer": "nvarchar",
    "amount": "decimal",
    "payload": "nvarchar",
}
MakeDb = Callable[[str], tuple[str, sqlite3.Connection]]


@pytest.fixture
def engine() -> Engine:
    eng = Engine()
    eng.tables["dbo.orders"] = Table(dict(TYPES))
    return eng


def load(engine: Engine, key: str = "dbo.src") -> None:
    table = Table(dict(TYPES))
    for row in ROWS:
        created = row[2].astimezone(dt.UTC).replace(tzinfo=None)
        values = dict(zip(COLUMNS, (*row[:2], created, *row[3:]), strict=True))
        table.rows.append({k: table.coerce(k, v) for k, v in values.items()})
    engine.tables[key] = table


def sink(engine: Engine, mode: str, keys: tuple[str, ...] = ("id",), **kw: Any) -> MssqlSink:
    spec = SinkSpec("wh", TableRef("dbo", "orders"), mode, keys if mode == "merge" else ())  # type: ignore[arg-type]
    return MssqlSink(spec, DSN, kw.pop("options", SinkOptions()), driver=engine)  # type: ignore[arg-type]


def mssql_rows(engine: Engine, key: str = "dbo.orders") -> list[tuple[Any, ...]]:
    return canon(tuple(r[c] for c in COLUMNS) for r in engine.tables[key].rows)


def sqlite_source(sqlite_db: MakeDb) -> tuple[str, SqliteSource]:
    dsn, conn = sqlite_db("src")
    create_sqlite(conn)
    return dsn, SqliteSource(SourceSpec("src", TableRef(None, "orders")), dsn)


@pytest.mark.parametrize("chunk_type", sorted(WINDOWS))
@pytest.mark.parametrize("mode", ["replace", "merge", "append"])
def test_every_mode_from_sqlite(
    engine: Engine, sqlite_db: MakeDb, mode: str, chunk_type: str
) -> None:
    window = WINDOWS[chunk_type]
    dsn, source = sqlite_source(sqlite_db)
    result = sink(engine, mode).write_chunk(source, window)
    assert result.method == "executemany"
    assert result.rows == len(expected(window))
    assert mssql_rows(engine) == expected(window)
    src_sum = table_checksum(
        dsn, TableRef(None, "orders"), window.column, window.lower, window.upper
    )
    assert result.checksum == src_sum
    assert engine.commits == 1 and engine.rollbacks == 0
    writes = [entry for entry in engine.log if entry[0] == "executemany"]
    assert writes and all(info["fast"] for _, _, info in writes)
    statements = engine.statements()
    for sql in statements:
        sqlglot.parse_one(sql, read="tsql")
    bounds = [p for kind, _, p in engine.log if kind == "execute" and len(p) == 2]
    assert all(not isinstance(b, str) for p in bounds for b in p)  # typed, never text in SQL
    for sql in statements:
        text = re.sub(r"dpone_stage_[0-9a-f]{16}", "", sql)  # a random name may hold "200"
        assert str(window.lower) not in text and str(window.upper) not in text
    trees = [sqlglot.parse_one(s, read="tsql") for s in statements]
    if mode == "replace":
        [delete] = [t for t in trees if isinstance(t, exp.Delete)]
        assert isinstance(delete.args["where"].this, exp.And)
    if mode == "merge":
        [merge] = [t for t in trees if isinstance(t, exp.Merge)]
        assert "HOLDLOCK" in merge.sql("tsql")
        assert sum(isinstance(t, exp.Drop) for t in trees) == 1


def test_replace_is_idempotent_and_merge_upserts(engine: Engine, sqlite_db: MakeDb) -> None:
    _, source = sqlite_source(sqlite_db)
    window = WINDOWS["integer"]
    stale = Table(dict(TYPES))
    for row in ROWS[::2]:
        stale.rows.append(
            {
                **{k: None for k in COLUMNS},
                "id": row[0],
                "seq": row[3],
                "order_date": row[1],
                "created_at": dt.datetime(2020, 1, 1),
                "payload": "stale",
            }
        )
    engine.tables["dbo.orders"] = stale
    replace = sink(engine, "replace")
    first = replace.write_chunk(source, window)
    assert replace.write_chunk(source, window) == first
    found = mssql_rows(engine)
    assert [r for r in found if 200 <= int(r[3]) < 500] == expected(window)
    assert len([r for r in found if r[6] == "stale"]) == len(ROWS[::2]) - len(
        [r for r in ROWS[::2] if 200 <= r[3] < 500]
    )
    engine.tables["dbo.orders"] = stale
    sink(engine, "merge").write_chunk(source, window)
    found = mssql_rows(engine)
    assert [r for r in found if 200 <= int(r[3]) < 500] == expected(window)


def test_mssql_source_to_sqlite(engine: Engine, sqlite_db: MakeDb) -> None:
    load(engine)
    dst_dsn, dst = sqlite_db("dst")
    create_sqlite(dst, rows=[])
    window = WINDOWS["timestamp"]
    source = MssqlSource(SourceSpec("wh", TableRef("dbo", "src")), DSN, driver=engine)  # type: ignore[arg-type]
    out = SqliteSink(SinkSpec("dst", TableRef(None, "orders"), "replace"), dst_dsn, SinkOptions())
    result = out.write_chunk(source, window)
    assert result.rows == len(expected(window))
    assert result.checksum == source.checksum(window)
    [(_, select, params)] = [e for e in engine.log if "WHERE" in e[1] and "TOP 0" not in e[1]][:1]
    assert params == (dt.datetime(2024, 1, 2), dt.datetime(2024, 1, 5))
    tree = sqlglot.parse_one(select, read="tsql")
    assert isinstance(tree, exp.Select) and tree.find(exp.Placeholder) is not None
    assert all(ac for _, ac in engine.connects)  # the source reads in autocommit


def test_same_dsn_stays_in_the_server(engine: Engine) -> None:
    load(engine)
    window = WINDOWS["date"]
    source = MssqlSource(SourceSpec("wh", TableRef("dbo", "src")), DSN, driver=engine)  # type: ignore[arg-type]
    result = sink(engine, "replace").write_chunk(source, window)
    assert result.method == "insert-select"
    assert mssql_rows(engine) == [
        r for r in mssql_rows(engine, "dbo.src") if r[1] in ("2024-01-02", "2024-01-03")
    ]
    assert not [e for e in engine.log if e[0] == "executemany"]


@pytest.mark.postgres
def test_postgres_to_mssql_checksum_parity(engine: Engine, pg: Pg) -> None:
    from dpone.connectors.postgres import PostgresSource

    schema = pg.schema()
    create_pg(pg, schema)
    window = WINDOWS["timestamp"]
    with PostgresSource(SourceSpec("pg", TableRef(schema, "orders")), pg.dsn) as source:
        result = sink(engine, "merge").write_chunk(source, window)
        assert result.checksum == source.checksum(window)
    assert mssql_rows(engine) == expected(window)


HOSTILE_TABLE = "or]ders'; DROP TABLE canary; --"
HOSTILE_COLUMNS = ("i]d", 'da"te', "v[al]")


def test_hostile_identifiers_are_bracket_quoted(engine: Engine, sqlite_db: MakeDb) -> None:
    dsn, conn = sqlite_db("src")
    quoted = '"' + HOSTILE_TABLE.replace('"', '""') + '"'
    cols = ", ".join('"' + c.replace('"', '""') + '"' for c in HOSTILE_COLUMNS)
    conn.execute(f"CREATE TABLE {quoted} ({cols})")
    conn.executemany(
        f"INSERT INTO {quoted} VALUES (?, ?, ?)",
        [(i, f"2024-01-0{1 + i % 3}", f"v{i}") for i in range(9)],
    )
    engine.tables["we]ird." + HOSTILE_TABLE] = Table(
        {"i]d": "int", 'da"te': "date", "v[al]": "nvarchar"}
    )
    source = SqliteSource(SourceSpec("src", TableRef(None, HOSTILE_TABLE)), dsn)
    spec = SinkSpec("wh", TableRef("we]ird", HOSTILE_TABLE), "merge", ("i]d",))
    out = MssqlSink(spec, DSN, SinkOptions(), driver=engine)  # type: ignore[arg-type]
    window = ChunkWindow('da"te', "date", "2024-01-02", "2024-01-03'; DROP TABLE canary; --")
    result = out.write_chunk(source, window)
    assert result.rows == 6
    names = {r["v[al]"] for r in engine.tables["we]ird." + HOSTILE_TABLE].rows}
    assert names == {f"v{i}" for i in range(9) if i % 3}
    for sql in engine.statements():
        assert "2024-01-03'" not in sql  # the hostile bound only ever travels as a parameter
        tree = sqlglot.parse_one(sql, read="tsql")
        for table in tree.find_all(exp.Table):  # each quoted name parses back to itself
            assert table.name in (HOSTILE_TABLE, "orders") or table.name.startswith("dpone_stage_")


def test_constraint_violation_rolls_back_and_hides_values(
    engine: Engine, sqlite_db: MakeDb
) -> None:
    _, source = sqlite_source(sqlite_db)
    load(engine, "dbo.orders")
    before = mssql_rows(engine)
    message = (
        "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Violation of PRIMARY KEY "
        f"constraint 'PK_orders'. Cannot insert duplicate key in object 'dbo.orders'. The duplicate "
        f"key value is ({SECRET}). (2627) (SQLExecDirectW)"
    )

    def fail(kind: str, sql: str) -> Exception | None:
        return FakeOdbcError("23000", message) if kind == "executemany" else None

    engine.fail = fail
    with pytest.raises(DponeError) as caught:
        sink(engine, "replace").write_chunk(source, WINDOWS["date"])
    err = caught.value
    assert err.code == errors.SINK_FAILED
    assert "PK_orders" in err.message and "2627" in err.message and "dbo.orders" in err.message
    assert (
        SECRET not in err.message and "pw" not in err.message and "sql.example" not in err.message
    )
    assert engine.rollbacks == 1 and engine.commits == 0
    assert mssql_rows(engine) == before  # the DELETE was rolled back


def test_connection_loss_then_reconnect(engine: Engine, sqlite_db: MakeDb) -> None:
    _, source = sqlite_source(sqlite_db)
    out = sink(engine, "replace")
    out.write_chunk(source, WINDOWS["date"])
    engine.fail = lambda kind, sql: FakeOdbcError("08S01", "[08S01] Communication link failure")
    with pytest.raises(DponeError) as caught:
        out.write_chunk(source, WINDOWS["date"])
    assert caught.value.code == errors.CONNECTION_FAILED and caught.value.retryable
    engine.fail = lambda kind, sql: None
    out.write_chunk(source, WINDOWS["date"])
    assert len(engine.connects) == 2


def test_preflight(engine: Engine) -> None:
    [warning] = sink(engine, "replace").preflight("order_date")
    assert "no index on dbo.orders.order_date" in warning
    [warning] = sink(engine, "merge").preflight("order_date")
    assert "no unique index" in warning
    engine.indexes["dbo.orders"] = [(1, True, "id"), (2, False, "order_date"), (2, False, "id")]
    assert sink(engine, "replace").preflight("order_date") == []
    assert sink(engine, "merge").preflight("order_date") == []
    del engine.tables["dbo.orders"]
    [missing] = sink(engine, "append").preflight("order_date")
    assert "does not exist" in missing
    for sql in engine.statements():
        sqlglot.parse_one(sql, read="tsql")


def test_column_types_are_described_by_the_server_for_tables_and_queries(engine: Engine) -> None:
    """UNVERIFIED against a real SQL Server: the double answers the describe query from its
    tables; the statement and the T-SQL it describes must parse."""
    from dpone.connectors.column_types import narrowing
    from dpone.connectors.dialect_types import pg_column_type
    from dpone.connectors.mssql import MssqlSource

    engine.tables["dbo.orders"].declared.update(customer="varchar(5)", created_at="datetime")
    table = MssqlSource(SourceSpec("wh", TableRef("dbo", "orders")), DSN, driver=engine)  # type: ignore[arg-type]
    described = table.column_types()
    assert list(described) == list(TYPES)
    amount, customer = described["amount"], described["customer"]
    assert amount is not None and (amount.precision, amount.scale) == (18, 2)
    assert customer is not None and customer.length == 5 and customer.charset == "code page"
    stamp = described["created_at"]
    assert stamp is not None and stamp.fsp == 2
    assert narrowing(pg_column_type("timestamp without time zone"), stamp) is not None
    assert narrowing(pg_column_type("numeric(12,2)"), amount) is None
    query = MssqlSource(
        SourceSpec("wh", query="SELECT id, amount FROM [dbo].[orders]"), DSN, driver=engine  # type: ignore[arg-type]
    )
    assert {n: t.declared for n, t in query.column_types().items() if t} == {
        "id": "int",
        "amount": "decimal(18,2)",
    }
    for sql in engine.statements():
        sqlglot.parse_one(sql, read="tsql")


def test_external_connection_is_refused(engine: Engine, sqlite_db: MakeDb) -> None:
    _, source = sqlite_source(sqlite_db)
    with pytest.raises(DponeError) as caught:
        sink(engine, "replace").write_chunk(source, WINDOWS["date"], connection=object())
    assert caught.value.code == errors.CONNECTOR_INVALID


def test_checksum_matches_python_rows(engine: Engine) -> None:
    load(engine)
    source = MssqlSource(SourceSpec("wh", TableRef("dbo", "src")), DSN, driver=engine)  # type: ignore[arg-type]
    check = RowChecksum(COLUMNS)
    check.add_many(
        [
            tuple(r[c] for c in COLUMNS)
            for r in engine.tables["dbo.src"].rows
            if 200 <= r["seq"] < 500
        ]
    )
    assert source.checksum(WINDOWS["integer"]) == check.value()


def test_odbc_connection_strings() -> None:
    assert odbc_connection_string(DSN) == (
        "DRIVER={ODBC Driver 18 for SQL Server};SERVER=sql.example,1433;DATABASE=wh;UID=dpone;"
        "PWD={pw};Encrypt=yes"
    )
    assert odbc_connection_string("mssql://u:p%7D%3Bx@h/db") == (
        "DRIVER={ODBC Driver 18 for SQL Server};SERVER=h;DATABASE=db;UID=u;PWD={p}};x}"
    )
    raw = "DSN=warehouse;UID=u;PWD=p"
    assert odbc_connection_string("odbc://" + raw) == raw


def test_missing_driver_is_a_dpone_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyodbc", None)
    with pytest.raises(DponeError) as caught:
        load_driver()
    assert caught.value.code == errors.DRIVER_MISSING
    assert "[mssql] extra" in caught.value.message


# --- the whole table: Sink.write_all and inner mode full_refresh ----------------------------------
def _stale(engine: Engine) -> list[tuple[Any, ...]]:
    """dbo.orders holding wrong copies of some source rows and rows the source never had."""
    table = engine.tables["dbo.orders"]
    for row in ROWS[::3]:
        table.rows.append(
            {
                **{k: None for k in COLUMNS},
                "id": row[0],
                "seq": row[3],
                "order_date": row[1],
                "created_at": dt.datetime(2020, 1, 1),
                "payload": "stale",
            }
        )
    table.rows.append({**{k: None for k in COLUMNS}, "id": 9000, "seq": -5, "payload": "old"})
    return mssql_rows(engine)


def _deletes(engine: Engine) -> list[exp.Delete]:
    trees = [sqlglot.parse_one(s, read="tsql") for s in engine.statements()]
    return [t for t in trees if isinstance(t, exp.Delete)]


def test_full_refresh_from_sqlite_replaces_the_whole_table(
    engine: Engine, sqlite_db: MakeDb
) -> None:
    dsn, source = sqlite_source(sqlite_db)
    _stale(engine)
    result = sink(engine, "full_refresh").write_all(source)
    assert (result.method, result.rows) == ("executemany", len(ROWS))
    assert mssql_rows(engine) == canon(ROWS)
    assert result.checksum == table_checksum(dsn, TableRef(None, "orders"))
    assert engine.commits == 1 and engine.rollbacks == 0
    [delete] = _deletes(engine)
    assert delete.args.get("where") is None  # every row, in the write's own transaction
    assert "TABLOCKX" in delete.sql("tsql") and "TRUNCATE" not in " ".join(engine.statements())
    first_write = next(i for i, e in enumerate(engine.log) if e[0] == "executemany")
    assert engine.log.index(next(e for e in engine.log if e[1].startswith("DELETE"))) < first_write
    reads = [e for e in engine.log if e[1].startswith("SELECT") and "TOP 0" not in e[1]]
    assert reads and all("WHERE" not in sql and params == () for _, sql, params in reads)


def test_full_refresh_same_dsn_stays_in_the_server(engine: Engine) -> None:
    load(engine)
    _stale(engine)
    source = MssqlSource(SourceSpec("wh", TableRef("dbo", "src")), DSN, driver=engine)  # type: ignore[arg-type]
    result = sink(engine, "full_refresh").write_all(source)
    assert result.method == "insert-select"
    assert mssql_rows(engine) == mssql_rows(engine, "dbo.src")
    assert result.checksum == source.checksum(None)
    [insert] = [e for e in engine.log if e[1].startswith("INSERT")]
    tree = sqlglot.parse_one(insert[1], read="tsql")
    assert tree.expression.args.get("where") is None and insert[2] == ()


def test_inner_mode_full_refresh_of_one_chunk_deletes_outside_the_window(
    engine: Engine, sqlite_db: MakeDb
) -> None:
    _, source = sqlite_source(sqlite_db)
    _stale(engine)
    window = WINDOWS["date"]
    result = sink(engine, "full_refresh").write_chunk(source, window)
    assert mssql_rows(engine) == expected(window)
    assert result.rows == len(expected(window))
    [delete] = _deletes(engine)
    assert delete.args.get("where") is None
    [(_, read_back, params)] = [e for e in engine.log if e[1].startswith("SELECT")]
    assert "WHERE" not in read_back and params == ()  # the checksum covers the whole target


def test_full_refresh_failure_rolls_back_the_delete(engine: Engine, sqlite_db: MakeDb) -> None:
    _, source = sqlite_source(sqlite_db)
    before = _stale(engine)
    message = (
        "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]The INSERT statement "
        f"conflicted with the CHECK constraint 'amount_cap' ({SECRET}). (547) (SQLExecDirectW)"
    )
    engine.fail = lambda kind, sql: (
        FakeOdbcError("23000", message) if kind == "executemany" else None
    )
    with pytest.raises(DponeError) as caught:
        sink(engine, "full_refresh").write_all(source)
    assert caught.value.code == errors.SINK_FAILED
    assert "writing all rows (rolled back)" in caught.value.message
    assert "amount_cap" in caught.value.message and SECRET not in caught.value.message
    assert engine.rollbacks == 1 and engine.commits == 0
    assert mssql_rows(engine) == before
