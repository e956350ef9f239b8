"""SQLite -> SQLite, SQLite -> Postgres and Postgres -> SQLite, with checksum parity across kinds."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import psycopg
import pytest
from dpone import errors
from dpone.connectors import (
    ChunkWindow,
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    open_sink,
    open_source,
    table_checksum,
)
from dpone.connectors.sqlite import to_sqlite
from dpone.errors import DponeError
from psycopg import sql

from .support import (
    PG_DDL,
    ROWS,
    SECRET,
    SQLITE_DDL,
    WINDOWS,
    Pg,
    canon,
    create_pg,
    create_sqlite,
    expected,
    pg_rows,
    sqlite_rows,
)

MakeDb = Callable[[str], tuple[str, sqlite3.Connection]]
MODES = ("replace", "merge", "append")


def _sink(
    dsn: str,
    mode: str,
    table: str = "orders",
    keys: tuple[str, ...] = ("id",),
    schema: str | None = None,
    options: SinkOptions | None = None,
):  # type: ignore[no-untyped-def]
    spec = SinkSpec("dst", TableRef(schema, table), mode, keys if mode == "merge" else ())  # type: ignore[arg-type]
    return open_sink(spec, dsn, options)


def _checksum(
    dsn: str, window: ChunkWindow, table: str = "orders", schema: str | None = None
) -> str:
    return table_checksum(dsn, TableRef(schema, table), window.column, window.lower, window.upper)


@pytest.fixture(params=["separate-files", "same-file"])
def sqlite_pair(request: pytest.FixtureRequest, sqlite_db: MakeDb):  # type: ignore[no-untyped-def]
    """(source dsn, sink dsn, sink connection, method) with the source loaded."""
    src_dsn, src = sqlite_db("src")
    create_sqlite(src)
    if request.param == "same-file":
        create_sqlite(src, "target", rows=[])
        return src_dsn, src_dsn, src, "target", "insert-select"
    dst_dsn, dst = sqlite_db("dst")
    create_sqlite(dst, "target", rows=[])
    return src_dsn, dst_dsn, dst, "target", "executemany"


@pytest.mark.parametrize("chunk_type", sorted(WINDOWS))
@pytest.mark.parametrize("mode", MODES)
def test_sqlite_to_sqlite_every_mode(sqlite_pair, mode: str, chunk_type: str) -> None:  # type: ignore[no-untyped-def]
    src_dsn, dst_dsn, dst, table, method = sqlite_pair
    window = WINDOWS[chunk_type]
    with (
        open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn) as source,
        _sink(dst_dsn, mode, table) as sink,
    ):
        result = sink.write_chunk(source, window)
    assert result.method == method
    assert result.rows == len(expected(window)) > 0
    assert sqlite_rows(dst, table) == expected(window)
    assert result.checksum == _checksum(src_dsn, window) == _checksum(dst_dsn, window, table)


def test_sqlite_replace_idempotent_and_merge_upserts(sqlite_pair) -> None:  # type: ignore[no-untyped-def]
    src_dsn, dst_dsn, dst, table, _ = sqlite_pair
    window = WINDOWS["date"]
    stale = [(r[0], *r[1:5], 1, "stale") for r in ROWS]
    create_sqlite(dst, "stale", rows=stale)
    dst.execute(f"INSERT INTO {table} SELECT * FROM stale")
    source = open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn)
    with _sink(dst_dsn, "replace", table) as sink:
        first = sink.write_chunk(source, window)
        second = sink.write_chunk(source, window)
    assert first == second
    found = sqlite_rows(dst, table)
    assert [r for r in found if r[1] in ("2024-01-02", "2024-01-03")] == expected(window)
    assert [r for r in found if r[1] not in ("2024-01-02", "2024-01-03")] == [
        r for r in canon(stale) if r[1] not in ("2024-01-02", "2024-01-03")
    ]
    dst.execute(f"DELETE FROM {table}")
    dst.execute(f"INSERT INTO {table} SELECT * FROM stale WHERE id % 2 = 0")
    with _sink(dst_dsn, "merge", table) as sink:
        merged = sink.write_chunk(source, WINDOWS["integer"])
    source.close()
    assert merged.rows == len(expected(WINDOWS["integer"]))
    found = sqlite_rows(dst, table)
    assert [r for r in found if 200 <= int(r[3]) < 500] == expected(WINDOWS["integer"])
    assert [r for r in found if not 200 <= int(r[3]) < 500] == [
        r for r in canon(stale) if int(r[0]) % 2 == 0 and not 200 <= int(r[3]) < 500
    ]


def test_sqlite_constraint_violation_rolls_back(sqlite_db: MakeDb) -> None:
    src_dsn, src = sqlite_db("src")
    create_sqlite(src, rows=[r if r[0] != 20 else (*r[:4], SECRET, 9999.99, SECRET) for r in ROWS])
    dst_dsn, dst = sqlite_db("dst")
    create_sqlite(
        dst,
        rows=ROWS[:50],
        ddl=SQLITE_DDL.replace(
            "payload TEXT", "payload TEXT, CONSTRAINT amount_cap CHECK (amount < 9000)"
        ),
    )
    before = sqlite_rows(dst)
    with (
        open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn) as source,
        _sink(dst_dsn, "replace") as sink,
    ):
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, WINDOWS["date"])
    assert caught.value.code == errors.SINK_FAILED
    assert "amount_cap" in caught.value.message and "orders" in caught.value.message
    assert SECRET not in caught.value.message and "9999" not in caught.value.message
    assert not caught.value.key_conflict  # a CHECK constraint: no retry gives it back
    assert sqlite_rows(dst) == before


@pytest.mark.parametrize("same_file", [False, True], ids=["two-files", "same-file"])
def test_a_key_the_target_holds_is_a_key_conflict(sqlite_db: MakeDb, same_file: bool) -> None:
    """The run moves such a chunk again after its others (a row the source moved to an earlier
    chunk is still held by the later chunk's old rows): the error says it is a key conflict."""
    src_dsn, src = sqlite_db("src")
    dst_dsn, dst = (src_dsn, src) if same_file else sqlite_db("dst")
    src.execute("CREATE TABLE s (id INTEGER PRIMARY KEY, d TEXT NOT NULL, v INTEGER)")
    src.executemany("INSERT INTO s VALUES (?, ?, ?)", [(1, "2024-01-02", 1), (2, "2024-01-02", 2)])
    dst.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, d TEXT NOT NULL, v INTEGER)")
    dst.execute("INSERT INTO t VALUES (2, '2024-01-09', 2)")  # another chunk's range
    with (
        open_source(SourceSpec("src", TableRef(None, "s")), src_dsn) as source,
        _sink(dst_dsn, "replace", table="t") as sink,
    ):
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, ChunkWindow("d", "date", "2024-01-02", "2024-01-03"))
    assert caught.value.code == errors.SINK_FAILED and caught.value.key_conflict
    assert dst.execute("SELECT id, d FROM t").fetchall() == [(2, "2024-01-09")]


