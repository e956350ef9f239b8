"""MySQL/MariaDB source and sink against the local server: every mode and chunk type, the
LOAD DATA and INSERT .. SELECT paths, Postgres <-> MySQL, checksum parity across kinds, the sink
fence (claim, superseded attempt, busy row), DSN parsing and secret-free errors."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from dpone import errors
from dpone.connectors import (
    ChunkFence,
    ChunkWindow,
    RowChecksum,
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    open_sink,
    open_source,
    table_checksum,
)
from dpone.connectors.column_types import narrowing
from dpone.connectors.mysql import MysqlDsn, dsn_secrets, parse_dsn, quote
from dpone.credentials import redaction
from dpone.credentials.connections import dsn_kind
from dpone.errors import DponeError
from dpone.ledger.factory import open_store

from .mysql_support import My
from .support import (
    COLUMNS,
    ROWS,
    SECRET,
    WINDOWS,
    Pg,
    canon,
    create_pg,
    expected,
    pg_rows,
)

MY_DDL = """CREATE TABLE {} (
  id bigint PRIMARY KEY,
  order_date date NOT NULL,
  created_at datetime(6) NOT NULL,
  seq int NOT NULL,
  customer text,
  amount decimal(12,2),
  payload text,
  KEY (order_date), KEY (created_at), KEY (seq)
) ENGINE=InnoDB"""
MODES = ("replace", "merge", "append")


@pytest.fixture
def my(mysql_dsn: str) -> Iterator[My]:
    helper = My(mysql_dsn)
    try:
        yield helper
    finally:
        helper.close()


def create_my(my: My, db: str, name: str = "orders", rows: Any = ROWS) -> None:
    my.run(MY_DDL.format(f"`{db}`.`{name}`"))
    if rows:
        cols = ", ".join(COLUMNS)
        marks = ", ".join("%s" for _ in COLUMNS)
        fixed = [
            tuple(
                v.astimezone(dt.UTC).replace(tzinfo=None) if isinstance(v, dt.datetime) else v
                for v in row
            )
            for row in rows
        ]
        my.many(f"INSERT INTO `{db}`.`{name}` ({cols}) VALUES ({marks})", fixed)


def my_rows(my: My, db: str, name: str = "orders") -> list[tuple[Any, ...]]:
    return canon(my.rows(f"SELECT {', '.join(COLUMNS)} FROM `{db}`.`{name}`"))


def sink(dsn: str, mode: str, table: str = "target", options: SinkOptions | None = None) -> Any:
    keys = ("id",) if mode == "merge" else ()
    return open_sink(SinkSpec("dst", TableRef(None, table), mode, keys), dsn, options)  # type: ignore[arg-type]


def source(dsn: str, table: str = "orders") -> Any:
    return open_source(SourceSpec("src", TableRef(None, table)), dsn)


def python_checksum(rows: list[tuple[Any, ...]]) -> str:
    check = RowChecksum(COLUMNS)
    check.add_many(rows)
    return check.value()


# --- DSNs, identifiers, kinds --------------------------------------------------------------------
def test_dsn_parsing_and_secrets() -> None:
    parsed = parse_dsn("mysql://app:p%40ss%3Aword@db.example:3307/sales?connect_timeout=5")
    assert parsed == MysqlDsn(
        "db.example", 3307, "app", "p@ss:word", "sales", (("connect_timeout", "5"),)
    )
    assert "p@ss" not in repr(parsed)
    assert dsn_secrets("mariadb://app:s3cret@h/db") == ("s3cret",)
    assert dsn_secrets("mysql://app@h/db") == ()
    for dsn in ("mysql://app:p%40ss%3Aword@h:3307/db", "mariadb://app:S3cr3t@h/db?ssl_ca=/ca"):
        assert set(dsn_secrets(dsn)) <= redaction.secret_parts(dsn)  # the central registry
        assert dsn_secrets(dsn)[0] not in redaction.redact_text(f"failed: {dsn}")
    assert dsn_kind("mysql://h/db") == dsn_kind("MariaDB://h/db") == "mysql"
    with pytest.raises(DponeError) as bad:
        parse_dsn("mysql://app:pw@h/db?password_hint=TOPSECRET")
    assert bad.value.code == errors.CONFIG_INVALID and "TOPSECRET" not in bad.value.message
    with pytest.raises(DponeError) as port:
        parse_dsn("mysql://app:pw@h:99999999/db")
    assert port.value.code == errors.CONFIG_INVALID


def test_identifiers_are_backticked_and_validated() -> None:
    assert quote("we`ird name", "column") == "`we``ird name`"
    for name in ("x" * 65, "", "trailing ", "nul\x00"):
        with pytest.raises(DponeError) as bad:
            quote(name, "column")
        assert bad.value.code == errors.IDENTIFIER_INVALID


def test_a_mysql_ledger_is_refused(mysql_dsn: str) -> None:
    with pytest.raises(DponeError) as refused:
        open_store("audit_schema", dsn=mysql_dsn + "dpone_audit", schema=None, path=None)
    assert refused.value.code == errors.LEDGER_UNAVAILABLE
    assert "Postgres or MSSQL" in refused.value.message


# --- moving rows ----------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_type", sorted(WINDOWS))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ["load-data", "same-dsn", "same-server"])
def test_mysql_to_mysql_every_mode(my: My, mode: str, chunk_type: str, path: str) -> None:
    """load-data: another DSN string (rows stream through dpone); same-dsn and same-server (the
    source table in another database of the same server and account): INSERT .. SELECT."""
    src_db = my.database()
    dst_db = src_db if path == "same-dsn" else my.database()
    create_my(my, src_db)
    create_my(my, dst_db, "target", rows=[])
    src_dsn = my.dsn(src_db) + ("?connect_timeout=9" if path == "load-data" else "")
    window = WINDOWS[chunk_type]
    with source(src_dsn) as src, sink(my.dsn(dst_db), mode) as dst:
        written = dst.write_chunk(src, window)
        again = dst.write_chunk(src, window) if mode != "append" else written
    want = expected(window)
    assert written.method == ("load-data" if path == "load-data" else "insert-select")
    assert written.rows == len(want) and again.rows == len(want)
    assert my_rows(my, dst_db, "target") == want
    assert written.checksum == again.checksum == python_checksum(_window_rows(window))
    assert written.checksum == table_checksum(
        my.dsn(src_db), TableRef(None, "orders"), window.column, window.lower, window.upper
    )


def _window_rows(window: ChunkWindow) -> list[tuple[Any, ...]]:
    from .support import in_window

    return [r for r in ROWS if in_window(r, window)]


def test_checksum_equals_postgres_for_the_same_rows(my: My, pg: Pg) -> None:
    db = my.database()
    create_my(my, db)
    schema = pg.schema()
    create_pg(pg, schema)
    for window in WINDOWS.values():
        mine = table_checksum(
            my.dsn(db), TableRef(None, "orders"), window.column, window.lower, window.upper
        )
        theirs = table_checksum(
            pg.dsn, TableRef(schema, "orders"), window.column, window.lower, window.upper
        )
        assert mine == theirs
    assert table_checksum(my.dsn(db), TableRef(None, "orders")) == table_checksum(
        pg.dsn, TableRef(schema, "orders")
    )


@pytest.mark.parametrize("mode", MODES)
def test_postgres_to_mysql_and_back(my: My, pg: Pg, mode: str) -> None:
    db = my.database()
    create_my(my, db, "target", rows=[])
    create_my(my, db, "orders")
    schema = pg.schema()
    create_pg(pg, schema)
    create_pg(pg, schema, "target", rows=[])
    window = WINDOWS["timestamp"]
    keys = ("id",) if mode == "merge" else ()
    pg_src = open_source(SourceSpec("pg", TableRef(schema, "orders")), pg.dsn)
    with pg_src, sink(my.dsn(db), mode) as dst:
        into_mysql = dst.write_chunk(pg_src, window)
    assert into_mysql.method == "load-data"
    assert my_rows(my, db, "target") == expected(window)
    pg_dst = open_sink(SinkSpec("pg", TableRef(schema, "target"), mode, keys), pg.dsn)  # type: ignore[arg-type]
    with source(my.dsn(db)) as my_src, pg_dst:
        into_pg = pg_dst.write_chunk(my_src, window)
    assert pg_rows(pg, schema, "target") == expected(window)
    assert into_mysql.checksum == into_pg.checksum


def test_merge_updates_existing_rows_and_keeps_others(my: My) -> None:
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=[])
    my.run(
        f"INSERT INTO `{db}`.target VALUES (1, '2024-01-01', '2024-01-01', 1, 'old', 1, 'old'),"
        " (100000, '2024-01-01', '2024-01-01', 1, 'keep', 1, 'keep')"
    )
    window = ChunkWindow("id", "integer", 1, 11)
    other = my.dsn(db) + "?connect_timeout=7"  # another DSN string: the LOAD DATA path
    with source(other) as src, sink(my.dsn(db), "merge") as dst:
        written = dst.write_chunk(src, window)
    assert written.method == "load-data" and written.rows == 10
    got = my.rows(f"SELECT id, customer FROM `{db}`.target ORDER BY id")
    assert len(got) == 11 and got[-1] == (100000, "keep")
    assert got[0][1] == ROWS[0][4]


def test_binary_values_take_the_executemany_path(my: My) -> None:
    db = my.database()
    my.run(f"CREATE TABLE `{db}`.blobs (id int PRIMARY KEY, data blob, note varchar(20))")
    my.run(f"CREATE TABLE `{db}`.copy (id int PRIMARY KEY, data blob, note varchar(20))")
    data = [(i, bytes([i, 0, 9, 10, 92, 255]), f"n\t{i}") for i in range(1, 6)]
    my.many(f"INSERT INTO `{db}`.blobs VALUES (%s, %s, %s)", data)
    other = my.dsn(db) + "?connect_timeout=9"
    with source(other, "blobs") as src, sink(my.dsn(db), "replace", "copy") as dst:
        written = dst.write_chunk(src, ChunkWindow("id", "integer", 1, 6))
    assert written.rows == 5
    assert my.rows(f"SELECT id, data, note FROM `{db}`.copy ORDER BY id") == [
        (i, b, n) for i, b, n in data
    ]


# --- fence ----------------------------------------------------------------------------------------
def test_fence_claims_and_refuses_a_superseded_attempt(my: My) -> None:
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=[])
    window = WINDOWS["integer"]
    other = my.dsn(db) + "?connect_timeout=8"
    with source(other) as src, sink(my.dsn(db), "replace") as dst:
        first = dst.write_chunk(src, window, fence=ChunkFence("run-1:1", 3, 2))
        assert my.rows(f"SELECT attempt FROM `{db}`.dpone_chunk_fence") == [(2,)]
        my.run(f"DELETE FROM `{db}`.target")
        with pytest.raises(DponeError) as lost:
            dst.write_chunk(src, window, fence=ChunkFence("run-1:1", 3, 1))
        assert lost.value.code == errors.CHUNK_LEASE_LOST
        assert "superseded by attempt 2" in lost.value.message
        assert my.rows(f"SELECT count(*) FROM `{db}`.target") == [(0,)]  # rolled back
        again = dst.write_chunk(src, window, fence=ChunkFence("run-1:1", 3, 4))
    assert first.rows == again.rows == len(expected(window))
    assert my.rows(f"SELECT attempt FROM `{db}`.dpone_chunk_fence") == [(4,)]


def test_fence_waits_for_a_concurrent_attempt_then_reports_busy(
    my: My, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open transaction holding the fence row (a frozen attempt) makes the newer attempt wait
    DPONE_FENCE_LOCK_TIMEOUT, then BUSY with nothing written; once it ends, the attempt goes on."""
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=[])
    window = WINDOWS["integer"]
    other = my.dsn(db) + "?connect_timeout=8"
    with source(other) as src, sink(my.dsn(db), "replace") as dst:
        dst.write_chunk(src, window, fence=ChunkFence("run-2:1", 7, 1))
    my.run(f"DELETE FROM `{db}`.target")
    holder = pymysql.connect(**parse_dsn(my.dsn(db)).connect_args())
    holder.begin()
    with holder.cursor() as cur:
        cur.execute("SELECT * FROM dpone_chunk_fence WHERE chunk_index = 7 FOR UPDATE")
    monkeypatch.setenv("DPONE_FENCE_LOCK_TIMEOUT", "1")
    with source(other) as src, sink(my.dsn(db), "replace") as dst:
        started = time.monotonic()
        with pytest.raises(DponeError) as busy:
            dst.write_chunk(src, window, fence=ChunkFence("run-2:1", 7, 2))
        assert busy.value.code == errors.CHUNK_BUSY and busy.value.retryable
        assert 0.9 < time.monotonic() - started < 10
        assert my.rows(f"SELECT count(*) FROM `{db}`.target") == [(0,)]
    monkeypatch.setenv("DPONE_FENCE_LOCK_TIMEOUT", "30")
    with source(other) as src, sink(my.dsn(db), "replace") as dst:
        threading.Timer(1.0, holder.rollback).start()
        done = dst.write_chunk(src, window, fence=ChunkFence("run-2:1", 7, 2))  # waits, then goes
    holder.close()
    assert done.rows == len(expected(window))
    assert my.rows(f"SELECT campaign, chunk_index, attempt FROM `{db}`.dpone_chunk_fence") == [
        ("run-2:1", 7, 2)
    ]


