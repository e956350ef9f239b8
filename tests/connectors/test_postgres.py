"""Postgres -> Postgres on a real server: every inner mode on every path, bounds, failures."""

from __future__ import annotations

import dataclasses
from typing import Any

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
    pair_checksums,
)
from dpone.connectors.base import RowChecksum
from dpone.errors import DponeError
from psycopg import sql

from .support import (
    COLUMNS,
    PG_DDL,
    ROWS,
    SECRET,
    WINDOWS,
    Pg,
    canon,
    create_pg,
    expected,
    pg_rows,
    pg_table,
)

pytestmark = pytest.mark.postgres
MODES = ("replace", "merge", "append")
PATHS = ("insert-select", "copy-same-db", "copy-other-db")
SMALL_BLOCKS = SinkOptions(copy_block_bytes=2048)  # many COPY blocks even for 120 rows


@dataclasses.dataclass
class Route:
    """Source in ``src`` and a sink reached through one of the three write paths."""

    src: Pg
    src_schema: str
    sink: Pg
    sink_schema: str
    sink_dsn: str
    path: str

    @property
    def method(self) -> str:
        return "insert-select" if self.path == "insert-select" else "copy-binary"

    def source(self, **kw: Any) -> Any:
        spec = SourceSpec("src", TableRef(self.src_schema, "orders"), **kw)
        return open_source(spec, self.src.dsn)

    def open_sink(
        self,
        mode: str,
        keys: tuple[str, ...] = ("id",),
        table: str = "orders",
        options: SinkOptions = SMALL_BLOCKS,
    ) -> Any:
        spec = SinkSpec("dst", TableRef(self.sink_schema, table), mode, keys)  # type: ignore[arg-type]
        return open_sink(spec, self.sink_dsn, options)

    def checksums(self, window: ChunkWindow, table: str = "orders") -> tuple[str, str]:
        """The source's and the sink table's checksums of ``window`` in the form the two agree
        on (chained: both are Postgres), as the gate and ``dpone verify`` compare."""
        return pair_checksums(
            (self.src.dsn, TableRef(self.src_schema, "orders")),
            (self.sink.dsn, TableRef(self.sink_schema, table)),
            window.column,
            window.lower,
            window.upper,
        )

    def sink_checksum(self, window: ChunkWindow, table: str = "orders") -> str:
        return self.checksums(window, table)[1]

    def source_checksum(self, window: ChunkWindow) -> str:
        return self.checksums(window)[0]


@pytest.fixture(params=PATHS)
def route(request: pytest.FixtureRequest, pg: Pg, pg_other: Pg) -> Route:
    src_schema = pg.schema()
    create_pg(pg, src_schema)
    if request.param == "copy-other-db":
        sink, sink_dsn = pg_other, pg_other.dsn
    else:
        sink = pg
        sink_dsn = pg.dsn if request.param == "insert-select" else pg.alt_dsn
    sink_schema = sink.schema()
    return Route(pg, src_schema, sink, sink_schema, sink_dsn, request.param)


@pytest.mark.parametrize("chunk_type", sorted(WINDOWS))
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_moves_exactly_the_chunk(route: Route, mode: str, chunk_type: str) -> None:
    window = WINDOWS[chunk_type]
    create_pg(route.sink, route.sink_schema, rows=[])
    with route.source() as source, route.open_sink(mode) as sink:
        result = sink.write_chunk(source, window)
    want = expected(window)
    assert result.rows == len(want) > 0
    assert result.method == route.method
    assert pg_rows(route.sink, route.sink_schema) == want  # nothing outside the window either
    assert result.checksum == route.source_checksum(window) == route.sink_checksum(window)


@pytest.mark.parametrize("chunk_type", sorted(WINDOWS))
def test_bounds_are_half_open(route: Route, chunk_type: str) -> None:
    window = WINDOWS[chunk_type]
    create_pg(route.sink, route.sink_schema, rows=[])
    with route.source() as source, route.open_sink("replace") as sink:
        sink.write_chunk(source, window)
    ids = {int(r[0]) for r in pg_rows(route.sink, route.sink_schema)}
    position = COLUMNS.index(window.column)
    at_lower = {r[0] for r in ROWS if _same(r[position], window.lower)}
    at_upper = {r[0] for r in ROWS if _same(r[position], window.upper)}
    assert at_lower and at_upper, "the test data must sit on both bounds"
    assert at_lower <= ids
    assert not at_upper & ids