def test_sqlite_hostile_identifiers_and_bound(sqlite_db: MakeDb) -> None:
    src_dsn, src = sqlite_db("src")
    dst_dsn, dst = sqlite_db("dst")
    table = 'or"ders; DROP TABLE canary; --'
    cols = ('i"d', "da;te", "v')--")
    ddl = (
        "CREATE TABLE {} ("
        + ", ".join(
            '"' + c.replace('"', '""') + '"' + t
            for c, t in zip(cols, (" INTEGER PRIMARY KEY", " TEXT", " TEXT"), strict=True)
        )
        + ")"
    )
    quoted = '"' + table.replace('"', '""') + '"'
    for conn in (src, dst):
        conn.execute(ddl.format(quoted))
        conn.execute("CREATE TABLE canary (x)")
    src.executemany(
        f"INSERT INTO {quoted} VALUES (?, ?, ?)",
        [(i, f"2024-01-0{1 + i % 3}", f"v{i}") for i in range(30)],
    )
    hostile = "2024-01-03'; DROP TABLE canary; --"
    window = ChunkWindow("da;te", "date", "2024-01-02", hostile)
    with (
        open_source(SourceSpec("src", TableRef("main", table)), src_dsn) as source,
        _sink(dst_dsn, "merge", table, keys=('i"d',), schema="main") as sink,
    ):
        result = sink.write_chunk(source, window)
        assert sink.preflight("da;te") == []
    # compared as text, the hostile bound is just a string above '2024-01-03'
    assert result.rows == 20
    for conn in (src, dst):
        assert conn.execute("SELECT count(*) FROM canary").fetchone() == (0,)