def test_fence_rows_are_per_campaign_and_chunk(my: My) -> None:
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=[])
    window = WINDOWS["integer"]
    with source(my.dsn(db) + "?connect_timeout=8") as src, sink(my.dsn(db), "replace") as dst:
        dst.write_chunk(src, window, fence=ChunkFence("bf-a", 3, 5))
        dst.write_chunk(src, window, fence=ChunkFence("bf-b", 3, 1))
        dst.write_chunk(src, window, fence=ChunkFence("bf-a", 4, 1))
    rows = my.rows(
        f"SELECT campaign, chunk_index, attempt FROM `{db}`.dpone_chunk_fence ORDER BY 1, 2"
    )
    assert rows == [("bf-a", 3, 5), ("bf-a", 4, 1), ("bf-b", 3, 1)]


def test_two_attempts_racing_serialize_on_the_fence(my: My) -> None:
    """Both attempts run at once; one attempt's rows stand, never both."""
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=[])
    my.run(f"ALTER TABLE `{db}`.target DROP PRIMARY KEY")  # so a duplicate append would show
    window = WINDOWS["integer"]
    outcomes: dict[int, str] = {}

    def attempt(n: int) -> None:
        with (
            source(my.dsn(db) + f"?connect_timeout={10 + n}") as src,
            sink(my.dsn(db), "append") as dst,
        ):
            try:
                dst.write_chunk(src, window, fence=ChunkFence("run-3:1", 1, n))
                outcomes[n] = "committed"
            except DponeError as exc:
                outcomes[n] = exc.code

    threads = [threading.Thread(target=attempt, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    count = my.rows(f"SELECT count(*) FROM `{db}`.target")[0][0]
    assert count == len(expected(window))  # append is not idempotent: the fence keeps it once
    if outcomes[1] == "committed":  # attempt 1 committed before attempt 2 claimed the chunk
        assert outcomes[2] == errors.APPEND_ALREADY_WRITTEN
    else:  # attempt 2 claimed first: attempt 1 is superseded
        assert (outcomes[1], outcomes[2]) == (errors.CHUNK_LEASE_LOST, "committed")


# --- errors ---------------------------------------------------------------------------------------
def test_errors_are_registered_and_secret_free(my: My) -> None:
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=[])
    poisoned = [(1, dt.date(2024, 1, 2), dt.datetime(2024, 1, 2), 200, SECRET, None, SECRET)]
    my.run(
        f"INSERT INTO `{db}`.target (id, order_date, created_at, seq, customer, payload) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        [1, "2024-01-02", "2024-01-02", 200, SECRET, SECRET],
    )
    other = my.dsn(db) + "?connect_timeout=6"
    window = WINDOWS["integer"]
    with source(other) as src, sink(my.dsn(db), "append") as dst:
        with pytest.raises(DponeError) as dup:
            dst.write_chunk(src, ChunkWindow("id", "integer", 1, 5))
    assert dup.value.code == errors.SINK_FAILED and SECRET not in dup.value.message
    assert dup.value.key_conflict  # LOAD DATA LOCAL skipped the row: its warning says why
    assert my.rows(f"SELECT count(*) FROM `{db}`.target") == [(1,)]  # rolled back
    with source(my.dsn(db)) as src, sink(my.dsn(db), "append") as dst:  # INSERT .. SELECT
        with pytest.raises(DponeError) as dup_select:
            dst.write_chunk(src, ChunkWindow("id", "integer", 1, 5))
    assert dup_select.value.code == errors.SINK_FAILED and dup_select.value.key_conflict
    del poisoned
    with source(other) as src, sink(my.dsn(db), "replace", "missing") as dst:
        with pytest.raises(DponeError) as missing:
            dst.write_chunk(src, window)
    assert missing.value.code == errors.SINK_FAILED and "1146" in missing.value.message
    assert not missing.value.key_conflict
    assert "doesn't exist" in missing.value.message
    wrong = my.server_dsn.replace("root@", "root:Hunter2-pw@") + db
    with source(wrong) as src:
        with pytest.raises(DponeError) as denied:
            src.columns()
    assert denied.value.code == errors.CONNECTION_FAILED
    assert "Hunter2" not in denied.value.message and "root" not in denied.value.message
    long_rows = [(1, "x" * 30)]
    my.run(f"CREATE TABLE `{db}`.wide (id int PRIMARY KEY, v varchar(40))")
    my.run(f"CREATE TABLE `{db}`.narrow (id int PRIMARY KEY, v varchar(5))")
    my.many(f"INSERT INTO `{db}`.wide VALUES (%s, %s)", long_rows)
    with source(other, "wide") as src, sink(my.dsn(db), "replace", "narrow") as dst:
        with pytest.raises(DponeError) as truncated:
            dst.write_chunk(src, ChunkWindow("id", "integer", 0, 5))
    assert truncated.value.code == errors.SINK_FAILED and "xxxxx" not in truncated.value.message
    assert not truncated.value.key_conflict
    assert my.rows(f"SELECT count(*) FROM `{db}`.narrow") == [(0,)]


def test_preflight_warns_about_missing_index_and_unique_key(my: My) -> None:
    db = my.database()
    my.run(f"CREATE TABLE `{db}`.bare (id int, d date)")
    with sink(my.dsn(db), "replace", "bare") as dst:
        assert any("no index" in w for w in dst.preflight("d"))
    with sink(my.dsn(db), "merge", "bare") as dst:
        assert any("no unique index" in w for w in dst.preflight("d"))
    with sink(my.dsn(db), "replace", "absent") as dst:
        assert dst.preflight("d") == ["target table absent does not exist: every chunk will fail"]
    create_my(my, db, "target", rows=[])
    with sink(my.dsn(db), "merge", "target") as dst:
        assert dst.preflight("seq") == []


def test_full_refresh_replaces_every_row(my: My) -> None:
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=ROWS[:3])
    other = my.dsn(db) + "?connect_timeout=5"
    with source(other) as src, sink(my.dsn(db), "full_refresh") as dst:
        written = dst.write_all(src)
    assert written.rows == len(ROWS)
    assert my_rows(my, db, "target") == canon(ROWS)