def _same(value: Any, bound: Any) -> bool:
    if isinstance(bound, int):
        return bool(value == bound)
    return str(value.isoformat()).replace("+00:00", "Z") == bound


def test_replace_is_idempotent_and_keeps_other_ranges(route: Route) -> None:
    window = WINDOWS["date"]
    stale = [(r[0], *r[1:5], 0, "stale") for r in ROWS]  # every row, wrong values
    extra = [(9000 + i, ROWS[0][1].replace(day=2), ROWS[0][2], 5, "gone", 1, "x") for i in range(3)]
    create_pg(route.sink, route.sink_schema, rows=stale + extra)
    outside_before = [
        r for r in pg_rows(route.sink, route.sink_schema) if r[1] not in _days(window)
    ]
    with route.source() as source, route.open_sink("replace") as sink:
        first = sink.write_chunk(source, window)
        after_first = pg_rows(route.sink, route.sink_schema)
        second = sink.write_chunk(source, window)
    assert first == second
    assert pg_rows(route.sink, route.sink_schema) == after_first
    inside = [r for r in after_first if r[1] in _days(window)]
    assert inside == expected(window)  # the extra rows of the range were deleted
    assert [r for r in after_first if r[1] not in _days(window)] == outside_before


def _days(window: ChunkWindow) -> set[str]:
    return {"2024-01-02", "2024-01-03"} if window.lower == "2024-01-02" else set()


def test_merge_upserts_on_the_keys(route: Route) -> None:
    window = WINDOWS["integer"]
    in_range = [r for r in ROWS if 200 <= r[3] < 500]
    stale = [(r[0], *r[1:5], 1, "stale") for r in in_range[::2]]
    keep = [(5000, ROWS[0][1], ROWS[0][2], 250, "kept", 2, "only in sink")]
    create_pg(route.sink, route.sink_schema, rows=stale + keep)
    with route.source() as source, route.open_sink("merge") as sink:
        result = sink.write_chunk(source, window)
    assert result.rows == len(in_range)
    found = pg_rows(route.sink, route.sink_schema)
    assert [r for r in found if r[0] != "5000"] == expected(window)
    assert [r for r in found if r[0] == "5000"] == canon(keep)  # merge never deletes
    assert result.checksum == route.source_checksum(window)


def test_append_adds_the_chunk_every_time(route: Route) -> None:
    window = WINDOWS["date"]
    create_pg(
        route.sink, route.sink_schema, rows=[], ddl=PG_DDL.replace("bigint PRIMARY KEY", "bigint")
    )
    with route.source() as source, route.open_sink("append", keys=()) as sink:
        sink.write_chunk(source, window)
        sink.write_chunk(source, window)
    found = pg_rows(route.sink, route.sink_schema)
    assert found == sorted(expected(window) * 2, key=lambda r: int(r[0]))


@pytest.mark.parametrize("mode", MODES)
def test_checksum_can_be_switched_off(route: Route, mode: str) -> None:
    window = WINDOWS["timestamp"]
    create_pg(route.sink, route.sink_schema, rows=[])
    with (
        route.source() as source,
        route.open_sink(mode, options=SinkOptions(checksum=False, read_back="off")) as sink,
    ):
        result = sink.write_chunk(source, window)
    assert result.checksum is None
    assert result.rows == len(expected(window))
    assert pg_rows(route.sink, route.sink_schema) == expected(window)


def test_replace_checksum_short_form_for_not_null_columns(route: Route) -> None:
    """A table's NOT NULL columns (read from the catalog) take the cheaper SQL form of the
    joined canonical text; the value is the one the source's full form and Python compute over
    the same rows."""
    window = WINDOWS["date"]
    create_pg(route.sink, route.sink_schema, rows=[])
    with route.source() as source, route.open_sink("replace") as sink:
        result = sink.write_chunk(source, window)
        assert result.checksum == route.source_checksum(window)  # chained: both are Postgres
        table = SourceSpec("dst", TableRef(route.sink_schema, "orders"))
        with open_source(table, route.sink.dsn) as target:
            text = target.checksum(window)  # alone: the joined text
            assert target._not_null == {"id", "order_date", "created_at", "seq"}
        source.agree_checksum(None)  # compared with a side of another kind: the joined text
        assert text == source.checksum(window)  # the query form has no NOT NULL columns
    check = RowChecksum(list(COLUMNS))
    check.add_many(pg_rows(route.sink, route.sink_schema))
    assert text == check.value()