def test_sqlite_preflight(sqlite_db: MakeDb) -> None:
    dsn, conn = sqlite_db("dst")
    create_sqlite(conn, rows=[])
    [warning] = _sink(dsn, "replace").preflight("order_date")
    assert "no index on orders.order_date" in warning
    assert _sink(dsn, "merge").preflight("order_date") == []  # INTEGER PRIMARY KEY
    [warning] = _sink(dsn, "merge", keys=("seq",)).preflight("order_date")
    assert "no unique index" in warning
    conn.execute("CREATE INDEX by_day ON orders (order_date)")
    conn.execute("CREATE UNIQUE INDEX by_seq ON orders (seq)")
    assert _sink(dsn, "replace").preflight("order_date") == []
    assert _sink(dsn, "merge", keys=("seq",)).preflight("order_date") == []
    [missing] = _sink(dsn, "replace", table="absent").preflight("order_date")
    assert "does not exist" in missing


def test_sqlite_missing_file_is_a_configuration_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Not retryable (another attempt finds no file either), and named by its file name only;
    a file that exists and cannot be opened stays a connection failure."""
    source = open_source(SourceSpec("src", TableRef(None, "t")), f"sqlite:///{tmp_path}/none.db")
    with pytest.raises(DponeError) as caught:
        source.columns()
    assert caught.value.code == errors.CONFIG_INVALID
    assert not errors.REGISTRY[caught.value.code].retryable
    assert "'none.db' does not exist" in caught.value.message
    assert str(tmp_path) not in caught.value.message
    assert not (tmp_path / "none.db").exists()
    (tmp_path / "folder.db").mkdir()
    folder = open_source(SourceSpec("src", TableRef(None, "t")), f"sqlite:///{tmp_path}/folder.db")
    with pytest.raises(DponeError) as caught:
        folder.columns()
    assert caught.value.code == errors.CONNECTION_FAILED


def test_external_connection_is_postgres_only(sqlite_db: MakeDb) -> None:
    dsn, conn = sqlite_db("x")
    create_sqlite(conn)
    with (
        open_source(SourceSpec("src", TableRef(None, "orders")), dsn) as source,
        _sink(dsn, "replace") as sink,
    ):
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, WINDOWS["date"], connection=object())
    assert caught.value.code == errors.CONNECTOR_INVALID


# --- across kinds ---------------------------------------------------------------------------------
@pytest.mark.postgres
@pytest.mark.parametrize("chunk_type", sorted(WINDOWS))
@pytest.mark.parametrize("mode", MODES)
def test_sqlite_to_postgres(sqlite_db: MakeDb, pg: Pg, mode: str, chunk_type: str) -> None:
    src_dsn, src = sqlite_db("src")
    create_sqlite(src)
    schema = pg.schema()
    create_pg(pg, schema, rows=[])
    window = WINDOWS[chunk_type]
    with (
        open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn) as source,
        _sink(pg.dsn, mode, schema=schema, options=SinkOptions(batch_rows=7)) as sink,
    ):
        result = sink.write_chunk(source, window)
    assert result.method == "copy-rows"
    assert pg_rows(pg, schema) == expected(window)
    assert result.checksum == _checksum(src_dsn, window) == _checksum(pg.dsn, window, schema=schema)


@pytest.mark.postgres
def test_sqlite_to_postgres_in_an_external_transaction(sqlite_db: MakeDb, pg: Pg) -> None:
    """Zone-less SQLite timestamps are UTC even when the caller's session is not."""
    src_dsn, src = sqlite_db("src")
    create_sqlite(src)
    schema = pg.schema()
    create_pg(
        pg, schema, rows=[], ddl=PG_DDL.replace("created_at timestamptz", "created_at timestamp")
    )
    create_pg(pg, schema, "orders_tz", rows=[])
    window = WINDOWS["timestamp"]
    caller = psycopg.connect(pg.dsn)
    try:
        caller.execute("SET TimeZone = 'Asia/Kolkata'")
        with open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn) as source:
            for table in ("orders", "orders_tz"):
                with _sink(pg.dsn, "replace", table=table, schema=schema) as sink:
                    sink.write_chunk(source, window, connection=caller)
        caller.commit()
        assert caller.execute("SHOW TimeZone").fetchone() == ("Asia/Kolkata",)
    finally:
        caller.close()
    assert pg_rows(pg, schema) == expected(window)
    assert pg_rows(pg, schema, "orders_tz") == expected(window)