def test_a_server_refusing_load_data_local_gets_batched_inserts(my: My) -> None:
    """MySQL 8 ships with local_infile=OFF; the client side refuses the same way (error 1148)."""
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=[])
    window = WINDOWS["date"]
    with source(my.dsn(db) + "?connect_timeout=4") as src, sink(my.dsn(db), "replace") as dst:
        dst.db.local_infile = False
        first = dst.write_chunk(src, window)
        again = dst.write_chunk(src, window)
    assert first.method == again.method == "executemany"
    assert my_rows(my, db, "target") == expected(window)
    assert first.checksum == python_checksum(_window_rows(window))


def test_a_deadlock_victim_runs_its_chunk_transaction_again(my: My) -> None:
    """A heavier transaction holds a row of the chunk, the sink claims the fence and waits for
    that row, then the other transaction asks for the fence row: InnoDB breaks the cycle by
    rolling back the lighter sink transaction, which runs again and commits."""
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target")
    my.run(f"CREATE TABLE `{db}`.ballast (id int PRIMARY KEY)")
    window = WINDOWS["integer"]
    holder = pymysql.connect(**parse_dsn(my.dsn(db)).connect_args())
    holder.begin()
    with holder.cursor() as cur:
        cur.executemany("INSERT INTO ballast VALUES (%s)", [(i,) for i in range(3000)])
        cur.execute("SELECT id FROM target WHERE seq = 250 FOR UPDATE")
    outcome: list[Any] = []
    dst = sink(my.dsn(db), "replace")
    src = source(my.dsn(db) + "?connect_timeout=7")
    dst.write_chunk(src, ChunkWindow("seq", "integer", 1, 2), fence=ChunkFence("bf-d", 9, 1))

    def write() -> None:
        outcome.append(dst.write_chunk(src, window, fence=ChunkFence("bf-d", 1, 1)))

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(1.0)  # the sink has claimed chunk 1's fence row and waits for seq 250
    with holder.cursor() as cur:
        cur.execute("SELECT * FROM dpone_chunk_fence WHERE chunk_index = 1 FOR UPDATE")
    time.sleep(0.5)
    holder.rollback()
    writer.join(timeout=60)
    holder.close()
    src.close()
    dst.close()
    assert dst.deadlocks_retried == 1
    assert outcome and outcome[0].rows == len(expected(window))


