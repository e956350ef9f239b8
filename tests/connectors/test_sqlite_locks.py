"""SQLite files locked by another connection: the wait follows DPONE_FENCE_LOCK_TIMEOUT, a lock
held past it is a transient (retryable) failure, and a stop rolls a waiting or writing chunk back.

The lock holder is a second connection to the same file (SQLite locks between connections of one
process as between processes).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dpone import errors
from dpone.connectors import (
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    open_sink,
    open_source,
)
from dpone.errors import DponeError
from dpone.run.preflight import _describe

from .support import ROWS, WINDOWS, create_sqlite, sqlite_rows

MakeDb = Callable[[str], tuple[str, sqlite3.Connection]]
WINDOW = WINDOWS["integer"]


@pytest.fixture
def files(sqlite_db: MakeDb) -> tuple[str, str, sqlite3.Connection]:
    """(source dsn, target dsn, a connection to the target): the source loaded, the target
    holding the first 50 rows."""
    src_dsn, src = sqlite_db("src")
    create_sqlite(src)
    dst_dsn, dst = sqlite_db("dst")
    create_sqlite(dst, rows=ROWS[:50])
    return src_dsn, dst_dsn, dst


def _sink(dsn: str, options: SinkOptions | None = None) -> Any:
    return open_sink(SinkSpec("dst", TableRef(None, "orders"), "replace"), dsn, options)


def _source(dsn: str) -> Any:
    return open_source(SourceSpec("src", TableRef(None, "orders")), dsn)


@pytest.fixture
def holder(sqlite_db: MakeDb) -> Iterator[Callable[[str, str], sqlite3.Connection]]:
    """Lock a file from another connection (``BEGIN IMMEDIATE`` or ``BEGIN EXCLUSIVE``)."""
    held: list[sqlite3.Connection] = []

    def hold(dsn: str, how: str) -> sqlite3.Connection:
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute(f"BEGIN {how}")
        conn.execute("UPDATE orders SET payload = 'held' WHERE seq = -1")
        held.append(conn)
        return conn

    yield hold
    for conn in held:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()


def test_a_locked_target_is_chunk_busy_after_the_fence_lock_timeout(
    files: tuple[str, str, sqlite3.Connection], holder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src_dsn, dst_dsn, dst = files
    before = sqlite_rows(dst)
    monkeypatch.setenv("DPONE_FENCE_LOCK_TIMEOUT", "1")
    holder(dst_dsn, "IMMEDIATE")
    with _source(src_dsn) as source, _sink(dst_dsn) as sink:
        started = time.monotonic()
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, WINDOW)
        waited = time.monotonic() - started
    assert caught.value.code == errors.CHUNK_BUSY and caught.value.retryable
    assert "locked by another process" in caught.value.message
    assert "DPONE_FENCE_LOCK_TIMEOUT" in caught.value.message
    assert 0.9 < waited < 5
    assert sqlite_rows(dst) == before


def test_a_file_locked_at_start_up_is_a_retryable_connection_failure(
    files: tuple[str, str, sqlite3.Connection], holder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Describing (preflight) and reading a file another process holds EXCLUSIVE: transient,
    so not the non-retryable PREFLIGHT_FAILED the preflight makes of SOURCE_FAILED."""
    src_dsn, dst_dsn, _ = files
    monkeypatch.setenv("DPONE_FENCE_LOCK_TIMEOUT", "1")
    holder(src_dsn, "EXCLUSIVE")
    spec = SourceSpec("src", TableRef(None, "orders"))
    started = time.monotonic()
    with pytest.raises(DponeError) as described:
        _describe(spec, src_dsn, open_source, types=True)
    assert time.monotonic() - started < 5
    with _source(src_dsn) as source, pytest.raises(DponeError) as read:
        list(source.rows(WINDOW, 100))
    holder(dst_dsn, "EXCLUSIVE")
    with _sink(dst_dsn) as sink, pytest.raises(DponeError) as preflight:
        sink.preflight(WINDOW.column)
    for caught in (described, read, preflight):
        assert caught.value.code == errors.CONNECTION_FAILED and caught.value.retryable
        assert "the SQLite file is locked by another process" in caught.value.message


def test_a_stop_while_waiting_for_the_write_lock_writes_nothing(
    files: tuple[str, str, sqlite3.Connection], holder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """interrupt() ends the wait (SQLite's own busy wait ignores it); a lock granted after it
    is not used."""
    src_dsn, dst_dsn, dst = files
    before = sqlite_rows(dst)
    monkeypatch.setenv("DPONE_FENCE_LOCK_TIMEOUT", "30")
    lock = holder(dst_dsn, "IMMEDIATE")
    outcome: list[BaseException | None] = []
    with _source(src_dsn) as source, _sink(dst_dsn) as sink:

        def write() -> None:
            try:
                sink.write_chunk(source, WINDOW)
                outcome.append(None)
            except BaseException as exc:  # the test reads it
                outcome.append(exc)

        worker = threading.Thread(target=write)
        worker.start()
        time.sleep(0.5)
        sink.interrupt()
        lock.execute("ROLLBACK")  # the lock is free right after the stop
        worker.join(5)
        assert not worker.is_alive()
        exc = outcome[0]
        assert isinstance(exc, DponeError) and exc.code == errors.RUN_INTERRUPTED
        assert sqlite_rows(dst) == before
        # the interrupt was the chunk's: the next write runs
        assert sink.write_chunk(source, WINDOW).rows > 0


def test_a_stop_after_the_lock_was_granted_rolls_the_chunk_back(
    files: tuple[str, str, sqlite3.Connection],
) -> None:
    """An interrupt between statements (SQLite has none to interrupt then) still rolls back."""
    src_dsn, dst_dsn, dst = files
    before = sqlite_rows(dst)
    with _source(src_dsn) as source, _sink(dst_dsn, SinkOptions(batch_rows=10)) as sink:
        rows = source.rows

        def interrupted_rows(window: Any, batch_rows: int) -> Iterator[Any]:
            for n, batch in enumerate(rows(window, batch_rows)):
                if n == 1:
                    sink.interrupt()
                yield batch

        source.rows = interrupted_rows
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, WINDOW)
        assert caught.value.code == errors.RUN_INTERRUPTED
        assert sqlite_rows(dst) == before