@pytest.mark.postgres
@pytest.mark.parametrize("chunk_type", sorted(WINDOWS))
@pytest.mark.parametrize("mode", MODES)
def test_postgres_to_sqlite(sqlite_db: MakeDb, pg: Pg, mode: str, chunk_type: str) -> None:
    schema = pg.schema()
    create_pg(pg, schema)
    dst_dsn, dst = sqlite_db("dst")
    create_sqlite(dst, rows=[])
    window = WINDOWS[chunk_type]
    src_spec = SourceSpec("src", TableRef(schema, "orders"))
    with (
        open_source(src_spec, pg.dsn) as source,
        _sink(dst_dsn, mode, options=SinkOptions(batch_rows=9)) as sink,
    ):
        result = sink.write_chunk(source, window)
        assert result.checksum == source.checksum(window)
    assert result.method == "executemany"
    assert sqlite_rows(dst) == expected(window)
    assert result.checksum == _checksum(pg.dsn, window, schema=schema) == _checksum(dst_dsn, window)


@pytest.mark.postgres
def test_postgres_exotic_types_reach_sqlite_as_postgres_text(sqlite_db: MakeDb, pg: Pg) -> None:
    schema = pg.schema()
    pg.run(
        sql.SQL(
            "CREATE TABLE {} (id int, d date, j jsonb, iv interval, arr int[], f real, b bool,"
            " u uuid, raw bytea, t time)"
        ).format(sql.Identifier(schema, "odd"))
    )
    pg.run(
        sql.SQL(
            "INSERT INTO {} VALUES (1, '2024-01-01', '{{\"a\": [1, \"x\"]}}', '1 day 02:00', '{{1,2}}',"
            " 0.1, true, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff', '12:30:00.25'),"
            " (2, '2024-01-01', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
        ).format(sql.Identifier(schema, "odd"))
    )
    dst_dsn, dst = sqlite_db("dst")
    dst.execute(
        "CREATE TABLE odd (id INTEGER, d TEXT, j TEXT, iv TEXT, arr TEXT, f REAL, b INTEGER,"
        " u TEXT, raw BLOB, t TEXT)"
    )
    window = ChunkWindow("d", "date", "2024-01-01", "2024-01-02")
    with (
        open_source(SourceSpec("src", TableRef(schema, "odd")), pg.dsn) as source,
        _sink(dst_dsn, "replace", table="odd") as sink,
    ):
        result = sink.write_chunk(source, window)
    assert dst.execute("SELECT j, iv, arr, b, u, raw, t FROM odd WHERE id = 1").fetchone() == (
        '{"a": [1, "x"]}',
        "1 day 02:00:00",
        "{1,2}",
        1,
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        b"\x00\xff",
        "12:30:00.25",
    )
    assert (
        result.checksum
        == _checksum(pg.dsn, window, "odd", schema)
        == _checksum(dst_dsn, window, "odd")
    )


# --- the whole table: Sink.write_all and inner mode full_refresh ----------------------------------
def _stale(conn: sqlite3.Connection, table: str) -> list[tuple[object, ...]]:
    """Wrong copies of some source rows and rows the source never had, in ``table``."""
    stale = [(r[0], *r[1:5], 0, "stale") for r in ROWS[::3]]
    only_here = [
        (9000 + i, "2020-01-01", "2020-01-01 00:00:00", -5, "x", 1, "old") for i in range(4)
    ]
    conn.executemany(
        f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?, ?, ?)",
        [tuple(to_sqlite(v) for v in row) for row in stale + only_here],
    )
    return sqlite_rows(conn, table)


def test_sqlite_full_refresh_replaces_the_whole_target(sqlite_pair) -> None:  # type: ignore[no-untyped-def]
    src_dsn, dst_dsn, dst, table, method = sqlite_pair
    _stale(dst, table)
    with (
        open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn) as source,
        _sink(dst_dsn, "full_refresh", table) as sink,
    ):
        result = sink.write_all(source)
        assert sink.write_all(source) == result
        assert sink.preflight() == []
    assert (result.method, result.rows) == (method, len(ROWS))
    assert sqlite_rows(dst, table) == canon(ROWS)
    whole = table_checksum(src_dsn, TableRef(None, "orders"))
    assert result.checksum == whole == table_checksum(dst_dsn, TableRef(None, table))