def test_interrupt_kills_the_statement_in_flight_and_the_chunk_rolls_back(my: My) -> None:
    """What a stop (SIGTERM) does: KILL QUERY from a second connection, then a rollback."""
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=ROWS[:2])
    slow = SourceSpec("src", query="SELECT o.* FROM orders AS o WHERE SLEEP(0.2) = 0")
    failure: list[DponeError] = []
    src = open_source(slow, my.dsn(db) + "?connect_timeout=6")
    dst = sink(my.dsn(db), "replace")

    def write() -> None:
        try:
            dst.write_chunk(src, WINDOWS["integer"])
        except DponeError as exc:
            failure.append(exc)

    writer = threading.Thread(target=write)
    started = time.monotonic()
    writer.start()
    time.sleep(1.0)
    src.interrupt()
    dst.interrupt()
    writer.join(timeout=30)
    elapsed = time.monotonic() - started
    src.close()
    dst.close()
    assert failure and failure[0].code in (errors.SOURCE_FAILED, errors.SINK_FAILED)
    assert "1317" in failure[0].message  # Query execution was interrupted
    assert elapsed < 10  # the full read would take 120 x 0.2 s = 24 s
    assert my_rows(my, db, "target") == canon(ROWS[:2])  # rolled back


FLOATS = [
    (1, "2024-01-01", 1.2345678),
    (2, "2024-01-01", 16777216.0),
    (3, "2024-01-01", 123456789.0),
]


