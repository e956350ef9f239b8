"""Read-ahead on a real server: the next chunk read while one is written, between two databases.

The rows written are always the rows of the window asked for: a read-ahead of another window is
dropped, one that failed or outgrew its budget is read again, and the source's connection stays
usable after each.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from dpone import errors
from dpone.connectors import ChunkWindow, SinkSpec, SourceSpec, TableRef, open_sink, open_source
from dpone.errors import DponeError
from psycopg import sql

from .support import Pg, create_pg, expected, pg_rows, pg_table

pytestmark = pytest.mark.postgres

DAYS = [ChunkWindow("order_date", "date", f"2024-01-0{d}", f"2024-01-0{d + 2}") for d in (1, 3, 5)]


class Route:
    def __init__(self, src: Pg, sink: Pg) -> None:
        self.src, self.sink = src, sink
        self.src_schema, self.sink_schema = src.schema(), sink.schema()
        create_pg(src, self.src_schema)
        create_pg(sink, self.sink_schema, rows=[])

    def source(self, query: str | None = None) -> Any:
        if query is None:
            spec = SourceSpec("src", TableRef(self.src_schema, "orders"))
        else:
            spec = SourceSpec("src", query=query)
        return open_source(spec, self.src.dsn)

    def sink_for(self) -> Any:
        spec = SinkSpec("dst", TableRef(self.sink_schema, "orders"), "replace", ("id",))
        return open_sink(spec, self.sink.dsn)

    def written(self, window: ChunkWindow) -> list[tuple[Any, ...]]:
        return pg_rows(self.sink, self.sink_schema, window=window)


@pytest.fixture
def route(pg: Pg, pg_other: Pg) -> Iterator[Route]:
    yield Route(pg, pg_other)


def _backend(source: Any) -> int:
    return int(source._conn.current.info.backend_pid)


def test_the_next_window_is_read_ahead_and_written_as_the_source_holds_it(route: Route) -> None:
    backends = set()
    with route.source() as source, route.sink_for() as sink:
        for i, window in enumerate(DAYS):
            source.expect(DAYS[i + 1] if i + 1 < len(DAYS) else None)
            result = sink.write_chunk(source, window)
            assert result.rows == len(expected(window)) > 0
            if i + 1 < len(DAYS):  # read ahead on the same connection, after this chunk's COPY
                assert source._ahead is not None
                assert source._ahead.key[1] == (DAYS[i + 1].lower, DAYS[i + 1].upper)
            else:
                assert source._ahead is None
            backends.add(_backend(source))
    for window in DAYS:
        assert route.written(window) == expected(window)
    assert len(backends) == 1  # one connection throughout: nothing dropped or reconnected


def test_the_next_window_can_be_named_from_the_rows_the_copy_moved(route: Route) -> None:
    """A function given to expect is asked once the COPY has ended, with the rows it copied;
    the window it names is read ahead, None names none (and only one answer is asked for)."""
    asked: list[int] = []

    def next_window(answer: ChunkWindow | None) -> Any:
        def named(copied: int) -> ChunkWindow | None:
            asked.append(copied)
            return answer

        return named

    with route.source() as source, route.sink_for() as sink:
        source.expect(next_window(DAYS[1]))
        first = sink.write_chunk(source, DAYS[0])
        assert asked == [first.rows] and first.rows == len(expected(DAYS[0])) > 0
        assert source._ahead is not None
        assert source._ahead.key[1] == (DAYS[1].lower, DAYS[1].upper)
        source.expect(next_window(None))
        second = sink.write_chunk(source, DAYS[1])
        assert asked == [first.rows, second.rows] and source._ahead is None
        sink.write_chunk(source, DAYS[2])  # nothing expected: nothing asked
        assert len(asked) == 2 and source._ahead is None
    for window in DAYS:
        assert route.written(window) == expected(window)


def test_a_read_ahead_of_another_window_is_dropped(route: Route) -> None:
    with route.source() as source, route.sink_for() as sink:
        source.expect(DAYS[1])
        sink.write_chunk(source, DAYS[0])
        assert source._ahead is not None
        sink.write_chunk(source, DAYS[2])  # not the window read ahead: dropped, read afresh
        assert source._ahead is None
        sink.write_chunk(source, DAYS[1])
        assert source.columns()  # the connection is usable for other statements too
    for window in DAYS:
        assert route.written(window) == expected(window)


def test_a_chunk_larger_than_the_budget_is_read_again_and_read_ahead_stops(
    route: Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPONE_READ_AHEAD_MB", "0.0001")  # 104 bytes: less than one chunk
    with route.source() as source, route.sink_for() as sink:
        source.expect(DAYS[1])
        sink.write_chunk(source, DAYS[0])
        ahead = source._ahead
        assert ahead is not None
        ahead._thread.join(5)
        assert ahead.overflowed
        source.expect(DAYS[2])
        assert sink.write_chunk(source, DAYS[1]).rows == len(expected(DAYS[1]))
        assert source._ahead is None and source._read_ahead_budget == 0  # off from now on
        assert sink.write_chunk(source, DAYS[2]).rows == len(expected(DAYS[2]))
    for window in DAYS:
        assert route.written(window) == expected(window)


def test_a_read_ahead_cut_off_by_the_server_is_read_again(route: Route) -> None:
    table = sql.Identifier(route.src_schema, "orders").as_string(route.src.conn)
    slow = (  # the later windows sleep first, so the read-ahead is in flight when it is cut
        f"SELECT * FROM {table} WHERE order_date < '2024-01-03' OR (SELECT pg_sleep(0.3)) IS NOT NULL"
    )
    with route.source(slow) as source, route.sink_for() as sink:
        source.expect(DAYS[1])
        sink.write_chunk(source, DAYS[0])
        pid = _backend(source)
        deadline = time.monotonic() + 5
        while not route.src.rows(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND query LIKE 'COPY%%'", (pid,)
        ):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        route.src.run("SELECT pg_terminate_backend(%s)", (pid,))
        assert sink.write_chunk(source, DAYS[1]).rows == len(expected(DAYS[1]))
        assert _backend(source) != pid  # reconnected for the read again
    assert route.written(DAYS[1]) == expected(DAYS[1])


def test_a_window_that_fails_to_read_fails_its_chunk_only(route: Route) -> None:
    table = sql.Identifier(route.src_schema, "orders").as_string(route.src.conn)
    broken = (  # the second window divides by zero, in the read-ahead and in the read again
        f"SELECT * FROM {table} WHERE 1 / (CASE WHEN order_date >= '2024-01-03'"
        " AND order_date < '2024-01-05' THEN 0 ELSE 1 END) = 1"
    )
    with route.source(broken) as source, route.sink_for() as sink:
        source.expect(DAYS[1])
        sink.write_chunk(source, DAYS[0])
        source.expect(DAYS[2])
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, DAYS[1])
        assert caught.value.code == errors.SOURCE_FAILED
        assert "DivisionByZero" in caught.value.message
        assert sink.write_chunk(source, DAYS[2]).rows == len(expected(DAYS[2]))
    assert route.written(DAYS[1]) == []
    assert route.written(DAYS[2]) == expected(DAYS[2])


def test_a_sink_failure_mid_chunk_drops_the_read_ahead_it_was_writing(route: Route) -> None:
    with route.source() as source, route.sink_for() as sink:
        source.expect(DAYS[1])
        sink.write_chunk(source, DAYS[0])
        route.sink.run(  # the sink refuses the second window's rows
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT early CHECK (order_date < '2024-01-03')").format(
                pg_table(route.sink_schema)
            )
        )
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, DAYS[1])
        assert caught.value.code == errors.SINK_FAILED
        assert source._ahead is None
        assert source.columns()  # the source's connection was put back in order
    assert route.written(DAYS[0]) == expected(DAYS[0])
    assert route.written(DAYS[1]) == []


def test_closing_the_source_ends_a_read_ahead_in_flight(route: Route) -> None:
    table = sql.Identifier(route.src_schema, "orders").as_string(route.src.conn)
    slow = (
        f"SELECT * FROM {table} WHERE CASE WHEN id = 3 THEN pg_sleep(30) IS NOT NULL ELSE true END"
    )
    source = route.source(slow)
    with route.sink_for() as sink:
        source.expect(DAYS[1])
        sink.write_chunk(source, DAYS[0])
        ahead = source._ahead
        started = time.monotonic()
        source.close()
        assert time.monotonic() - started < 5  # cancelled, not waited for
        assert not ahead._thread.is_alive()