def test_empty_chunk(route: Route) -> None:
    window = ChunkWindow("order_date", "date", "2030-01-01", "2030-02-01")
    create_pg(route.sink, route.sink_schema, rows=[])
    with route.source() as source, route.open_sink("replace") as sink:
        result = sink.write_chunk(source, window)
    assert (result.rows, result.checksum) == (0, "rowsum-pgchain64-v1:0:0000000000000000")


def test_constraint_violation_rolls_back_the_whole_chunk(route: Route) -> None:
    window = WINDOWS["date"]
    poisoned = [r if r[0] != 20 else (*r[:4], SECRET, 9999.99, SECRET) for r in ROWS]
    route.src.run(sql.SQL("DROP TABLE {}").format(pg_table(route.src_schema)))
    create_pg(route.src, route.src_schema, rows=poisoned)
    stale = [(r[0], *r[1:5], 1, "stale") for r in ROWS]
    create_pg(
        route.sink,
        route.sink_schema,
        rows=stale,
        ddl=PG_DDL.replace(
            "payload text", "payload text, CONSTRAINT amount_cap CHECK (amount < 9000)"
        ),
    )
    before = pg_rows(route.sink, route.sink_schema)
    with route.source() as source, route.open_sink("replace") as sink:
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, window)
    assert caught.value.code == errors.SINK_FAILED
    message = caught.value.message
    assert "amount_cap" in message and "CheckViolation" in message and "orders" in message
    for leak in (SECRET, "9999", "postgres@", "127.0.0.1", "password"):
        assert leak not in message
    assert pg_rows(route.sink, route.sink_schema) == before  # the DELETE was rolled back too


def test_unique_violation_hides_the_key_value(route: Route) -> None:
    window = WINDOWS["integer"]
    create_pg(route.sink, route.sink_schema, rows=[r for r in ROWS if r[0] == 33])
    with route.source() as source, route.open_sink("append", keys=()) as sink:
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, window)
    assert caught.value.code == errors.SINK_FAILED
    assert "UniqueViolation" in caught.value.message and "orders_pkey" in caught.value.message
    assert "Key (" not in caught.value.message and "(33)" not in caught.value.message
    assert len(pg_rows(route.sink, route.sink_schema)) == 1


def test_external_transaction_commits_only_with_the_caller(route: Route) -> None:
    window = WINDOWS["timestamp"]
    create_pg(route.sink, route.sink_schema, rows=[])
    caller = psycopg.connect(route.sink.dsn)  # not autocommit: statements open a transaction
    try:
        caller.execute("SET TimeZone = 'America/New_York'")
        caller.commit()
        with route.source() as source, route.open_sink("replace") as sink:
            caller.execute("SELECT 1")
            result = sink.write_chunk(source, window, connection=caller)
            assert caller.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            assert pg_rows(route.sink, route.sink_schema) == []  # invisible before commit
            caller.rollback()
            assert pg_rows(route.sink, route.sink_schema) == []

            caller.execute("SELECT 1")
            again = sink.write_chunk(source, window, connection=caller)
            caller.commit()
        assert again == result
        assert pg_rows(route.sink, route.sink_schema) == expected(window)
        assert caller.execute("SHOW TimeZone").fetchone() == ("America/New_York",)
        assert again.checksum == route.source_checksum(window)
    finally:
        caller.close()


def test_external_connection_must_be_in_a_transaction(route: Route) -> None:
    create_pg(route.sink, route.sink_schema, rows=[])
    idle = psycopg.connect(route.sink.dsn, autocommit=True)
    try:
        with route.source() as source, route.open_sink("replace") as sink:
            with pytest.raises(DponeError) as caught:
                sink.write_chunk(source, WINDOWS["date"], connection=idle)
        assert caught.value.code == errors.CONNECTOR_INVALID
    finally:
        idle.close()