@pytest.mark.parametrize("mode", MODES)
def test_float_columns_move_and_check_their_exact_values(my: My, pg: Pg, mode: str) -> None:
    """Regression: MariaDB's text protocol sends a FLOAT with 6 significant digits, so a stream
    moved 16777216 as 16777200 and the gate, reading both sides the same way, let it pass."""
    src_db, dst_db = my.database(), my.database()
    for db in (src_db, dst_db):
        my.run(f"CREATE TABLE `{db}`.t (id int PRIMARY KEY, d date NOT NULL, f float, KEY (d))")
    my.many(f"INSERT INTO `{src_db}`.t VALUES (%s, %s, %s)", FLOATS)
    schema = pg.schema()
    pg.run(f'CREATE TABLE "{schema}".t (id int PRIMARY KEY, d date NOT NULL, f real)')
    window = ChunkWindow("d", "date", "2024-01-01", "2024-01-02")
    keys = ("id",) if mode == "merge" else ()
    # another host string for the same server: the rows stream through dpone (LOAD DATA)
    streamed = my.dsn(dst_db).replace("127.0.0.1", "localhost")
    assert streamed != my.dsn(dst_db)
    targets = [
        (streamed, TableRef(None, "t")),
        (pg.dsn, TableRef(schema, "t")),
    ]
    exact = "SELECT id, CAST(f AS DOUBLE) FROM `{}`.t ORDER BY id"
    want = my.rows(exact.format(src_db))
    assert [r[1] for r in want] == [pytest.approx(1.2345678, rel=1e-7), 16777216.0, 123456792.0]
    for dsn, table in targets:
        spec = SinkSpec("dst", table, mode, keys)  # type: ignore[arg-type]
        with source(my.dsn(src_db), "t") as src, open_sink(spec, dsn) as dst:
            written = dst.write_chunk(src, window)
        assert written.checksum == written.source_checksum
        if table.schema is None:
            assert written.method == "load-data"
            assert my.rows(exact.format(dst_db)) == want
        else:
            got = pg.rows(f'SELECT id, f::float8 FROM "{schema}".t ORDER BY id')
            assert [tuple(r) for r in got] == [tuple(r) for r in want]
    with source(my.dsn(src_db), "t") as src:
        verified = table_checksum(streamed, TableRef(None, "t"), "d", "2024-01-01", "2024-01-02")
        assert src.checksum(window) == verified


