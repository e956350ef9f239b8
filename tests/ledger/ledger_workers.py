"""Worker functions run in spawned processes by the multi-process Postgres ledger tests.

Each worker opens its own PostgresLedger (its own connection), like a pod would, and reports
what it did with wall-clock timestamps so the parent can prove exclusion and overlap.
"""

from __future__ import annotations

import random
import time
from typing import Any

from dpone.errors import DponeError
from dpone.ledger.port import ChunkResult, LeaseStatus
from dpone.ledger.postgres import PostgresLedger
from ledger_backends import make_shape


def wait_until(moment: float) -> None:
    delay = moment - time.time()
    if delay > 0:
        time.sleep(delay)


def walk_chunks(
    dsn: str,
    schema: str,
    run_key: str,
    chunk_count: int,
    owner: str,
    hold_s: float,
    seed: int | None,
    start_at: float,
    fail_indexes: tuple[int, ...] = (),
    lease_s: float = 30.0,
) -> list[dict[str, Any]]:
    """Lease, hold, complete every chunk it can get; stop at cancellation. Returns its events."""
    shape = make_shape(run_key, chunk_count)
    store = PostgresLedger(dsn, schema, lease_s)
    store.initialize(shape, owner, 10)
    order = list(shape.chunks)
    if seed is not None:
        random.Random(seed).shuffle(order)
    events: list[dict[str, Any]] = []
    wait_until(start_at)
    for chunk in order:
        asked = time.time()
        outcome = store.acquire_lease(shape, chunk, owner, lease_s)
        if outcome.status is LeaseStatus.CANCELLED:
            events.append({"chunk": chunk.index, "status": "cancelled", "at": asked})
            break
        if outcome.status is not LeaseStatus.ACQUIRED:
            events.append({"chunk": chunk.index, "status": outcome.status.value, "at": asked})
            continue
        assert outcome.lease is not None
        leased = time.time()
        time.sleep(hold_s)
        failed = chunk.index in fail_indexes
        result = ChunkResult(
            committed=not failed,
            rows=chunk.index,
            error_code="DPONE_SINK_FAILED" if failed else None,
        )
        store.complete(outcome.lease, chunk, result)
        events.append(
            {
                "chunk": chunk.index,
                "status": "committed" if not failed else "failed",
                "attempt": outcome.lease.attempt,
                "start": leased,
                "end": time.time(),
            }
        )
    store.close()
    return events


def lease_then_complete_late(
    dsn: str, schema: str, run_key: str, lease_s: float, sleep_s: float, queue: Any
) -> None:
    """Take chunk 1 with a short lease, stall past its expiry, then try to complete it."""
    shape = make_shape(run_key, 3)
    store = PostgresLedger(dsn, schema, lease_s)
    outcome = store.acquire_lease(shape, shape.chunks[0], "stalled-owner", lease_s)
    assert outcome.lease is not None
    queue.put(("leased", outcome.lease.attempt))
    time.sleep(sleep_s)
    try:
        store.complete(outcome.lease, shape.chunks[0], ChunkResult(committed=True, rows=999))
        queue.put(("completed", None))
    except DponeError as exc:
        queue.put(("error", exc.code))
    store.close()


def lease_and_hang(dsn: str, schema: str, run_key: str, lease_s: float, queue: Any) -> None:
    """Take chunk 1, report, then hang until SIGKILLed."""
    shape = make_shape(run_key, 3)
    store = PostgresLedger(dsn, schema, lease_s)
    outcome = store.acquire_lease(shape, shape.chunks[0], "killed-owner", lease_s)
    queue.put(("leased", None if outcome.lease is None else outcome.lease.attempt))
    time.sleep(120)


def hold_campaign_lock_and_hang(dsn: str, schema: str, run_key: str, queue: Any) -> None:
    """Hold the campaign's transaction-level lock inside an open transaction until killed."""
    import psycopg
    from dpone.ledger.sql import campaign_lock_key

    conn = psycopg.connect(dsn)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (campaign_lock_key(schema, run_key),))
    queue.put(("locked", conn.info.backend_pid))
    time.sleep(120)


def open_store_at(dsn: str, schema: str, start_at: float) -> str:
    """Create (or find) the audit schema at the same moment as the other workers."""
    wait_until(start_at)
    try:
        PostgresLedger(dsn, schema).close()
    except Exception as exc:  # reported to the parent, which fails the test
        return f"{type(exc).__name__}: {exc}"
    return "ok"
