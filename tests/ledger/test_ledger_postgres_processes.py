"""The Postgres ledger under several real processes (spawn), each with its own connection."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import psycopg
import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.port import ChunkResult, ChunkState, LeaseStatus
from dpone.ledger.postgres import PostgresLedger
from dpone.ledger.sql import SCHEMA_VERSION
from ledger_backends import make_shape
from ledger_workers import (
    hold_campaign_lock_and_hang,
    lease_and_hang,
    lease_then_complete_late,
    open_store_at,
    walk_chunks,
)
from pg import campaign_advisory_locks

pytestmark = pytest.mark.postgres
SPAWN = mp.get_context("spawn")


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    """Eight spawned worker processes, started once for the module (spawn costs ~1 s each)."""
    with ProcessPoolExecutor(8, mp_context=SPAWN) as executor:
        list(executor.map(time.sleep, [0.0] * 8))  # warm every worker
        yield executor


def _sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def test_workers_exclude_each_other_overlap_on_different_chunks_and_all_merge(
    pool: ProcessPoolExecutor, pg_dsn: str, pg_schema: str
) -> None:
    start_at = time.time() + 1.0
    futures = [
        pool.submit(walk_chunks, pg_dsn, pg_schema, "bf-procs", 12, f"p{k}", 0.15, k, start_at)
        for k in range(4)
    ]
    events = [event for future in futures for event in future.result(timeout=60)]
    leased = [e for e in events if e["status"] == "committed"]
    assert sorted(e["chunk"] for e in leased) == list(range(1, 13))  # each chunk exactly once
    overlapping = [
        (a["chunk"], b["chunk"])
        for a in leased
        for b in leased
        if a["chunk"] < b["chunk"] and max(a["start"], b["start"]) < min(a["end"], b["end"])
    ]
    assert overlapping, "no two different chunks were ever held at the same time"
    ledger = PostgresLedger(pg_dsn, pg_schema).load("bf-procs")
    assert ledger is not None and ledger.complete
    assert all(record.attempt == 1 for record in ledger.records.values())


def test_a_stale_local_view_never_hides_newer_sql_state(
    pool: ProcessPoolExecutor, pg_dsn: str, pg_schema: str
) -> None:
    shape = make_shape("bf-stale", 4)
    with PostgresLedger(pg_dsn, pg_schema) as store:
        old_view = store.initialize(shape, "main", 5)
        assert old_view.state_of(3) is ChunkState.PENDING
        pool.submit(
            walk_chunks, pg_dsn, pg_schema, "bf-stale", 4, "other-process", 0.0, None, 0.0
        ).result(timeout=60)
        assert old_view.state_of(3) is ChunkState.PENDING  # the local copy is stale...
        outcome = store.acquire_lease(shape, shape.chunks[2], "main", 30)
        assert outcome.status is LeaseStatus.ALREADY_COMMITTED  # ...and never wins over SQL
        fresh = store.load("bf-stale")
        assert fresh is not None and fresh.complete


def test_a_retry_moves_only_the_chunks_that_are_not_committed(
    pool: ProcessPoolExecutor, pg_dsn: str, pg_schema: str
) -> None:
    first = pool.submit(
        walk_chunks, pg_dsn, pg_schema, "bf-retry", 6, "attempt-1", 0.0, None, 0.0, (4,)
    ).result(timeout=60)
    assert [e["chunk"] for e in first if e["status"] == "failed"] == [4]
    rows_before = _sql(
        pg_dsn, f'SELECT count(*) FROM "{pg_schema}".chunk_transition WHERE chunk_index <> 4'
    )
    retry = pool.submit(
        walk_chunks, pg_dsn, pg_schema, "bf-retry", 6, "attempt-2", 0.0, None, 0.0
    ).result(timeout=60)
    moved = [e for e in retry if e["status"] == "committed"]
    assert [(e["chunk"], e["attempt"]) for e in moved] == [(4, 2)]
    assert {e["chunk"] for e in retry if e["status"] == "already_committed"} == {1, 2, 3, 5, 6}
    rows_after = _sql(
        pg_dsn, f'SELECT count(*) FROM "{pg_schema}".chunk_transition WHERE chunk_index <> 4'
    )
    assert rows_after == rows_before  # committed chunks got no new record at all


def test_a_stale_owner_cannot_complete_after_takeover(pg_dsn: str, pg_schema: str) -> None:
    shape = make_shape("bf-takeover", 3)
    with PostgresLedger(pg_dsn, pg_schema) as store:
        store.initialize(shape, "main", 5)
        queue = SPAWN.Queue()
        stalled = SPAWN.Process(
            target=lease_then_complete_late,
            args=(pg_dsn, pg_schema, "bf-takeover", 0.5, 2.0, queue),
        )
        stalled.start()
        assert queue.get(timeout=30) == ("leased", 1)
        assert store.acquire_lease(shape, shape.chunks[0], "new-owner", 30).status is (
            LeaseStatus.BUSY
        )
        time.sleep(0.8)  # past the stalled owner's expiry, by the database clock
        takeover = store.acquire_lease(shape, shape.chunks[0], "new-owner", 30)
        assert takeover.status is LeaseStatus.ACQUIRED and takeover.lease is not None
        assert takeover.lease.attempt == 2
        assert queue.get(timeout=30) == ("error", errors.CHUNK_LEASE_LOST)
        stalled.join(10)
        latest = store.load("bf-takeover").records[1]  # type: ignore[union-attr]
        assert (latest.state, latest.lease_owner, latest.attempt) == (
            ChunkState.RUNNING,
            "new-owner",
            2,
        )
        written = _sql(
            pg_dsn,
            f'SELECT count(*) FROM "{pg_schema}".chunk_transition '
            "WHERE lease_owner = 'stalled-owner' AND state <> 'running'",
        )
        assert written == [(0,)]  # the stale owner wrote nothing
        store.complete(takeover.lease, shape.chunks[0], ChunkResult(committed=True))


def test_cancellation_stops_a_worker_before_its_next_lease(
    pool: ProcessPoolExecutor, pg_dsn: str, pg_schema: str
) -> None:
    shape = make_shape("bf-cancel", 30)
    with PostgresLedger(pg_dsn, pg_schema) as store:
        store.initialize(shape, "main", 5)
        future = pool.submit(
            walk_chunks, pg_dsn, pg_schema, "bf-cancel", 30, "walker", 0.1, None, 0.0
        )
        deadline = time.time() + 30
        while store.load("bf-cancel").records.__len__() < 3:  # type: ignore[union-attr]
            assert time.time() < deadline
            time.sleep(0.05)
        store.cancel("bf-cancel", "stop now")
        events = future.result(timeout=60)
    assert events[-1]["status"] == "cancelled"
    assert len([e for e in events if e["status"] == "committed"]) < 30
    late = _sql(
        pg_dsn,
        f"SELECT count(*) FROM \"{pg_schema}\".chunk_transition t WHERE t.state = 'running' "
        f'AND t.recorded_at > (SELECT max(created_at) FROM "{pg_schema}".campaign WHERE cancelled)',
    )
    assert late == [(0,)]  # no lease was written after the cancellation committed


def test_a_killed_worker_leaves_a_retryable_chunk_and_no_lock(pg_dsn: str, pg_schema: str) -> None:
    shape = make_shape("bf-kill", 3)
    with PostgresLedger(pg_dsn, pg_schema) as store:
        store.initialize(shape, "main", 5)
        queue = SPAWN.Queue()
        victim = SPAWN.Process(
            target=lease_and_hang, args=(pg_dsn, pg_schema, "bf-kill", 1.0, queue)
        )
        victim.start()
        assert queue.get(timeout=30) == ("leased", 1)
        os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
        victim.join(10)
        assert campaign_advisory_locks(pg_dsn, pg_schema, "bf-kill") == 0
        assert store.acquire_lease(shape, shape.chunks[0], "rescuer", 30).status is LeaseStatus.BUSY
        time.sleep(1.2)
        rescued = store.acquire_lease(shape, shape.chunks[0], "rescuer", 30)
        assert rescued.status is LeaseStatus.ACQUIRED and rescued.lease is not None
        assert rescued.lease.attempt == 2
        store.complete(rescued.lease, shape.chunks[0], ChunkResult(committed=True))


def test_campaign_lock_busy_then_freed_when_its_holder_is_killed(
    pg_dsn: str, pg_schema: str
) -> None:
    shape = make_shape("bf-held", 2)
    PostgresLedger(pg_dsn, pg_schema).close()
    queue = SPAWN.Queue()
    holder = SPAWN.Process(
        target=hold_campaign_lock_and_hang, args=(pg_dsn, pg_schema, "bf-held", queue)
    )
    holder.start()
    assert queue.get(timeout=30)[0] == "locked"
    with PostgresLedger(pg_dsn, pg_schema) as store:
        started = time.monotonic()
        with pytest.raises(DponeError) as caught:
            store.initialize(shape, "main", 0.5)
        assert caught.value.code == errors.MAPPING_CAMPAIGN_BUSY
        assert 0.45 <= time.monotonic() - started < 3.0
        assert campaign_advisory_locks(pg_dsn, pg_schema, "bf-held") == 1
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join(10)
        deadline = time.monotonic() + 10
        while campaign_advisory_locks(pg_dsn, pg_schema, "bf-held") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert campaign_advisory_locks(pg_dsn, pg_schema, "bf-held") == 0
        assert store.initialize(shape, "main", 5).shape == shape


def test_eight_processes_create_the_schema_at_once(
    pool: ProcessPoolExecutor, pg_dsn: str, pg_schema: str
) -> None:
    start_at = time.time() + 1.0
    results = list(pool.map(open_store_at, [pg_dsn] * 8, [pg_schema] * 8, [start_at] * 8))
    assert results == ["ok"] * 8
    assert _sql(pg_dsn, f'SELECT version FROM "{pg_schema}".schema_version ORDER BY version') == [
        (version,) for version in range(1, SCHEMA_VERSION + 1)
    ]