def test_failure_inside_external_transaction_keeps_caller_usable(route: Route) -> None:
    create_pg(route.sink, route.sink_schema, rows=[r for r in ROWS if r[0] == 33])
    caller = psycopg.connect(route.sink.dsn)
    try:
        caller.execute("SELECT 1")
        with route.source() as source, route.open_sink("append", keys=()) as sink:
            with pytest.raises(DponeError):
                sink.write_chunk(source, WINDOWS["integer"], connection=caller)
        # only dpone's savepoint was rolled back: the caller can still record the failure
        assert caller.execute("SELECT 42").fetchone() == (42,)
        caller.rollback()
    finally:
        caller.close()


def test_not_isolated_joins_the_caller_with_the_same_rows_and_checksum(route: Route) -> None:
    """isolated=False (dpone's own ledger transaction): same rows and checksum; dpone's settings
    are SET LOCAL, so they end with the caller's transaction."""
    window = WINDOWS["timestamp"]
    create_pg(route.sink, route.sink_schema, rows=[])
    caller = psycopg.connect(route.sink.dsn)
    try:
        caller.execute("SET TimeZone = 'America/New_York'")
        caller.commit()
        with route.source() as source, route.open_sink("replace") as sink:
            caller.execute("SELECT 1")
            result = sink.write_chunk(source, window, connection=caller, isolated=False)
            assert caller.execute("SHOW TimeZone").fetchone() == ("UTC",)  # until commit
            caller.commit()
        assert pg_rows(route.sink, route.sink_schema) == expected(window)
        assert result.checksum == route.source_checksum(window)
        assert caller.execute("SHOW TimeZone").fetchone() == ("America/New_York",)
        caller.rollback()
    finally:
        caller.close()


def test_not_isolated_failure_leaves_the_caller_to_roll_back(route: Route) -> None:
    create_pg(route.sink, route.sink_schema, rows=[r for r in ROWS if r[0] == 33])
    caller = psycopg.connect(route.sink.dsn)
    try:
        with route.source() as source, route.open_sink("append", keys=()) as sink:
            caller.execute("SELECT 1")
            with pytest.raises(DponeError):
                sink.write_chunk(source, WINDOWS["integer"], connection=caller, isolated=False)
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            caller.execute("SELECT 42")  # no savepoint was rolled back for the caller
        caller.rollback()
        assert len(pg_rows(route.sink, route.sink_schema)) == 1
    finally:
        caller.close()


HOSTILE_SCHEMA = 'we"ird; DROP SCHEMA public --'
HOSTILE_TABLE = "or\"ders'; DROP TABLE canary; --"
HOSTILE_COLUMNS = ('i"d', "da;te", "Amount Total", "x'); DROP TABLE canary; --")


def test_hostile_identifiers_are_quoted(route: Route) -> None:
    import uuid

    suffix = uuid.uuid4().hex[:6]
    src_schema = route.src.schema(HOSTILE_SCHEMA + suffix)
    sink_schema = route.sink.schema(HOSTILE_SCHEMA + suffix + "s")
    canary = route.sink.schema()
    route.sink.run(sql.SQL("CREATE TABLE {}.canary (x int)").format(sql.Identifier(canary)))
    ddl = sql.SQL("CREATE TABLE {} ({} bigint PRIMARY KEY, {} date, {} numeric, {} text)")
    cols = [sql.Identifier(c) for c in HOSTILE_COLUMNS]
    route.src.run(ddl.format(sql.Identifier(src_schema, HOSTILE_TABLE), *cols))
    route.sink.run(ddl.format(sql.Identifier(sink_schema, HOSTILE_TABLE), *cols))
    route.src.run(
        sql.SQL(
            "INSERT INTO {} SELECT g, date '2024-01-01' + g % 3, g, 'v' || g"
            " FROM generate_series(1, 30) g"
        ).format(sql.Identifier(src_schema, HOSTILE_TABLE))
    )
    window = ChunkWindow("da;te", "date", "2024-01-02", "2024-01-03")
    source = open_source(SourceSpec("src", TableRef(src_schema, HOSTILE_TABLE)), route.src.dsn)
    for mode in MODES[:2]:
        spec = SinkSpec("dst", TableRef(sink_schema, HOSTILE_TABLE), mode, ('i"d',))  # type: ignore[arg-type]
        with open_sink(spec, route.sink_dsn) as sink:
            result = sink.write_chunk(source, window)
            assert "no index" in " ".join(sink.preflight("da;te")) or mode == "merge"
        assert result.rows == 10
    source.close()
    assert route.sink.rows(
        sql.SQL("SELECT count(*) FROM {}.canary").format(sql.Identifier(canary))
    ) == [(0,)]
    assert route.sink.rows(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(sink_schema, HOSTILE_TABLE))
    ) == [(10,)]


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_hostile_bound_is_bound_as_data(route: Route, mode: str) -> None:
    """replace fails on the sink's DELETE; append reaches the source's COPY or INSERT..SELECT."""
    canaries = []
    for db in (route.src, route.sink):
        canary = db.schema()
        db.run(sql.SQL("CREATE TABLE {}.canary (x int)").format(sql.Identifier(canary)))
        canaries.append((db, canary))
    create_pg(route.sink, route.sink_schema, rows=ROWS[:5])
    hostile = "2024-01-03'; " + " ".join(f"DROP TABLE {c}.canary;" for _, c in canaries) + " --"
    window = ChunkWindow("order_date", "date", "2024-01-02", hostile)
    with route.source() as source, route.open_sink(mode) as sink:
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, window)
    copy_source = mode == "append" and route.path != "insert-select"
    assert caught.value.code == (errors.SOURCE_FAILED if copy_source else errors.SINK_FAILED)
    assert "InvalidDatetimeFormat" in caught.value.message
    for db, canary in canaries:
        count = sql.SQL("SELECT count(*) FROM {}.canary").format(sql.Identifier(canary))
        assert db.rows(count) == [(0,)]
    assert len(pg_rows(route.sink, route.sink_schema)) == 5