@pytest.mark.parametrize("mode", MODES)
def test_a_postgres_real_moves_into_a_float_with_its_exact_value(my: My, pg: Pg, mode: str) -> None:
    """Postgres ``real`` into MariaDB ``FLOAT``: both hold the same single, and the gate compares
    the single's shortest decimal on both sides (a FLOAT is read as a DOUBLE, never as the text
    protocol's 6 digits), so the chunk passes and the values are equal as doubles."""
    schema, dst_db = pg.schema(), my.database()
    pg.run(f'CREATE TABLE "{schema}".t (id int PRIMARY KEY, d date NOT NULL, f real)')
    pg.run(
        f'INSERT INTO "{schema}".t VALUES'
        " (1, '2024-01-01', 1.2345678), (2, '2024-01-01', 16777216), (3, '2024-01-01', 0.1),"
        " (4, '2024-01-01', NULL), (5, '2024-01-01', -1.17549435e-38)"
    )
    my.run(f"CREATE TABLE `{dst_db}`.t (id int PRIMARY KEY, d date NOT NULL, f float, KEY (d))")
    window = ChunkWindow("d", "date", "2024-01-01", "2024-01-02")
    keys = ("id",) if mode == "merge" else ()
    spec = SinkSpec("dst", TableRef(None, "t"), mode, keys)  # type: ignore[arg-type]
    pg_source = open_source(SourceSpec("src", TableRef(schema, "t")), pg.dsn)
    with pg_source as src, open_sink(spec, my.dsn(dst_db)) as dst:
        written = dst.write_chunk(src, window)
    assert written.checksum == written.source_checksum
    want = pg.rows(f'SELECT id, f::float8 FROM "{schema}".t ORDER BY id')
    got = my.rows(f"SELECT id, CAST(f AS DOUBLE) FROM `{dst_db}`.t ORDER BY id")
    assert [tuple(r) for r in got] == [tuple(r) for r in want]


def test_a_read_only_source_session_refuses_writes(my: My) -> None:
    """Regression: `dpone verify` and the preflight read MySQL/MariaDB in ordinary sessions, so a
    trusted query calling a function that writes wrote on every verify."""
    db = my.database()
    my.run(f"CREATE TABLE `{db}`.log (id int)")
    my.run(
        f"CREATE FUNCTION `{db}`.logit(x int) RETURNS int MODIFIES SQL DATA "
        f"BEGIN INSERT INTO `{db}`.log VALUES (x); RETURN 1; END"
    )
    spec = SourceSpec("src", query=f"SELECT `{db}`.logit(1) AS v")
    with open_source(spec, my.dsn(db)).read_only() as side, pytest.raises(DponeError) as caught:
        side.checksum(None)
    assert caught.value.code == errors.SOURCE_FAILED and "1792" in caught.value.message
    assert my.rows(f"SELECT count(*) FROM `{db}`.log") == [(0,)]
    with open_source(spec, my.dsn(db)) as writing:  # an ordinary session is not refused
        writing.checksum(None)
    assert my.rows(f"SELECT count(*) FROM `{db}`.log")[0][0] > 0


# --- BIT and spatial columns: the driver reads them as bytes --------------------------------------
def _bits_and_points(my: My) -> str:
    db = my.database()
    my.run(f"CREATE TABLE `{db}`.t (id int PRIMARY KEY, b BIT(8), g POINT, w BIT(12))")
    my.run(f"INSERT INTO `{db}`.t VALUES (1, b'01000001', POINT(1, 2), b'101'), (2, NULL, NULL, 0)")
    return db


def test_bit_and_spatial_columns_are_binary_for_the_type_preflight(my: My, pg: Pg) -> None:
    """A MySQL BIT or POINT read as bytes into a Postgres text column would be stored as its
    \\x hex text, which both checksums read alike: the preflight refuses it before anything
    moves (table columns from the catalog, computed ones from the result's metadata)."""
    db = _bits_and_points(my)
    with source(my.dsn(db), "t") as src:
        kinds = src.column_types()
    query = f"SELECT (SELECT b FROM `{db}`.t LIMIT 1) AS b, ST_PointFromText('POINT(1 1)') AS g"
    with open_source(SourceSpec("src", query=query), my.dsn(db)) as src:
        computed = src.column_types()
    schema = pg.schema()
    pg.run(f'CREATE TABLE "{schema}".t (b text, g text, r bytea, v varchar(100))')
    with open_source(SourceSpec("dst", TableRef(schema, "t"), role="target"), pg.dsn) as dst:
        target = dst.column_types()
    for found in (kinds, computed):
        assert found["b"] is not None and found["b"].family == "binary" and found["b"].bits == 8
        assert found["g"] is not None and found["g"].family == "binary"
        for name in ("b", "g"):
            for text in ("b", "v"):
                reason = narrowing(found[name], target[text])  # type: ignore[arg-type]
                assert reason is not None and "binary values stored as text" in reason
            assert narrowing(found[name], target["r"]) is None  # type: ignore[arg-type]
    assert kinds["w"] is not None and (kinds["w"].bits, kinds["w"].length) == (12, 2)
    assert narrowing(kinds["b"], kinds["b"]) is None  # type: ignore[arg-type]
    assert narrowing(kinds["w"], kinds["b"]) is not None  # type: ignore[arg-type]


