"""`restate` over the three stores (real Postgres, the MSSQL double, the local file).

A committed chunk restated gets a PENDING transition (history kept), loses its committed mark,
gains a Restatement; the next lease is a new attempt under the usual fence. A chunk leased now
refuses the whole call and nothing is written.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.port import ChunkResult, ChunkState, LeaseStatus
from ledger_backends import Backend, make_shape


def test_restated_chunks_move_again_under_a_new_attempt(backend: Backend) -> None:
    shape = make_shape(chunks=5)
    store = backend.open()
    store.initialize(shape, "a", 5)
    for chunk in shape.chunks[:4]:
        lease = store.acquire_lease(shape, chunk, "pod-1", 30).lease
        assert lease is not None
        store.complete(lease, chunk, ChunkResult(True, rows=7, checksum=f"c{chunk.index}"))
    assert store.committed_count(shape.run_key) == 4

    restated = backend.open().restate(shape, [2, 3, 5], "source fixed on 3 May", "ana@laptop")
    assert restated == [2, 3], "chunk 5 never committed: it moves anyway"
    ledger = store.load(shape.run_key)
    assert ledger is not None
    assert [ledger.state_of(i) for i in range(1, 6)] == [
        ChunkState.COMMITTED,
        ChunkState.PENDING,
        ChunkState.PENDING,
        ChunkState.COMMITTED,
        ChunkState.PENDING,
    ]
    assert store.committed_count(shape.run_key) == 2 and not ledger.complete
    first, second = store.restatements(shape.run_key)
    assert (first.chunk_index, second.chunk_index) == (2, 3)
    assert first.reason == "source fixed on 3 May" and first.requested_by == "ana@laptop"
    assert (first.prior_rows, first.prior_checksum) == (7, "c2")
    assert first.requested_at is not None and first.transition == 3  # running, committed, pending

    assert store.acquire_lease(shape, shape.chunks[0], "pod-2", 30).status is (
        LeaseStatus.ALREADY_COMMITTED
    ), "an unrestated chunk is still skipped"
    outcome = store.acquire_lease(shape, shape.chunks[1], "pod-2", 30)
    assert outcome.lease is not None and outcome.lease.attempt == 2
    store.complete(outcome.lease, shape.chunks[1], ChunkResult(True, rows=9, checksum="new"))
    again = backend.open().load(shape.run_key)
    assert again is not None and again.state_of(2) is ChunkState.COMMITTED
    assert again.records[2].checksum == "new" and store.committed_count(shape.run_key) == 3
    assert len(store.restatements(shape.run_key)) == 2, "history kept"


def test_a_chunk_leased_now_refuses_the_whole_restatement(backend: Backend) -> None:
    shape = make_shape(chunks=3)
    store = backend.open()
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[0], "pod-1", 30).lease
    assert lease is not None
    store.complete(lease, shape.chunks[0], ChunkResult(True, rows=1))
    moving = store.acquire_lease(shape, shape.chunks[1], "pod-1", 30).lease
    assert moving is not None
    with pytest.raises(DponeError) as caught:
        backend.open().restate(shape, [1, 2], "fix", "ana")
    assert caught.value.code == errors.CHUNK_BUSY
    assert "chunk 2" in caught.value.message and "nothing was restated" in caught.value.message
    ledger = store.load(shape.run_key)
    assert ledger is not None and ledger.state_of(1) is ChunkState.COMMITTED
    assert store.restatements(shape.run_key) == []
    store.complete(moving, shape.chunks[1], ChunkResult(True, rows=1))  # its lease still holds
    assert backend.open().restate(shape, [1, 2], "fix", "ana") == [1, 2]


def test_an_expired_lease_does_not_block_and_its_pod_is_fenced(backend: Backend) -> None:
    shape = make_shape(chunks=2)
    store = backend.open()
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[0], "pod-1", 30).lease
    assert lease is not None
    store.complete(lease, shape.chunks[0], ChunkResult(True, rows=1))
    store.restate(shape, [1], "fix", "ana")
    stale = store.acquire_lease(shape, shape.chunks[0], "pod-slow", 0.3).lease
    assert stale is not None
    time.sleep(0.6)
    # The lease expired: no pod moves the chunk now, but the slow one may wake and complete it
    # with rows read before the source was fixed: the restatement marks it, and fences that pod
    # at once, before any other pod takes the chunk.
    assert backend.open().restate(shape, [1], "fix again", "ana") == [1]
    with pytest.raises(DponeError) as caught:
        store.complete(stale, shape.chunks[0], ChunkResult(True, rows=1))
    assert caught.value.code == errors.CHUNK_LEASE_LOST
    ledger = store.load(shape.run_key)
    assert ledger is not None and ledger.state_of(1) is ChunkState.PENDING
    taken = store.acquire_lease(shape, shape.chunks[0], "pod-2", 30).lease
    assert taken is not None and taken.attempt == 3
    store.complete(taken, shape.chunks[0], ChunkResult(True, rows=2))
    first, second = store.restatements(shape.run_key)
    assert (first.prior_rows, second.reason, second.prior_rows) == (1, "fix again", None)


def test_overlapping_restatements_at_once_both_go_through(backend: Backend) -> None:
    """Two operators restating overlapping chunks at once, no run moving any: each waits for
    the other's transaction (the campaign lock), none is refused as if a run held a chunk."""
    shape = make_shape(chunks=20)
    store = backend.open()
    store.initialize(shape, "a", 5)
    for chunk in shape.chunks:
        lease = store.acquire_lease(shape, chunk, "pod-1", 30).lease
        assert lease is not None
        store.complete(lease, chunk, ChunkResult(True, rows=1))
    stores = [backend.open(), backend.open()]
    start = threading.Barrier(2)

    def restate(which: int) -> list[int]:
        start.wait()
        wanted = range(1, 13) if which == 0 else range(5, 21)
        return stores[which].restate(shape, list(wanted), "fix", f"op{which}")

    for _ in range(8):
        with ThreadPoolExecutor(2) as pool:
            done = [f.result() for f in [pool.submit(restate, 0), pool.submit(restate, 1)]]
        assert sorted(set(done[0]) | set(done[1])) == list(range(1, 21))
        for chunk in shape.chunks:  # everything moves again, and is committed again
            lease = store.acquire_lease(shape, chunk, "pod-1", 30).lease
            assert lease is not None
            store.complete(lease, chunk, ChunkResult(True, rows=1))


def test_restate_outside_the_campaign_is_a_usage_error(backend: Backend) -> None:
    shape = make_shape(chunks=2)
    store = backend.open()
    store.initialize(shape, "a", 5)
    for indexes in ([0], [3], []):
        with pytest.raises(DponeError) as caught:
            store.restate(shape, indexes, "fix", "ana")
        assert caught.value.code == errors.USAGE