def test_integer_bounds_must_be_integers() -> None:
    with pytest.raises(DponeError) as caught:
        ChunkWindow("seq", "integer", "1; DROP TABLE x", 5)  # type: ignore[arg-type]
    assert caught.value.code == errors.CONNECTOR_INVALID


def test_query_source_with_percent_and_semicolon(route: Route) -> None:
    window = WINDOWS["date"]
    create_pg(route.sink, route.sink_schema, rows=[])
    query = (
        f"SELECT * FROM {sql.Identifier(route.src_schema).as_string(route.src.conn)}.orders"
        " WHERE payload LIKE 'p%' OR payload = '' ;"
    )
    subset = [r for r in ROWS if r[6].startswith("p") or r[6] == ""]
    with (
        open_source(SourceSpec("src", query=query), route.src.dsn) as source,
        route.open_sink("replace") as sink,
    ):
        result = sink.write_chunk(source, window)
        assert result.checksum == source.checksum(window)
    assert pg_rows(route.sink, route.sink_schema) == expected(window, subset)


def test_column_subset_into_a_wider_target(route: Route) -> None:
    window = WINDOWS["date"]
    create_pg(
        route.sink,
        route.sink_schema,
        rows=[],
        ddl=PG_DDL.replace(" NOT NULL", "").replace(
            "payload text", "payload text, loaded_at timestamptz DEFAULT now()"
        ),
    )
    moved = ("id", "order_date", "amount")
    with route.source(columns=moved) as source, route.open_sink("merge") as sink:
        result = sink.write_chunk(source, window)
    _, target = pair_checksums(
        (route.src.dsn, TableRef(route.src_schema, "orders")),
        (route.sink.dsn, TableRef(route.sink_schema, "orders")),
        "order_date",
        window.lower,
        window.upper,
        columns=moved,
    )
    assert result.checksum == target


def test_binary_falls_back_to_text_when_types_differ(route: Route) -> None:
    window = WINDOWS["integer"]
    create_pg(
        route.sink,
        route.sink_schema,
        rows=[],
        ddl=PG_DDL.replace("seq integer", "seq bigint").replace(
            "customer text", "customer varchar(40)"
        ),
    )
    with route.source() as source, route.open_sink("replace") as sink:
        result = sink.write_chunk(source, window)
    assert result.method == ("insert-select" if route.path == "insert-select" else "copy-text")
    assert pg_rows(route.sink, route.sink_schema) == expected(window)
    assert result.checksum == route.source_checksum(window)


def test_timestamp_without_time_zone_is_read_as_utc(route: Route) -> None:
    window = WINDOWS["timestamp"]
    naive = PG_DDL.replace("timestamptz", "timestamp")
    route.src.run(sql.SQL("DROP TABLE {}").format(pg_table(route.src_schema)))
    create_pg(
        route.src,
        route.src_schema,
        rows=[(*r[:2], r[2].replace(tzinfo=None), *r[3:]) for r in ROWS],
        ddl=naive,
    )
    create_pg(route.sink, route.sink_schema, rows=[])  # timestamptz: a real instant
    with route.source() as source, route.open_sink("replace") as sink:
        result = sink.write_chunk(source, window)
    assert pg_rows(route.sink, route.sink_schema) == expected(window)
    assert result.checksum == route.source_checksum(window)