def test_bit_and_spatial_values_into_a_postgres_text_column_fail_the_chunk(my: My, pg: Pg) -> None:
    """Past the preflight (the connectors alone, as a query or accept_narrowing would be), the
    Postgres sink refuses the bytes themselves; into bytea they move and check equal."""
    db = _bits_and_points(my)
    schema = pg.schema()
    pg.run(f'CREATE TABLE "{schema}".txt (id int PRIMARY KEY, b text, g text, w text)')
    pg.run(f'CREATE TABLE "{schema}".raw (id int PRIMARY KEY, b bytea, g bytea, w bytea)')
    window = ChunkWindow("id", "integer", 1, 3)
    for column in ("b", "g"):
        spec = SourceSpec("src", TableRef(None, "t"), columns=("id", column))
        sink_spec = SinkSpec("dst", TableRef(schema, "txt"), "replace")
        with open_source(spec, my.dsn(db)) as src, open_sink(sink_spec, pg.dsn) as dst:
            with pytest.raises(DponeError) as caught:
                dst.write_chunk(src, window)
        assert caught.value.code == errors.SINK_FAILED
        assert f"column {column!r}" in caught.value.message
    assert pg.rows(f'SELECT count(*) FROM "{schema}".txt') == [(0,)]
    sink_spec = SinkSpec("dst", TableRef(schema, "raw"), "replace")
    with source(my.dsn(db), "t") as src, open_sink(sink_spec, pg.dsn) as dst:
        written = dst.write_chunk(src, window)
    assert written.rows == 2 and written.checksum == written.source_checksum
    assert pg.rows(f'SELECT b, w FROM "{schema}".raw ORDER BY id') == [
        (b"A", b"\x00\x05"),
        (None, b"\x00\x00"),
    ]


# --- max_allowed_packet, dead sessions ------------------------------------------------------------
SMALL_PACKET = 1024 * 1024


@pytest.fixture
def small_packets(my: My) -> Iterator[int]:
    """The server's max_allowed_packet at 1 MB for sessions opened during the test (the helper's
    own session, opened before, keeps the old limit), restored afterwards."""
    (old,) = my.rows("SELECT @@global.max_allowed_packet")[0]
    my.run("SET GLOBAL max_allowed_packet = %s", [SMALL_PACKET])
    try:
        yield SMALL_PACKET
    finally:
        my.run("SET GLOBAL max_allowed_packet = %s", [int(old)])


def _blob_tables(my: My, db: str, rows: list[tuple[int, bytes]]) -> None:
    my.run(f"CREATE TABLE `{db}`.blobs (id int PRIMARY KEY, data longblob)")
    my.run(f"CREATE TABLE `{db}`.copy (id int PRIMARY KEY, data longblob)")
    my.many(f"INSERT INTO `{db}`.blobs VALUES (%s, %s)", rows)


@pytest.mark.parametrize("mode", ["replace", "merge"])
def test_a_row_over_max_allowed_packet_fails_its_chunk_alone(
    my: My, small_packets: int, mode: str
) -> None:
    """The probe's case: a row over the packet limit is one stable, non-retryable
    DPONE_SINK_FAILED naming the limit and the chunk (never the row); it is refused before it is
    sent, so the session survives and the next chunks (1-byte rows) commit."""
    db = my.database()
    _blob_tables(my, db, [(1, b"Z" * (small_packets + 4096)), (150, b"\x01"), (250, b"\x02")])
    with (
        source(my.dsn(db) + "?connect_timeout=9", "blobs") as src,
        sink(my.dsn(db), mode, "copy") as dst,
    ):
        for _ in range(2):  # the same every time: nothing a retry could change
            with pytest.raises(DponeError) as big:
                dst.write_chunk(src, ChunkWindow("id", "integer", 1, 101))
            assert big.value.code == errors.SINK_FAILED
            assert not errors.REGISTRY[big.value.code].retryable
            message = big.value.message
            assert f"max_allowed_packet of {small_packets} bytes" in message
            assert "packet limit" in message and "chunk id [1, 101)" in message
            assert "ZZZZ" not in message and "5a5a" not in message.replace(db, "").lower()
        second = dst.write_chunk(src, ChunkWindow("id", "integer", 101, 201))
        third = dst.write_chunk(src, ChunkWindow("id", "integer", 201, 301))
    assert second.rows == third.rows == 1
    assert my.rows(f"SELECT id, data FROM `{db}`.copy ORDER BY id") == [
        (150, b"\x01"),
        (250, b"\x02"),
    ]