def test_sqlite_inner_mode_full_refresh_of_one_chunk(sqlite_pair) -> None:  # type: ignore[no-untyped-def]
    src_dsn, dst_dsn, dst, table, _ = sqlite_pair
    window = WINDOWS["timestamp"]
    _stale(dst, table)
    with (
        open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn) as source,
        _sink(dst_dsn, "full_refresh", table) as sink,
    ):
        result = sink.write_chunk(source, window)
    assert sqlite_rows(dst, table) == expected(window)  # rows outside the window are gone too
    assert result.checksum == _checksum(src_dsn, window)


@pytest.mark.parametrize("same_file", [False, True])
def test_sqlite_full_refresh_failure_rolls_back(sqlite_db: MakeDb, same_file: bool) -> None:
    src_dsn, src = sqlite_db("src")
    create_sqlite(src, rows=[r if r[0] != 97 else (*r[:4], SECRET, 9999.99, SECRET) for r in ROWS])
    dst_dsn, dst = (src_dsn, src) if same_file else sqlite_db("dst")
    create_sqlite(
        dst,
        "target",
        rows=[],
        ddl=SQLITE_DDL.replace(
            "payload TEXT", "payload TEXT, CONSTRAINT amount_cap CHECK (amount < 9000)"
        ),
    )
    before = _stale(dst, "target")
    with (
        open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn) as source,
        _sink(dst_dsn, "full_refresh", "target") as sink,
    ):
        with pytest.raises(DponeError) as caught:
            sink.write_all(source)
    assert caught.value.code == errors.SINK_FAILED
    assert "writing all rows (rolled back)" in caught.value.message
    assert "amount_cap" in caught.value.message
    assert SECRET not in caught.value.message and "9999" not in caught.value.message
    assert sqlite_rows(dst, "target") == before


@pytest.mark.postgres
def test_postgres_query_to_sqlite_full_refresh(sqlite_db: MakeDb, pg: Pg) -> None:
    """Row path without a window: the query's '%' reaches Postgres unchanged."""
    schema = pg.schema()
    create_pg(pg, schema)
    dst_dsn, dst = sqlite_db("dst")
    create_sqlite(dst, rows=[])
    _stale(dst, "orders")
    query = f"SELECT * FROM \"{schema}\".orders WHERE payload LIKE 'p%' AND length('%') = 1"
    subset = [r for r in ROWS if r[6].startswith("p")]
    with (
        open_source(SourceSpec("src", query=query), pg.dsn) as source,
        _sink(dst_dsn, "full_refresh", options=SinkOptions(batch_rows=9)) as sink,
    ):
        result = sink.write_all(source)
        assert result.checksum == source.checksum(None)
    assert result.method == "executemany"
    assert sqlite_rows(dst) == canon(subset)


@pytest.mark.postgres
def test_sqlite_to_postgres_full_refresh(sqlite_db: MakeDb, pg: Pg) -> None:
    src_dsn, src = sqlite_db("src")
    create_sqlite(src)
    schema = pg.schema()
    create_pg(pg, schema, rows=ROWS[::4])
    with (
        open_source(SourceSpec("src", TableRef(None, "orders")), src_dsn) as source,
        _sink(pg.dsn, "full_refresh", schema=schema) as sink,
    ):
        result = sink.write_all(source)
    assert result.method == "copy-rows"
    assert pg_rows(pg, schema) == canon(ROWS)
    assert result.checksum == table_checksum(src_dsn, TableRef(None, "orders"))


# --- bytes and text into Postgres: a text COPY writes bytes as their \x hex text ----------------
_KEPT = (500, "kept")  # a target row outside the chunk's range: a rolled-back chunk keeps it