def test_missing_objects_name_the_table(route: Route) -> None:
    create_pg(route.sink, route.sink_schema, rows=[])
    missing = SourceSpec("src", TableRef(route.src_schema, "nope"))
    with open_source(missing, route.src.dsn) as source, route.open_sink("replace") as sink:
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, WINDOWS["date"])
    assert caught.value.code == errors.SOURCE_FAILED
    assert "UndefinedTable" in caught.value.message and "nope" in caught.value.message
    with route.source() as source, route.open_sink("replace", table="absent") as sink:
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, WINDOWS["date"])
    assert caught.value.code == errors.SINK_FAILED
    assert "absent" in caught.value.message


def test_connection_loss_is_reported_and_recovered(route: Route) -> None:
    window = WINDOWS["date"]
    create_pg(route.sink, route.sink_schema, rows=[])
    with route.source() as source, route.open_sink("replace") as sink:
        sink.write_chunk(source, window)
        pid = sink._conn.current.info.backend_pid
        route.sink.run("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, window)
        assert caught.value.code == errors.CONNECTION_FAILED
        assert caught.value.retryable
        assert sink.write_chunk(source, window).rows == len(expected(window))  # reconnected
        if route.path != "insert-select":
            route.src.run(
                "SELECT pg_terminate_backend(%s)", (source._conn.current.info.backend_pid,)
            )
            with pytest.raises(DponeError) as caught:
                sink.write_chunk(source, window)
            assert caught.value.code == errors.CONNECTION_FAILED
            assert sink.write_chunk(source, window).rows == len(expected(window))


def test_unreachable_database_is_a_connection_failure() -> None:
    spec = SinkSpec("dst", TableRef(None, "t"), "replace")
    sink = open_sink(spec, "postgresql://dpone:s3cret-pw@127.0.0.1:1/nodb?connect_timeout=2")
    with pytest.raises(DponeError) as caught:
        sink.preflight("d")
    assert caught.value.code == errors.CONNECTION_FAILED
    assert "s3cret" not in caught.value.message and "127.0.0.1" not in caught.value.message


def test_preflight_warnings(route: Route) -> None:
    create_pg(
        route.sink, route.sink_schema, rows=[], ddl=PG_DDL.replace("bigint PRIMARY KEY", "bigint")
    )
    replace = route.open_sink("replace")
    merge = route.open_sink("merge", keys=("id", "seq"))
    [warning] = replace.preflight("order_date")
    assert (
        "no index on" in warning and "order_date" in warning and "scan the whole table" in warning
    )
    [warning] = merge.preflight("order_date")
    assert "no unique index" in warning
    route.sink.run(
        sql.SQL("CREATE INDEX ON {} (order_date, id)").format(pg_table(route.sink_schema))
    )
    route.sink.run(
        sql.SQL("CREATE UNIQUE INDEX ON {} (seq, id)").format(pg_table(route.sink_schema))
    )
    assert replace.preflight("order_date") == []
    assert merge.preflight("order_date") == []
    assert route.open_sink("append").preflight("order_date") == []
    [missing] = route.open_sink("replace", table="absent").preflight("order_date")
    assert "does not exist" in missing
    replace.close()
    merge.close()


def test_python_checksum_fallback_agrees_with_sql(
    route: Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-UTF-8 database or a big-endian server hashes in Python: the rows read back, the
    value SQL computes (in the chained form two Postgres sides compare in)."""
    from dpone.connectors import postgres

    window = WINDOWS["timestamp"]
    create_pg(route.sink, route.sink_schema, rows=[])
    with route.source() as source, route.open_sink("merge") as sink:
        source.chained_checksum = True  # as the gate's sibling computes it for this sink
        in_server = sink.write_chunk(source, window)
        in_sql = source.checksum(window)
        monkeypatch.setattr(postgres, "sql_checksum_supported", lambda cur: False)
        in_python = sink.write_chunk(source, window)
        assert source.checksum(window) == in_sql
    assert in_server.checksum == in_sql
    assert in_python.checksum == in_python.source_checksum == in_sql
    assert in_python.checksum.startswith("rowsum-pgchain64-v1:")
    assert in_python.rows == in_server.rows


# --- the whole table: Sink.write_all and inner mode full_refresh ----------------------------------
def _stale_target(route: Route, ddl: str = PG_DDL) -> list[tuple[Any, ...]]:
    """A target holding wrong copies of some source rows and rows the source never had."""
    stale = [(r[0], *r[1:5], 0, "stale") for r in ROWS[::3]]
    only_here = [
        (9000 + i, ROWS[0][1].replace(year=2020), ROWS[0][2], -5, "x", 1, "old") for i in range(4)
    ]
    create_pg(route.sink, route.sink_schema, rows=stale + only_here, ddl=ddl)
    return pg_rows(route.sink, route.sink_schema)


def _whole(route: Route) -> tuple[str, str]:
    """Both whole tables' checksums in the form they agree on."""
    return pair_checksums(
        (route.src.dsn, TableRef(route.src_schema, "orders")),
        (route.sink.dsn, TableRef(route.sink_schema, "orders")),
    )


def test_full_refresh_replaces_the_whole_target(route: Route) -> None:
    _stale_target(route)
    with route.source() as source, route.open_sink("full_refresh") as sink:
        result = sink.write_all(source)
        again = sink.write_all(source)
        assert source.checksum(None) == result.checksum
    assert result == again  # a full refresh is idempotent
    assert result.rows == len(ROWS)
    assert result.method == route.method
    assert pg_rows(route.sink, route.sink_schema) == canon(ROWS)  # stale and sink-only rows gone
    assert (result.checksum, result.checksum) == _whole(route)


def test_full_refresh_failure_rolls_back_the_delete_too(route: Route) -> None:
    poisoned = [r if r[0] != 97 else (*r[:4], SECRET, 9999.99, SECRET) for r in ROWS]
    route.src.run(sql.SQL("DROP TABLE {}").format(pg_table(route.src_schema)))
    create_pg(route.src, route.src_schema, rows=poisoned)
    before = _stale_target(
        route,
        PG_DDL.replace("payload text", "payload text, CONSTRAINT amount_cap CHECK (amount < 9000)"),
    )
    with route.source() as source, route.open_sink("full_refresh") as sink:
        with pytest.raises(DponeError) as caught:
            sink.write_all(source)
    assert caught.value.code == errors.SINK_FAILED
    message = caught.value.message
    assert "writing all rows (rolled back)" in message and "amount_cap" in message
    for leak in (SECRET, "9999", "postgres@", "127.0.0.1"):
        assert leak not in message
    assert pg_rows(route.sink, route.sink_schema) == before  # not even the DELETE survived


def test_inner_mode_full_refresh_of_one_chunk_empties_the_rest_of_the_target(route: Route) -> None:
    window = WINDOWS["date"]
    _stale_target(route)
    with route.source() as source, route.open_sink("full_refresh") as sink:
        result = sink.write_chunk(source, window)
    assert pg_rows(route.sink, route.sink_schema) == expected(window)  # nothing outside survives
    assert result.rows == len(expected(window))
    assert result.checksum == route.source_checksum(window) == _whole(route)[1]


def test_full_refresh_of_a_query_keeps_its_percent_signs(route: Route) -> None:
    """Without a window nothing is sent with parameters, so '%' must reach the server single."""
    query = (
        f"SELECT * FROM {sql.Identifier(route.src_schema).as_string(route.src.conn)}.orders"
        " WHERE (payload LIKE 'p%' OR payload = '') AND length('%') = 1 ;"
    )
    subset = [r for r in ROWS if r[6].startswith("p") or r[6] == ""]
    assert 0 < len(subset) < len(ROWS)
    _stale_target(route)
    with (
        open_source(SourceSpec("src", query=query), route.src.dsn) as source,
        route.open_sink("full_refresh") as sink,
    ):
        result = sink.write_all(source)
        assert result.checksum == source.checksum(None)
    assert pg_rows(route.sink, route.sink_schema) == canon(subset)


@pytest.mark.parametrize("mode", ["merge", "append"])
def test_write_all_merges_or_appends_every_row(route: Route, mode: str) -> None:
    keep = [(9000, ROWS[0][1], ROWS[0][2], 1, "kept", 1, "only in sink")]
    create_pg(route.sink, route.sink_schema, rows=keep)
    with route.source() as source, route.open_sink(mode) as sink:
        result = sink.write_all(source)
        assert result.checksum == source.checksum(None)
    assert result.rows == len(ROWS)
    assert pg_rows(route.sink, route.sink_schema) == canon([*ROWS, *keep])


def test_full_refresh_in_an_external_transaction(route: Route) -> None:
    before = _stale_target(route)
    caller = psycopg.connect(route.sink.dsn)
    try:
        caller.execute("SELECT 1")
        with route.source() as source, route.open_sink("full_refresh") as sink:
            result = sink.write_all(source, connection=caller)
        assert pg_rows(route.sink, route.sink_schema) == before  # readers see the old rows
        caller.commit()
    finally:
        caller.close()
    assert result.rows == len(ROWS)
    assert pg_rows(route.sink, route.sink_schema) == canon(ROWS)


def test_concurrent_full_refreshes_queue_instead_of_duplicating(route: Route) -> None:
    """Without the table lock the second DELETE would miss the first one's new rows: a target
    without a unique key would end up holding the source twice."""
    import threading
    import time

    _stale_target(route, PG_DDL.replace("bigint PRIMARY KEY", "bigint"))
    first = psycopg.connect(route.sink.dsn)
    outcome: list[object] = []
    try:
        first.execute("SELECT 1")
        with route.source() as source, route.open_sink("full_refresh") as sink:
            sink.write_all(source, connection=first)  # deleted and inserted, not committed

        def second() -> None:
            with route.source() as source, route.open_sink("full_refresh") as sink:
                try:
                    outcome.append(sink.write_all(source))
                except DponeError as exc:  # pragma: no cover - reported below
                    outcome.append(exc)

        thread = threading.Thread(target=second)
        thread.start()
        waiting = sql.SQL(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = {}::regclass"
        ).format(sql.Literal(pg_table(route.sink_schema).as_string(route.sink.conn)))
        deadline = time.monotonic() + 30
        while route.sink.rows(waiting) != [(1,)]:
            assert time.monotonic() < deadline, "the second refresh never queued on the lock"
            time.sleep(0.05)
        assert len(pg_rows(route.sink, route.sink_schema)) == 4 + len(ROWS[::3])  # reads go on
        first.commit()
        thread.join(60)
        assert not thread.is_alive()
    finally:
        first.close()
    [written] = outcome
    assert not isinstance(written, DponeError), written
    assert pg_rows(route.sink, route.sink_schema) == canon(ROWS)  # once, not twice


def test_the_ledgers_session_carries_the_text_forms_so_no_set_local_is_sent(route: Route) -> None:
    """The ledger sets dpone's text-form settings at connect and marks its session; a chunk
    written inside its transaction then sends none of them (its one set_config bounds the
    lock waits, DPONE_FENCE_LOCK_TIMEOUT), and still hashes the same."""
    from dpone.ledger.postgres import PostgresLedger
    from dpone.lifecycle.session_limits import TEXT_FORM_SETTINGS, has_text_forms

    from tests.pg import fresh_schema

    window = WINDOWS["timestamp"]
    create_pg(route.sink, route.sink_schema, rows=[])
    with fresh_schema(route.sink.dsn) as schema, PostgresLedger(route.sink.dsn, schema, 60) as led:
        caller = led._connection()
        assert has_text_forms(caller)
        for name, value in TEXT_FORM_SETTINGS:
            shown = caller.execute("SELECT current_setting(%s)", (name,)).fetchone()
            assert shown is not None and shown[0].replace(" ", "") == value.replace(" ", "")
        caller.rollback()
        sent: list[str] = []

        class SpyCursor(psycopg.Cursor[Any]):
            def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                sent.append(query if isinstance(query, str) else query.as_string(caller))
                return super().execute(query, *args, **kwargs)

        caller.cursor_factory = SpyCursor
        with route.source() as source, route.open_sink("replace") as sink:
            caller.execute("SELECT 1")
            sent.clear()
            result = sink.write_chunk(source, window, connection=caller, isolated=False)
            caller.commit()
        settings = [text for text in sent if "set_config" in text]
        assert sent and len(settings) == 1 and settings[0].count("set_config") == 1, settings
        assert pg_rows(route.sink, route.sink_schema) == expected(window)
        assert result.checksum == route.source_checksum(window)
