"""Set-based groups (ADR 0022): ``lease_and_complete_set`` against each SQL store.

Postgres leases a group in one round trip and completes it in another (its set statements),
keeping the per-chunk rules: the records equal those one chunk at a time writes, a chunk whose
lock is held elsewhere ends the group before it, a refused lease ends it as the last member, a
tampered record is refused. The MSSQL store runs each chunk's statements in turn and has no
try-locks: its groups are of one chunk, the next one ``left``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.port import CampaignShape, ChunkResult, Lease, LeaseStatus
from dpone.ledger.sql import chunk_lock_class
from dpone.plan.chunks import Chunk
from ledger_backends import Backend, bad_record, make_shape

HISTORY = (
    "SELECT chunk_index, transition, state, attempt, lease_owner, rows_moved, checksum, "
    "source_checksum, error_code, chunk_start, chunk_end, "
    "lease_expires_at IS NULL, started_at IS NULL FROM {table} "
    "WHERE run_key = %s ORDER BY chunk_index, transition"
)


def _result(chunk: Chunk) -> ChunkResult:
    return ChunkResult(
        committed=True,
        rows=chunk.index * 10,
        checksum=f"c{chunk.index}",
        source_checksum=f"c{chunk.index}",
    )


def _write_set(seen: list[list[int]]) -> Any:
    def write_set(conn: Any, leased: list[tuple[Chunk, Lease]]) -> list[ChunkResult]:
        seen.append([chunk.index for chunk, _ in leased])
        return [_result(chunk) for chunk, _ in leased]

    return write_set


def _history(backend: Backend, run_key: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(backend.dsn) as conn:  # type: ignore[attr-defined]
        table = f'"{backend.schema}".chunk_transition'  # type: ignore[attr-defined]
        return conn.execute(HISTORY.format(table=table), (run_key,)).fetchall()


#: Groups of several chunks need the Postgres store's try-locks; the MSSQL store has none.
ON_POSTGRES = pytest.mark.parametrize(
    "sql_backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
WITHOUT_TRY_LOCKS = pytest.mark.parametrize("sql_backend", ["mssql_double"], indirect=True)


def _started(backend: Backend, shape: CampaignShape) -> Any:
    store = backend.open()
    store.initialize(shape, "a", 5)
    return store


def _attempts(backend: Backend, shape: CampaignShape) -> dict[int, list[tuple[str, int]]]:
    out: dict[int, list[tuple[str, int]]] = {}
    for row in _history(backend, shape.run_key):
        out.setdefault(int(row[0]), []).append((str(row[2]), int(row[3])))
    return out


@WITHOUT_TRY_LOCKS
def test_a_group_without_try_locks_is_one_chunk(sql_backend: Backend) -> None:
    shape = make_shape()
    store = sql_backend.open()
    store.initialize(shape, "a", 5)
    seen: list[list[int]] = []
    move = store.lease_and_complete_set(shape, shape.chunks[:3], "w", 30, _write_set(seen))
    assert seen == [[1]] and move.left is not None and move.left.index == 2
    assert [(c.index, o.status) for c, o, _ in move.members] == [(1, LeaseStatus.ACQUIRED)]
    assert store.load(shape.run_key).records[1].state.value == "committed"


@ON_POSTGRES
def test_a_group_records_what_one_chunk_at_a_time_records(sql_backend: Backend) -> None:
    grouped, alone = make_shape("bf-group"), make_shape("bf-alone")
    store = _started(sql_backend, grouped)
    store.initialize(alone, "a", 5)
    seen: list[list[int]] = []
    move = store.lease_and_complete_set(grouped, grouped.chunks[:4], "w", 30, _write_set(seen))
    assert seen == [[1, 2, 3, 4]] and move.left is None and not move.rolled_back
    assert [(c.index, o.status, r) for c, o, r in move.members] == [
        (c.index, LeaseStatus.ACQUIRED, _result(c)) for c in grouped.chunks[:4]
    ]
    assert [o.lease.attempt for _, o, _ in move.members] == [1, 1, 1, 1]
    for chunk in alone.chunks[:4]:
        outcome, _ = store.lease_and_complete(
            alone, chunk, "w", 30, lambda conn, lease, chunk=chunk: _result(chunk)
        )
        assert outcome.status is LeaseStatus.ACQUIRED
    for shape in (grouped, alone):
        records = store.load(shape.run_key).records
        assert [(records[i].state.value, records[i].attempt) for i in range(1, 5)] == [
            ("committed", 1)
        ] * 4
    history = _history(sql_backend, grouped.run_key)
    assert len(history) == 8  # RUNNING and COMMITTED of each chunk
    assert history == _history(sql_backend, alone.run_key)
    again = store.lease_and_complete_set(grouped, grouped.chunks[:2], "x", 30, _write_set(seen))
    assert [o.status for _, o, _ in again.members] == [LeaseStatus.ALREADY_COMMITTED]
    assert len(seen) == 1  # nothing written twice


@ON_POSTGRES
def test_a_chunk_locked_elsewhere_ends_the_group_before_it(sql_backend: Backend) -> None:
    shape = make_shape()
    store = _started(sql_backend, shape)
    seen: list[list[int]] = []
    key = chunk_lock_class(sql_backend.schema, shape.run_key)  # type: ignore[attr-defined]
    with psycopg.connect(sql_backend.dsn) as other:  # type: ignore[attr-defined]
        other.execute("SELECT pg_advisory_xact_lock(%s, %s)", (key, 3))
        move = store.lease_and_complete_set(shape, shape.chunks[:5], "w", 30, _write_set(seen))
        other.rollback()
    assert seen == [[1, 2]] and move.left is not None and move.left.index == 3
    assert [c.index for c, _, _ in move.members] == [1, 2]
    assert sorted(_attempts(sql_backend, shape)) == [1, 2]  # chunk 3 untouched
    rest = store.lease_and_complete_set(shape, shape.chunks[2:5], "w", 30, _write_set(seen))
    assert [c.index for c, _, _ in rest.members] == [3, 4, 5] and seen[-1] == [3, 4, 5]


@ON_POSTGRES
def test_a_refused_lease_ends_the_group_as_its_last_member(sql_backend: Backend) -> None:
    shape = make_shape()
    store = _started(sql_backend, shape)
    seen: list[list[int]] = []
    store.lease_and_complete_set(shape, shape.chunks[2:3], "w", 30, _write_set(seen))
    move = store.lease_and_complete_set(shape, shape.chunks[:5], "w", 30, _write_set(seen))
    assert seen == [[3], [1, 2]] and move.left is None
    assert [(c.index, o.status) for c, o, _ in move.members] == [
        (1, LeaseStatus.ACQUIRED),
        (2, LeaseStatus.ACQUIRED),
        (3, LeaseStatus.ALREADY_COMMITTED),
    ]
    assert sorted(_attempts(sql_backend, shape)) == [1, 2, 3]  # chunks 4 and 5 untouched


@ON_POSTGRES
def test_a_cancelled_campaign_refuses_the_group(sql_backend: Backend) -> None:
    shape = make_shape()
    store = _started(sql_backend, shape)
    seen: list[list[int]] = []
    store.lease_and_complete_set(shape, shape.chunks[:2], "w", 30, _write_set(seen))
    store.cancel(shape.run_key, "stop it")
    move = store.lease_and_complete_set(shape, shape.chunks[2:5], "w", 30, _write_set(seen))
    assert seen == [[1, 2]]
    assert [(c.index, o.status, o.cancel_reason) for c, o, _ in move.members] == [
        (3, LeaseStatus.CANCELLED, "stop it")
    ]


@ON_POSTGRES
def test_a_tampered_record_in_a_group_is_refused_and_nothing_recorded(
    sql_backend: Backend,
) -> None:
    shape = make_shape()
    store = _started(sql_backend, shape)
    sql_backend.inject(shape.run_key, bad_record(shape, 3, state="running", attempt=0))
    seen: list[list[int]] = []
    move = store.lease_and_complete_set(shape, shape.chunks[:5], "w", 30, _write_set(seen))
    assert seen == [] and move.members == [] and move.left is not None and move.left.index == 3
    assert [c.index for c, _ in move.rolled_back] == [1, 2]  # rolled back, moved again alone
    assert isinstance(move.cause, DponeError) and move.cause.code == errors.LEDGER_CORRUPT
    assert _attempts(sql_backend, shape) == {3: [("running", 0)]}  # nothing of the group
    with pytest.raises(DponeError) as first:  # the first chunk: raised as lease_and_complete
        store.lease_and_complete_set(shape, shape.chunks[2:4], "w", 30, _write_set(seen))
    assert first.value.code == errors.LEDGER_CORRUPT


@ON_POSTGRES
def test_a_failed_write_of_a_group_rolls_it_back(sql_backend: Backend) -> None:
    shape = make_shape()
    store = _started(sql_backend, shape)

    def failing(conn: Any, leased: list[tuple[Chunk, Lease]]) -> list[ChunkResult]:
        results = [_result(chunk) for chunk, _ in leased]
        results[1] = ChunkResult(committed=False, error_code=errors.SINK_FAILED, error_message="x")
        return results

    move = store.lease_and_complete_set(shape, shape.chunks[:3], "w", 30, failing)
    assert move.members == [] and [c.index for c, _ in move.rolled_back] == [1, 2, 3]
    assert _attempts(sql_backend, shape) == {}  # nothing recorded


@ON_POSTGRES
def test_a_lease_the_owner_still_holds_is_reused_and_the_group_goes_on(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = make_shape()
    store = _started(sql_backend, shape)
    held = store.acquire_lease(shape, shape.chunks[1], "w", 300)
    assert held.lease is not None and held.lease.attempt == 1
    from dpone.ledger.postgres import PostgresTx

    calls: list[list[int]] = []
    lease_set = PostgresTx.lease_set

    def counted(self: PostgresTx, run_key: str, chunks: list[Chunk], *rest: Any) -> Any:
        calls.append([chunk.index for chunk in chunks])
        return lease_set(self, run_key, chunks, *rest)

    monkeypatch.setattr(PostgresTx, "lease_set", counted)
    seen: list[list[int]] = []
    move = store.lease_and_complete_set(shape, shape.chunks[:4], "w", 30, _write_set(seen))
    assert calls == [[1, 2, 3, 4], [3, 4]]  # the reused lease ends the first statement's appends
    assert seen == [[1, 2, 3, 4]] and move.left is None
    assert [(c.index, o.lease.attempt) for c, o, _ in move.members] == [
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 1),
    ]
    committed = [("running", 1), ("committed", 1)]
    assert _attempts(sql_backend, shape) == {1: committed, 2: committed, 3: committed, 4: committed}


@ON_POSTGRES
def test_the_first_chunk_waits_for_its_lock_then_the_group_is_busy(sql_backend: Backend) -> None:
    shape = make_shape()
    _started(sql_backend, shape).close()
    store = sql_backend.open(chunk_lock_timeout_s=0.2)
    seen: list[list[int]] = []
    key = chunk_lock_class(sql_backend.schema, shape.run_key)  # type: ignore[attr-defined]
    with psycopg.connect(sql_backend.dsn) as other:  # type: ignore[attr-defined]
        other.execute("SELECT pg_advisory_xact_lock(%s, %s)", (key, 1))
        move = store.lease_and_complete_set(shape, shape.chunks[:3], "w", 30, _write_set(seen))
        other.rollback()
    assert seen == [] and move.left is None
    assert [(c.index, o.status) for c, o, _ in move.members] == [(1, LeaseStatus.BUSY)]
    assert _attempts(sql_backend, shape) == {}
    again = store.lease_and_complete_set(shape, shape.chunks[:3], "w", 30, _write_set(seen))
    assert [c.index for c, _, _ in again.members] == [1, 2, 3]  # the lock freed, all leased