def _kinds_case(
    sqlite_db: MakeDb, pg: Pg, declared: str, target: str, values: list[object], name: str = "src"
) -> tuple[str, str]:
    """A SQLite table ``s`` (``v`` declared as given) holding ``values`` at ids 1.., and a
    Postgres table ``t`` (``v`` of type ``target``) holding only the row ``_KEPT``."""
    src_dsn, src = sqlite_db(name)
    src.execute(f"CREATE TABLE s (id INTEGER PRIMARY KEY, v {declared})")
    src.executemany("INSERT INTO s VALUES (?, ?)", list(enumerate(values, 1)))
    schema = pg.schema()
    pg.run(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v {})").format(
            sql.Identifier(schema, "t"), sql.SQL(target)
        )
    )
    if target == "text":
        pg.run(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(sql.Identifier(schema, "t")), _KEPT)
    return src_dsn, schema


def _kinds_write(
    src_dsn: str, pg: Pg, schema: str, mode: str, accept: tuple[str, ...] = ()
):  # type: ignore[no-untyped-def]
    options = SinkOptions(accept_narrowing=accept)
    with (
        open_source(SourceSpec("src", TableRef(None, "s")), src_dsn) as source,
        _sink(pg.dsn, mode, table="t", schema=schema, options=options) as sink,
    ):
        if mode == "full_refresh":
            return sink.write_all(source)
        return sink.write_chunk(source, ChunkWindow("id", "integer", 1, 100))


def _t_rows(pg: Pg, schema: str) -> list[tuple[object, ...]]:
    return [
        tuple(row)
        for row in pg.rows(
            sql.SQL("SELECT id, v FROM {} ORDER BY id").format(sql.Identifier(schema, "t"))
        )
    ]


@pytest.mark.postgres
@pytest.mark.parametrize("declared", ["TEXT", "BLOB", ""])
@pytest.mark.parametrize("mode", [*MODES, "full_refresh"])
def test_sqlite_bytes_into_a_postgres_text_column_fail_the_chunk(
    sqlite_db: MakeDb, pg: Pg, mode: str, declared: str
) -> None:
    """A blob (in any declared type: SQLite keeps a blob a blob) bound for a text column would
    be stored as the text '\\x616263', which hashes like the blob on both sides: the chunk is
    refused and rolled back, naming the column, never the value."""
    src_dsn, schema = _kinds_case(sqlite_db, pg, declared, "text", [b"abc", b"\x00", "plain"])
    with pytest.raises(DponeError) as caught:
        _kinds_write(src_dsn, pg, schema, mode)
    assert caught.value.code == errors.SINK_FAILED
    assert "column 'v'" in caught.value.message and "not bytea" in caught.value.message
    shown = caught.value.message.replace(schema, "<schema>")  # the random name may hold "abc"
    assert "616263" not in shown and "abc" not in shown
    assert _t_rows(pg, schema) == [_KEPT]


@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["replace", "full_refresh"])
def test_sqlite_text_into_a_postgres_bytea_column_fails_the_chunk(
    sqlite_db: MakeDb, pg: Pg, mode: str
) -> None:
    """Text bound for bytea is read as a bytea literal: '\\x41' would be the one byte 0x41 and
    hash like the text. Untyped SQLite columns are not described, so the value decides."""
    src_dsn, schema = _kinds_case(sqlite_db, pg, "", "bytea", ["\\x4243", b"ok"])
    with pytest.raises(DponeError) as caught:
        _kinds_write(src_dsn, pg, schema, mode)
    assert caught.value.code == errors.SINK_FAILED
    assert "column 'v'" in caught.value.message and "str values for a bytea column" in (
        caught.value.message
    )
    assert "4243" not in caught.value.message.replace(schema, "<schema>")
    assert _t_rows(pg, schema) == []


@pytest.mark.postgres
def test_sqlite_bytes_into_bytea_and_text_into_text_still_move(sqlite_db: MakeDb, pg: Pg) -> None:
    """What a column keeps passes as before, NULLs included: blobs into bytea, text that looks
    like hex into text."""
    src_dsn, schema = _kinds_case(sqlite_db, pg, "", "bytea", [b"abc", b"\x00", None])
    written = _kinds_write(src_dsn, pg, schema, "replace")
    assert written.rows == 3 and written.checksum == written.source_checksum
    assert _t_rows(pg, schema) == [(1, b"abc"), (2, b"\x00"), (3, None)]
    src_dsn, schema = _kinds_case(sqlite_db, pg, "TEXT", "text", ["\\x616263", None], "src2")
    written = _kinds_write(src_dsn, pg, schema, "merge")
    assert written.rows == 2 and written.checksum == written.source_checksum
    assert _t_rows(pg, schema) == [(1, "\\x616263"), (2, None), _KEPT]


