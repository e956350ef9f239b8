"""A set-based group's checksums (ADR 0022) over a table indexed on the chunk column: each
window sums its own range inside one statement, and every value is the one the per-chunk
gate computes for that window alone, on the source and on the target, for each chunk type."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from dpone.connectors.base import ChunkWindow, SinkOptions, SinkSpec, SourceSpec, TableRef
from dpone.connectors.postgres import PostgresSink, PostgresSource, indexed_bound_type
from psycopg import sql

from .support import Pg

pytestmark = pytest.mark.postgres

#: (chunk type, column type, bounds of 6 contiguous windows, a value inside each window)
SHAPES = {
    "date": (
        "date",
        "date",
        [f"2024-01-0{d}" for d in range(1, 8)],
        lambda i, k: f"2024-01-0{i + 1}",
    ),
    "timestamp": (
        "timestamp",
        "timestamp(6)",
        [f"2024-03-10T0{h}:00:00Z" for h in range(0, 7)],
        lambda i, k: f"2024-03-10 0{i}:{k % 60:02d}:59.999999",
    ),
    "timestamptz": (
        "timestamp",
        "timestamptz",
        [f"2024-03-10T0{h}:00:00Z" for h in range(0, 7)],
        lambda i, k: f"2024-03-10 0{i}:{k % 60:02d}:00+00",
    ),
    "integer": ("integer", "integer", [0, 10, 20, 30, 40, 50, 60], lambda i, k: str(i * 10 + k)),
}


def _tables(pg: Pg, column_type: str, value: Any, index: str | None) -> str:
    schema = pg.schema()
    for name in ("src", "dst"):
        pg.run(
            f"CREATE TABLE {schema}.{name} (id int PRIMARY KEY, c {column_type} NOT NULL,"
            " n numeric, t text)"
        )
        if index:
            pg.run(index.format(table=f"{schema}.{name}"))
    rows = [
        (i * 10 + k, value(i, k), None if k % 4 == 0 else f"{k}.50", f'"{k}"' if k % 3 else None)
        for i in range(6)
        if i != 3  # an empty window
        for k in range(10 if column_type == "integer" else 7)
    ]
    with pg.conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {schema}.src VALUES (%s, %s, %s, %s)", rows)
    return schema


def _statements(conn: psycopg.Connection[Any]) -> list[str]:
    """The statements sent on ``conn`` from now on (its cursors' execute, recorded)."""
    seen: list[str] = []
    original = conn.cursor_factory.execute

    def recording(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(query if isinstance(query, str) else query.as_string(self.connection))
        return original(self, query, *args, **kwargs)

    conn.cursor_factory = type("Recording", (conn.cursor_factory,), {"execute": recording})
    return seen


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize(
    "index",
    [
        "CREATE INDEX ON {table} (c)",
        "CREATE INDEX ON {table} (c, id)",
        None,
        "CREATE INDEX ON {table} (id, c)",  # not led by the chunk column
        "CREATE INDEX ON {table} (c) WHERE n IS NOT NULL",  # partial
    ],
)
def test_each_window_gets_what_the_per_chunk_gate_computes(
    pg: Pg, shape: str, index: str | None
) -> None:
    kind, column_type, bounds, value = SHAPES[shape]
    schema = _tables(pg, column_type, value, index)
    windows = [ChunkWindow("c", kind, bounds[i], bounds[i + 1]) for i in range(6)]
    per_window = index is not None and "(c" in index and "WHERE" not in index
    spec = SourceSpec(connection="wh", table=TableRef(schema, "src"))
    for chained, scheme in ((False, "rowsum-pghash64-v1:"), (True, "rowsum-pgchain64-v1:")):
        with PostgresSource(spec, pg.dsn) as source:
            source.chained_checksum = chained  # the form of a Postgres sink's gate: chained
            alone = [source.checksum(window) for window in windows]
            assert all(a.startswith(scheme) for a in alone)
            assert len(set(alone)) == 6  # distinct windows, one of them empty
            with psycopg.connect(pg.dsn) as conn, conn.cursor() as cur:
                element = indexed_bound_type(cur, sql.Identifier(schema, "src"), "c")
                assert (element is not None) == per_window
            statements = _statements(source._conn.get())
            assert source.window_checksums(windows) == alone
            assert source.window_checksums(windows[2:5]) == alone[2:5]
            assert source.window_checksums(windows[:1]) == alone[:1]
            lateral = [s for s in statements if "LATERAL" in s]
            assert len(lateral) == (3 if per_window else 0), statements
    sink_spec = SinkSpec("wh", TableRef(schema, "dst"), "replace")
    with (
        PostgresSource(spec, pg.dsn) as source,
        PostgresSink(sink_spec, pg.dsn, SinkOptions()) as sink,
        psycopg.connect(pg.dsn) as conn,
    ):
        conn.execute("SELECT 1")  # the caller's transaction is open
        statements = _statements(conn)
        writes = sink.write_group(source, windows, conn)
        assert [w.checksum for w in writes] == alone
        assert [w.source_checksum for w in writes] == alone
        assert any("LATERAL" in s for s in statements) == per_window
        conn.rollback()


def test_a_query_source_and_bounds_beyond_bigint_take_the_grouped_scan(pg: Pg) -> None:
    schema = pg.schema()
    pg.run(f"CREATE TABLE {schema}.src (id bigint PRIMARY KEY, n int)")  # indexed
    pg.run(f"INSERT INTO {schema}.src SELECT g, g % 5 FROM generate_series(1, 40) g")
    big = 1 << 63
    windows = [
        ChunkWindow("id", "integer", 0, 20),
        ChunkWindow("id", "integer", 20, big),
        ChunkWindow("id", "integer", big, big + 5),
    ]
    query = SourceSpec(connection="wh", query=f"SELECT id, n FROM {schema}.src")
    table = SourceSpec(connection="wh", table=TableRef(schema, "src"))
    for spec in (query, table):
        with PostgresSource(spec, pg.dsn) as source:
            source.window_checksums(windows[:1])  # the index is seen: bigint bounds bind
            if spec is table:
                assert (
                    indexed_bound_type(
                        source._conn.get().cursor(), sql.Identifier(schema, "src"), "id"
                    )
                    == "int8"
                )
            alone = [source.checksum(window) for window in windows]
            statements = _statements(source._conn.get())
            assert source.window_checksums(windows) == alone
            assert not [s for s in statements if "LATERAL" in s]


def test_a_table_sources_checksums_skip_the_null_test_of_its_not_null_columns(pg: Pg) -> None:
    """The source's gate statements (one window, and windows in one statement) take the short
    form for the table's NOT NULL columns (c and id, adjacent in name order: '","' joins them),
    as the target's read-back does; a query source keeps the full form. Same values."""
    kind, column_type, bounds, value = SHAPES["date"]
    schema = _tables(pg, column_type, value, "CREATE INDEX ON {table} (c)")
    windows = [ChunkWindow("c", kind, bounds[i], bounds[i + 1]) for i in range(6)]
    found: dict[str, list[str]] = {}
    for name, spec in (
        ("table", SourceSpec(connection="wh", table=TableRef(schema, "src"))),
        ("query", SourceSpec(connection="wh", query=f"SELECT t, n, id, c FROM {schema}.src")),
    ):
        with PostgresSource(spec, pg.dsn) as source:
            statements = _statements(source._conn.get())
            found[name] = [source.checksum(window) for window in windows]
            assert source.window_checksums(windows) == found[name]
        hashed = [s for s in statements if "sum(hashtextextended(" in s]
        assert len(hashed) == 7, statements
        assert all(("'\",\"'" in s) == (name == "table") for s in hashed), hashed
    assert found["table"] == found["query"]
    assert len(set(found["table"])) == 6
