"""The LedgerStore contract, run against Postgres, the MSSQL double and the local file store."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from typing import Any

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.port import ChunkResult, ChunkState, LeaseStatus
from ledger_backends import Backend, bad_record, make_shape


def test_capabilities_say_what_mapped_execution_may_use(backend: Backend) -> None:
    store = backend.open()
    assert store.capabilities.mapped_ready is backend.sql
    assert store.name == backend.name.replace("_double", "")


def test_initialize_creates_then_verifies_and_lists(backend: Backend) -> None:
    shape = make_shape("bf-one", chunks=5)
    first, second = backend.open(), backend.open()
    assert first.load("bf-one") is None
    ledger = first.initialize(shape, "owner-a", 5)
    assert ledger.shape == shape and ledger.records == {} and not ledger.cancelled
    assert ledger.now is not None
    assert abs((ledger.now - dt.datetime.now(dt.UTC)).total_seconds()) < 30
    again = second.initialize(shape, "owner-b", 5)
    assert again.shape == shape
    second.initialize(make_shape("bf-two", chunks=2, workload="other"), "owner-b", 5)
    assert first.list_campaigns() == ["bf-one", "bf-two"]
    assert first.list_campaigns("other") == ["bf-two"]


@pytest.mark.parametrize("drift", ["config_hash", "chunk_count"])
def test_initialize_refuses_a_drifted_campaign(backend: Backend, drift: str) -> None:
    store = backend.open()
    store.initialize(make_shape("bf-drift", chunks=4), "a", 5)
    other = (
        make_shape("bf-drift", chunks=4, config_hash="sha256:" + "d" * 64)
        if drift == "config_hash"
        else make_shape("bf-drift", chunks=5)
    )
    with pytest.raises(DponeError) as caught:
        backend.open().initialize(other, "b", 5)
    assert caught.value.code == errors.LEDGER_SHAPE_MISMATCH
    assert drift in caught.value.message or "plan_hash" in caught.value.message


def test_lease_lifecycle(backend: Backend) -> None:
    shape = make_shape(chunks=3)
    alice, bob = backend.open(), backend.open()
    alice.initialize(shape, "alice", 5)
    chunk = shape.chunks[0]

    got = alice.acquire_lease(shape, chunk, "alice", 30)
    assert got.status is LeaseStatus.ACQUIRED and got.lease is not None
    assert got.lease.attempt == 1 and got.lease.owner == "alice"

    busy = bob.acquire_lease(shape, chunk, "bob", 30)
    assert busy.status is LeaseStatus.BUSY and busy.lease is None
    assert busy.holder is not None and busy.holder.lease_owner == "alice"

    again = alice.acquire_lease(shape, chunk, "alice", 30)  # same owner: the same lease back
    assert again.lease == got.lease

    alice.complete(got.lease, chunk, ChunkResult(committed=True, rows=42, checksum="abc"))
    record = bob.load(shape.run_key).records[1]  # type: ignore[union-attr]
    assert (record.state, record.attempt, record.rows, record.checksum) == (
        ChunkState.COMMITTED,
        1,
        42,
        "abc",
    )
    assert record.lease_expires_at is None and record.started_at is not None
    done = bob.acquire_lease(shape, chunk, "bob", 30)
    assert done.status is LeaseStatus.ALREADY_COMMITTED and done.holder is not None


def test_second_completion_of_a_lease_is_lease_lost(backend: Backend) -> None:
    shape = make_shape(chunks=2)
    store = backend.open()
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[1], "a", 30).lease
    assert lease is not None
    store.complete(lease, shape.chunks[1], ChunkResult(committed=True))
    with pytest.raises(DponeError) as caught:
        store.complete(lease, shape.chunks[1], ChunkResult(committed=False, error_code="X"))
    assert caught.value.code == errors.CHUNK_LEASE_LOST
    assert store.load(shape.run_key).records[2].state is ChunkState.COMMITTED  # type: ignore[union-attr]


def test_failed_chunk_is_retried_as_the_next_attempt(backend: Backend) -> None:
    shape = make_shape(chunks=2)
    store = backend.open()
    store.initialize(shape, "a", 5)
    chunk = shape.chunks[0]
    lease = store.acquire_lease(shape, chunk, "a", 30).lease
    assert lease is not None
    store.complete(
        lease,
        chunk,
        ChunkResult(committed=False, error_code="DPONE_SINK_FAILED", error_message="boom"),
    )
    failed = store.load(shape.run_key).records[1]  # type: ignore[union-attr]
    assert (failed.state, failed.error_code, failed.error_message) == (
        ChunkState.FAILED,
        "DPONE_SINK_FAILED",
        "boom",
    )
    retry = backend.open().acquire_lease(shape, chunk, "b", 30)
    assert retry.status is LeaseStatus.ACQUIRED and retry.lease is not None
    assert retry.lease.attempt == 2


def test_stale_owner_cannot_complete_or_renew(backend: Backend) -> None:
    shape = make_shape(chunks=2)
    old, new = backend.open(), backend.open()
    old.initialize(shape, "old", 5)
    chunk = shape.chunks[0]
    stale = old.acquire_lease(shape, chunk, "old", 0.3).lease
    assert stale is not None
    assert new.acquire_lease(shape, chunk, "new", 30).status is LeaseStatus.BUSY
    time.sleep(0.6)  # the lease expires by the store's clock
    fresh = new.acquire_lease(shape, chunk, "new", 30)
    assert fresh.status is LeaseStatus.ACQUIRED and fresh.lease is not None
    assert fresh.lease.attempt == 2
    for attempt in (
        lambda: old.complete(stale, chunk, ChunkResult(committed=True, rows=1)),
        lambda: old.renew(stale, 30),
    ):
        with pytest.raises(DponeError) as caught:
            attempt()
        assert caught.value.code == errors.CHUNK_LEASE_LOST
    latest = new.load(shape.run_key).records[1]  # type: ignore[union-attr]
    assert (latest.state, latest.lease_owner, latest.attempt) == (ChunkState.RUNNING, "new", 2)
    new.complete(fresh.lease, chunk, ChunkResult(committed=True))


def test_renew_extends_an_owned_lease(backend: Backend) -> None:
    shape = make_shape(chunks=1)
    store = backend.open()
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[0], "a", 0.5).lease
    assert lease is not None
    renewed = store.renew(lease, 30)
    assert renewed.expires_at > lease.expires_at and renewed.attempt == lease.attempt
    time.sleep(0.7)  # past the first expiry: still held
    assert backend.open().acquire_lease(shape, shape.chunks[0], "b", 30).status is LeaseStatus.BUSY
    store.complete(renewed, shape.chunks[0], ChunkResult(committed=True))


def test_cancellation_is_read_before_every_lease(backend: Backend) -> None:
    shape = make_shape(chunks=3)
    store = backend.open()
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[0], "a", 30).lease
    assert lease is not None
    backend.open().cancel(shape.run_key, "operator stop")
    refused = store.acquire_lease(shape, shape.chunks[1], "a", 30)
    assert refused.status is LeaseStatus.CANCELLED and refused.cancel_reason == "operator stop"
    store.complete(lease, shape.chunks[0], ChunkResult(committed=True))  # running work may finish
    ledger = store.load(shape.run_key)
    assert ledger is not None and ledger.cancelled and ledger.cancel_reason == "operator stop"
    assert store.cancel(shape.run_key, "resume", undo=True) is True
    assert store.acquire_lease(shape, shape.chunks[1], "a", 30).status is LeaseStatus.ACQUIRED
    # nothing left to lift: nothing written, and the campaign stays as it was
    assert store.cancel(shape.run_key, "again", undo=True) is False
    ledger = store.load(shape.run_key)
    assert ledger is not None and not ledger.cancelled and ledger.cancel_reason is None
    with pytest.raises(DponeError) as caught:
        store.cancel("bf-unknown", "x")
    assert caught.value.code == errors.USAGE


def test_load_merges_the_latest_record_of_every_chunk(backend: Backend) -> None:
    shape = make_shape(chunks=6)
    writers = [backend.open() for _ in range(3)]
    writers[0].initialize(shape, "w0", 5)
    for chunk in shape.chunks:
        store = writers[chunk.index % 3]
        lease = store.acquire_lease(shape, chunk, f"w{chunk.index}", 30).lease
        assert lease is not None
        if chunk.index != 6:
            store.complete(lease, chunk, ChunkResult(committed=chunk.index != 5, rows=chunk.index))
    ledger = backend.open().load(shape.run_key)
    assert ledger is not None and not ledger.complete
    states = {i: ledger.state_of(i) for i in range(1, 7)}
    assert states == {
        1: ChunkState.COMMITTED,
        2: ChunkState.COMMITTED,
        3: ChunkState.COMMITTED,
        4: ChunkState.COMMITTED,
        5: ChunkState.FAILED,
        6: ChunkState.RUNNING,
    }
    store = writers[0]
    for index in (5, 6):
        outcome = store.acquire_lease(
            shape, shape.chunks[index - 1], "finisher", 0.1 if index == 6 else 30
        )
        if outcome.status is LeaseStatus.BUSY:
            continue
        assert outcome.lease is not None
        store.complete(outcome.lease, shape.chunks[index - 1], ChunkResult(committed=True))
    assert not backend.open().load(shape.run_key).complete  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "override",
    [
        {"idempotency_key": "sha256:" + "0" * 64},
        {"chunk_start": '"1999-01-01"'},
        {"state": "exploded"},
        {"chunk_index": 99},
    ],
    ids=["key", "bounds", "state", "index"],
)
def test_a_corrupt_record_is_refused_naming_campaign_and_chunk(
    backend: Backend, override: dict[str, Any]
) -> None:
    shape = make_shape("bf-corrupt", chunks=3)
    store = backend.open()
    store.initialize(shape, "a", 5)
    row = bad_record(shape, 2, **override)
    backend.inject(shape.run_key, row)
    with pytest.raises(DponeError) as caught:
        backend.open().load(shape.run_key)
    assert caught.value.code == errors.LEDGER_CORRUPT
    assert "bf-corrupt" in caught.value.message
    assert f"chunk {row['chunk_index']}" in caught.value.message
    if row["chunk_index"] == 2:
        with pytest.raises(DponeError) as on_lease:
            store.acquire_lease(shape, shape.chunks[1], "a", 30)
        assert on_lease.value.code == errors.LEDGER_CORRUPT


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ('"1999-01-01"', "do not hash to the snapshot's plan_hash"),
        ("1", "do not hash to the snapshot's plan_hash"),
        ('"2024-01-02', "not JSON scalars"),
        (None, "2 chunk rows stored, the snapshot says 3"),
    ],
    ids=["other-date", "other-type", "not-json", "deleted"],
)
def test_an_edited_shape_row_is_refused_by_initialize_and_load(
    backend: Backend, edit: str | None, why: str
) -> None:
    """initialize compares the stored chunk rows with the planned ones as text and, when they
    differ, rebuilds the stored shape to say why: a fresh store (nothing verified yet) and the
    plain load both refuse an edited row, and the planned chunks are never taken instead."""
    if not backend.sql:
        pytest.skip("the local file store keeps no separate chunk rows")
    shape = make_shape("bf-shape-edit", chunks=3)
    backend.open().initialize(shape, "a", 5)
    backend.edit_shape_row(shape.run_key, 2, edit)
    for read in (
        lambda store: store.initialize(shape, "b", 5),
        lambda store: store.load(shape.run_key),
    ):
        with pytest.raises(DponeError) as caught:
            read(backend.open())
        assert caught.value.code == errors.LEDGER_CORRUPT
        assert "bf-shape-edit" in caught.value.message and why in caught.value.message


def test_a_stored_shape_row_in_another_json_spelling_is_the_same_chunk(backend: Backend) -> None:
    """A stored bound whose text differs from the planned one but parses to the same value (JSON
    allows spaces around a scalar) is the same chunk: initialize takes the slower path that
    parses the rows and accepts it, as it did before comparing texts."""
    if not backend.sql:
        pytest.skip("the local file store keeps no separate chunk rows")
    shape = make_shape("bf-shape-spelling", chunks=3)
    backend.open().initialize(shape, "a", 5)
    backend.edit_shape_row(shape.run_key, 2, ' "2024-01-02" ')
    ledger = backend.open().initialize(shape, "b", 5)
    assert ledger.shape.chunks == shape.chunks


def test_committed_count_counts_chunks_ever_committed(backend: Backend) -> None:
    """committed_count: 0 for an unknown campaign; a failed or running chunk does not count, a
    committed one does once, however often it is read; all chunks committed = the chunk count."""
    shape = make_shape("bf-count", chunks=4)
    store = backend.open()
    assert store.committed_count(shape.run_key) == 0
    store.initialize(shape, "a", 5)
    assert store.committed_count(shape.run_key) == 0
    outcomes = {}
    for chunk in shape.chunks:
        outcome = store.acquire_lease(shape, chunk, "a", 30)
        assert outcome.lease is not None
        outcomes[chunk.index] = outcome.lease
    store.complete(outcomes[1], shape.chunks[0], ChunkResult(committed=True, rows=3))
    store.complete(outcomes[2], shape.chunks[1], ChunkResult(committed=False, error_code="X"))
    assert store.committed_count(shape.run_key) == 1
    assert backend.open().committed_count(shape.run_key) == 1
    store.complete(outcomes[3], shape.chunks[2], ChunkResult(committed=True))
    store.complete(outcomes[4], shape.chunks[3], ChunkResult(committed=True))
    assert store.committed_count(shape.run_key) == 3
    retry = store.acquire_lease(shape, shape.chunks[1], "b", 30)
    assert retry.lease is not None
    store.complete(retry.lease, shape.chunks[1], ChunkResult(committed=True))
    assert store.committed_count(shape.run_key) == 4 == shape.chunk_count
    assert backend.open().load(shape.run_key).complete  # type: ignore[union-attr]


def test_campaign_lock_busy_within_the_bounded_wait(backend: Backend) -> None:
    shape = make_shape("bf-busy", chunks=2)
    store = backend.open()
    with backend.hold_campaign_lock(shape.run_key):
        started = time.monotonic()
        with pytest.raises(DponeError) as caught:
            store.initialize(shape, "a", 0.3)
        waited = time.monotonic() - started
    assert caught.value.code == errors.MAPPING_CAMPAIGN_BUSY
    assert caught.value.retryable
    assert 0.25 <= waited < 3.0
    assert store.initialize(shape, "a", 5).shape == shape  # freed: works at once


def test_threads_never_hold_the_same_chunk(backend: Backend) -> None:
    shape = make_shape("bf-threads", chunks=12)
    backend.open().initialize(shape, "setup", 5)
    holders: dict[int, list[str]] = {}
    guard = threading.Lock()
    failures: list[BaseException] = []

    def worker(number: int) -> None:
        try:
            store = backend.open()
            order = list(shape.chunks)
            random.Random(number).shuffle(order)
            for chunk in order:
                outcome = store.acquire_lease(shape, chunk, f"t{number}", 30)
                if outcome.status is not LeaseStatus.ACQUIRED:
                    continue
                assert outcome.lease is not None
                with guard:
                    holders.setdefault(chunk.index, []).append(f"t{number}")
                store.complete(outcome.lease, chunk, ChunkResult(committed=True))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    assert sorted(holders) == list(range(1, 13))
    assert all(len(owners) == 1 for owners in holders.values()), holders
    assert backend.open().load(shape.run_key).complete  # type: ignore[union-attr]


def test_a_newer_schema_is_refused(backend: Backend) -> None:
    backend.open().initialize(make_shape(chunks=1), "a", 5)
    backend.set_newer_version()
    with pytest.raises(DponeError) as caught:
        backend.open().load("bf-test")
    assert caught.value.code == errors.LEDGER_UNAVAILABLE
    assert "upgrade dpone" in caught.value.message


def test_connection_loss_is_a_structured_error_then_recovers(sql_backend: Backend) -> None:
    shape = make_shape(chunks=2)
    store = sql_backend.open()
    store.initialize(shape, "a", 5)
    sql_backend.kill_connections(store)
    with pytest.raises(DponeError) as caught:
        store.acquire_lease(shape, shape.chunks[0], "a", 30)
    assert caught.value.code == errors.CONNECTION_FAILED
    assert caught.value.retryable and "secret" not in caught.value.message
    outcome = store.acquire_lease(shape, shape.chunks[0], "a", 30)  # reconnected
    assert outcome.status is LeaseStatus.ACQUIRED


def test_complete_in_transaction_on_local_file_is_not_offered(tmp_path: Any) -> None:
    from dpone.ledger.localfile import LocalFileLedger

    store = LocalFileLedger(tmp_path / "l.json")
    shape = make_shape(chunks=1)
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[0], "a", 30).lease
    assert lease is not None
    with pytest.raises(NotImplementedError):
        store.complete_in_transaction(lease, shape.chunks[0], lambda conn: ChunkResult(True))
    store.close()


def test_complete_in_transaction_commits_data_and_record_together(sql_backend: Backend) -> None:
    shape = make_shape(chunks=3)
    store = sql_backend.open()
    store.initialize(shape, "a", 5)
    sql_backend.create_sink()

    def good(conn: Any) -> ChunkResult:
        sql_backend.sink_write(conn, 1)
        return ChunkResult(committed=True, rows=1, checksum="c1")

    lease = store.acquire_lease(shape, shape.chunks[0], "a", 30).lease
    assert lease is not None
    assert store.complete_in_transaction(lease, shape.chunks[0], good).rows == 1
    assert sql_backend.sink_rows() == [1]
    assert store.load(shape.run_key).records[1].state is ChunkState.COMMITTED  # type: ignore[union-attr]

    def bad(conn: Any) -> ChunkResult:
        sql_backend.sink_write(conn, 2)
        raise ValueError("row 2 rejected\nDETAIL: secret row values")

    lease = store.acquire_lease(shape, shape.chunks[1], "a", 30).lease
    assert lease is not None
    with pytest.raises(ValueError, match="row 2 rejected"):
        store.complete_in_transaction(lease, shape.chunks[1], bad)
    assert sql_backend.sink_rows() == [1]  # the write was rolled back
    failed = store.load(shape.run_key).records[2]  # type: ignore[union-attr]
    assert failed.state is ChunkState.FAILED and failed.error_code == errors.SINK_FAILED
    assert failed.error_message == "ValueError: row 2 rejected"

    def declined(conn: Any) -> ChunkResult:
        sql_backend.sink_write(conn, 3)
        return ChunkResult(committed=False, error_code="DPONE_SOURCE_FAILED", error_message="no")

    lease = store.acquire_lease(shape, shape.chunks[2], "a", 30).lease
    assert lease is not None
    assert not store.complete_in_transaction(lease, shape.chunks[2], declined).committed
    assert sql_backend.sink_rows() == [1]
    assert store.load(shape.run_key).records[3].error_code == "DPONE_SOURCE_FAILED"  # type: ignore[union-attr]

    calls: list[int] = []
    with pytest.raises(DponeError) as caught:  # a lost lease never runs the write
        store.complete_in_transaction(
            lease, shape.chunks[2], lambda conn: calls.append(1) or good(conn)
        )
    assert caught.value.code == errors.CHUNK_LEASE_LOST and calls == []