@pytest.mark.postgres
def test_sqlite_bytes_into_an_accepted_text_column_store_their_hex_text(
    sqlite_db: MakeDb, pg: Pg
) -> None:
    """sink.accept_narrowing names the column: what Postgres makes of the bytes is accepted."""
    src_dsn, schema = _kinds_case(sqlite_db, pg, "BLOB", "text", [b"abc"])
    assert _kinds_write(src_dsn, pg, schema, "replace", accept=("v",)).rows == 1
    assert _t_rows(pg, schema) == [(1, "\\x616263"), _KEPT]


@pytest.mark.postgres
@pytest.mark.parametrize("mode", [*MODES, "full_refresh"])
@pytest.mark.parametrize(
    ("target", "value", "named"),
    [
        ("text", "leak\x00zzsecret", "column 'v': a text value holds a NUL character"),
        ("date", "2023-13-45zzsecret", 'column "v"'),  # the server's COPY context names it
    ],
)
def test_a_value_postgres_cannot_store_fails_the_chunk_naming_its_column_not_the_value(
    sqlite_db: MakeDb, pg: Pg, mode: str, target: str, value: str, named: str
) -> None:
    """A NUL character has no place in Postgres text (psycopg refuses it), and a date with
    month 13 none in a date (the server's COPY does): either fails the chunk, naming the column,
    never the value."""
    src_dsn, schema = _kinds_case(sqlite_db, pg, "TEXT", target, ["2023-01-02", value])
    with pytest.raises(DponeError) as caught:
        _kinds_write(src_dsn, pg, schema, mode)
    assert caught.value.code == errors.SINK_FAILED
    assert named in caught.value.message, caught.value.message
    assert "zzsecret" not in caught.value.message and "2023-13" not in caught.value.message
    assert _t_rows(pg, schema) == ([_KEPT] if target == "text" else [])


def _write_s_into_t(
    spec: SourceSpec, src_dsn: str, dst_dsn: str, mode: str, options: SinkOptions
) -> None:
    """The source into SQLite table t: the whole of it (full_refresh) or its ids [1, 100)."""
    with (
        open_source(spec, src_dsn) as source,
        _sink(dst_dsn, mode, table="t", options=options) as sink,
    ):
        if mode == "full_refresh":
            sink.write_all(source)
        else:
            sink.write_chunk(source, ChunkWindow("id", "integer", 1, 100))


@pytest.mark.parametrize("same_file", [False, True], ids=["two-files", "same-file"])
@pytest.mark.parametrize("mode", [*MODES, "full_refresh"])
def test_floats_of_an_untyped_column_into_a_text_column_fail_the_chunk(
    sqlite_db: MakeDb, mode: str, same_file: bool
) -> None:
    """SQLite keeps a float in a TEXT column as its text of 15 significant digits: 0.1 + 0.2
    would be stored as '0.3' and hash as the float's own 15 digits do, so the gate cannot see
    it. An untyped source column (no preflight rule applies) is looked at by value: the chunk
    fails, rolled back, naming the column; integers and text move, and an accepted column
    stores SQLite's text. Compared with sqlite3, outside dpone."""
    src_dsn, src = sqlite_db("src")
    dst_dsn, dst = (src_dsn, src) if same_file else sqlite_db("dst")
    src.execute("CREATE TABLE s (id INTEGER PRIMARY KEY, v)")
    dst.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    dst.execute("INSERT INTO t VALUES (500, 'kept')")
    src.executemany("INSERT INTO s VALUES (?, ?)", [(1, "text"), (2, 7), (3, 0.1 + 0.2)])

    def write(options: SinkOptions) -> None:
        _write_s_into_t(SourceSpec("src", TableRef(None, "s")), src_dsn, dst_dsn, mode, options)

    with pytest.raises(DponeError) as caught:
        write(SinkOptions())
    assert caught.value.code == errors.SINK_FAILED
    assert "column 'v'" in caught.value.message and "15 significant digits" in caught.value.message
    assert dst.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(500, "kept")]
    src.execute("UPDATE s SET v = 2.5 WHERE id = 3")  # exact in 15 digits: still a float
    with pytest.raises(DponeError):
        write(SinkOptions())
    src.execute("DELETE FROM s WHERE id = 3")
    write(SinkOptions())
    moved = dst.execute("SELECT id, v, typeof(v) FROM t WHERE id < 100 ORDER BY id").fetchall()
    assert moved == [(1, "text", "text"), (2, "7", "text")]
    src.execute("INSERT INTO s VALUES (3, 0.1 + 0.2)")
    dst.execute("DELETE FROM t WHERE id < 100")  # append would add the moved rows again
    write(SinkOptions(accept_narrowing=("v",)))
    assert dst.execute("SELECT v FROM t WHERE id = 3").fetchone() == ("0.3",)