def test_batched_inserts_stay_under_the_servers_packet_limit(
    my: My, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyMySQL joins rows into statements of up to 1,000 KB; a server whose max_allowed_packet is
    smaller would drop the connection on every batch: statements are capped at the limit."""
    db = my.database()
    rows = [(i, bytes([i % 256]) * 20_000) for i in range(1, 41)]  # 800 KB in all
    _blob_tables(my, db, rows)
    sent: list[int] = []
    query = pymysql.cursors.Cursor._query

    def spy(self: Any, q: Any) -> int:
        sent.append(len(q))
        return int(query(self, q))

    monkeypatch.setattr(pymysql.cursors.Cursor, "_query", spy)
    limit = 100_000
    with (
        source(my.dsn(db) + "?connect_timeout=9", "blobs") as src,
        sink(my.dsn(db), "replace", "copy") as dst,
    ):
        dst.db.get()
        dst.db.packet_limit = limit  # as if the server's were 100 KB
        written = dst.write_chunk(src, ChunkWindow("id", "integer", 1, 41))
    assert written.rows == 40
    inserts = [size for size in sent if size > 20_000]
    assert len(inserts) > 1 and max(inserts) + 1 < limit
    assert my.rows(f"SELECT count(*), sum(length(data)) FROM `{db}`.copy") == [(40, 800_000)]


def test_a_packet_error_reported_by_the_server_is_not_retryable(my: My) -> None:
    """Error 1153 (the server read a packet over its limit) is the packet limit, not a lost
    connection; a genuine loss (2013) stays DPONE_CONNECTION_FAILED, retryable."""
    db = my.database()
    with sink(my.dsn(db), "replace", "copy") as dst:
        dst.db.packet_limit = 4096
        what = "sink 'dst': writing chunk id [1, 101) (rolled back)"
        too_large = pymysql.err.OperationalError(
            1153, "Got a packet bigger than 'max_allowed_packet' bytes"
        )
        packet = dst._failure(too_large, what, 1)
        lost = dst._failure(pymysql.err.OperationalError(2013, "Lost connection"), what, 1)
    assert (
        packet.code == errors.SINK_FAILED and "max_allowed_packet of 4096 bytes" in packet.message
    )
    assert what in packet.message
    assert lost.code == errors.CONNECTION_FAILED and errors.REGISTRY[lost.code].retryable


def test_a_chunk_that_leaves_the_session_dead_does_not_fail_the_next(
    my: My, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure that is not itself a connection error (here the source breaks) but finds the
    session dead (the server closed it meanwhile) drops it: the next chunk reconnects instead of
    failing with 'lost the connection' (InterfaceError 0) on the dead session."""
    db = my.database()
    create_my(my, db)
    create_my(my, db, "target", rows=[])
    window = WINDOWS["integer"]
    with source(my.dsn(db) + "?connect_timeout=7") as src, sink(my.dsn(db), "replace") as dst:
        rows = src.rows

        def broken(scope: Any, batch_rows: int) -> Iterator[list[Any]]:
            conn = dst.db.current
            assert conn is not None
            my.run("KILL CONNECTION %s", [int(conn.thread_id())])
            time.sleep(0.3)
            raise RuntimeError("the source broke")
            yield []

        monkeypatch.setattr(src, "rows", broken)
        with pytest.raises(DponeError) as first:
            dst.write_chunk(src, window)
        assert first.value.code == errors.SINK_FAILED
        monkeypatch.setattr(src, "rows", rows)
        written = dst.write_chunk(src, window)
    assert written.rows == len(expected(window))
    assert my_rows(my, db, "target") == expected(window)


@pytest.mark.parametrize("mode", [*MODES, "full_refresh"])
def test_an_unsigned_bigint_beyond_sqlite_integers_fails_naming_its_column(
    my: My, tmp_path: Any, mode: str
) -> None:
    """SQLite binds integers in 64 signed bits: a BIGINT UNSIGNED above that fails the chunk,
    rolled back, naming the column (not a bare OverflowError) and never the value."""
    import sqlite3

    db = my.database()
    my.run(f"CREATE TABLE `{db}`.`big` (id bigint PRIMARY KEY, v bigint unsigned)")
    my.many(f"INSERT INTO `{db}`.`big` VALUES (%s, %s)", [(1, 7), (2, 2**64 - 1)])
    path = tmp_path / "dst.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE target (id INTEGER PRIMARY KEY, v TEXT)")
        conn.execute("INSERT INTO target VALUES (50, 'kept')")
    with source(my.dsn(db), "big") as src, sink(f"sqlite:///{path}", mode) as dst:
        with pytest.raises(DponeError) as caught:
            if mode == "full_refresh":
                dst.write_all(src)
            else:
                dst.write_chunk(src, ChunkWindow("id", "integer", 1, 10))
    message = caught.value.message
    assert caught.value.code == errors.SINK_FAILED
    assert "column 'v'" in message and "64-bit" in message, message
    assert str(2**64 - 1) not in message and "OverflowError" not in message
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT id, v FROM target").fetchall() == [(50, "kept")]


@pytest.mark.parametrize("mode", [*MODES, "full_refresh"])
@pytest.mark.parametrize("path", ["load-data", "insert-select"])
def test_a_dsn_without_a_database_writes_schema_qualified_tables(
    my: My, mode: str, path: str
) -> None:
    """Regression: connectors.md says the DSN's database is optional when every table names its
    database; replace and full_refresh failed every chunk with 1046 (No database selected):
    MariaDB resolves the alias of a multi-table DELETE in the default database."""
    src_db, dst_db = my.database(), my.database()
    create_my(my, src_db)
    create_my(my, dst_db, "target", rows=ROWS[:5])
    src_dsn = my.server_dsn + ("?connect_timeout=9" if path == "load-data" else "")
    keys = ("id",) if mode == "merge" else ()
    spec = SinkSpec("dst", TableRef(dst_db, "target"), mode, keys)  # type: ignore[arg-type]
    window = WINDOWS["integer"]
    with (
        open_source(SourceSpec("src", TableRef(src_db, "orders")), src_dsn) as src,
        open_sink(spec, my.server_dsn) as dst,
    ):
        if mode == "full_refresh":
            written = dst.write_all(src)
            want = my_rows(my, src_db)
        else:
            my.run(f"DELETE FROM `{dst_db}`.target")
            written = dst.write_chunk(src, window)
            want = expected(window)
    assert written.method == path
    assert sorted(my_rows(my, dst_db, "target")) == sorted(want)