@pytest.mark.postgres
@pytest.mark.parametrize("mode", [*MODES, "full_refresh"])
def test_a_float_nan_into_sqlite_fails_the_chunk(sqlite_db: MakeDb, pg: Pg, mode: str) -> None:
    """Regression: SQLite stores a float NaN as NULL, and under read_back: count (equal row
    counts) a Postgres double 'NaN' passed as NULL. The chunk fails, rolled back, naming the
    column; infinities move as they are, and an accepted column stores NULL. Read with sqlite3."""
    schema = pg.schema()
    pg.run(f"CREATE TABLE {schema}.s (id integer PRIMARY KEY, v double precision)")
    pg.run(f"INSERT INTO {schema}.s VALUES (1, 'Infinity'), (2, 1.5), (3, 'NaN'), (4, NULL)")
    dst_dsn, dst = sqlite_db("dst")
    dst.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v REAL)")
    dst.execute("INSERT INTO t VALUES (500, 0.5)")

    def write(options: SinkOptions) -> None:
        _write_s_into_t(SourceSpec("src", TableRef(schema, "s")), pg.dsn, dst_dsn, mode, options)

    with pytest.raises(DponeError) as caught:
        write(SinkOptions(read_back="count"))
    assert caught.value.code == errors.SINK_FAILED
    assert "column 'v'" in caught.value.message and "NaN" in caught.value.message
    assert dst.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(500, 0.5)]
    pg.run(f"DELETE FROM {schema}.s WHERE id = 3")
    write(SinkOptions(read_back="count"))
    moved = dst.execute("SELECT id, v FROM t WHERE id < 100 ORDER BY id").fetchall()
    assert moved == [(1, float("inf")), (2, 1.5), (4, None)]
    pg.run(f"INSERT INTO {schema}.s VALUES (3, 'NaN')")
    dst.execute("DELETE FROM t WHERE id < 100")  # append would add the moved rows again
    write(SinkOptions(read_back="count", accept_narrowing=("v",)))
    assert dst.execute("SELECT v FROM t WHERE id = 3").fetchone() == (None,)


@pytest.mark.parametrize("same_file", [False, True], ids=["two-files", "same-file"])
def test_integer_windows_past_64_bits_take_the_extreme_ids(
    sqlite_db: MakeDb, same_file: bool
) -> None:
    """Regression: the end 2**63, the only one that takes the largest 64-bit id in, failed every
    write and verify with OverflowError (SQLite binds 64-bit integers only). Bounds past 64 bits
    hold the rows they say, at both ends; compared with sqlite3, outside dpone."""
    top, bottom = 2**63 - 1, -(2**63)
    src_dsn, src = sqlite_db("src")
    dst_dsn, dst = (src_dsn, src) if same_file else sqlite_db("dst")
    src.execute("CREATE TABLE s (id INTEGER PRIMARY KEY, v TEXT)")
    src.executemany(
        "INSERT INTO s VALUES (?, ?)",
        [(bottom, "min"), (bottom + 1, "min1"), (0, "zero"), (top - 1, "max1"), (top, "max")],
    )
    dst.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    with (
        open_source(SourceSpec("src", TableRef(None, "s")), src_dsn) as source,
        _sink(dst_dsn, "replace", table="t") as sink,
    ):
        for lower, upper in ((top - 7, 2**63), (-(2**64), bottom + 1)):
            window = ChunkWindow("id", "integer", lower, upper)
            written = sink.write_chunk(source, window)
            assert written.checksum == source.checksum(window)
    moved = dst.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    assert moved == [(bottom, "min"), (top - 1, "max1"), (top, "max")]
