"""A mapped item loads only its own chunks' records; the rest of the campaign is checked.

``initialize(..., scope=(first, last))`` is what a mapped item calls. On Postgres the campaign
is checked in the database in the same pipeline (its chunk rows equal the plan's, every latest
record agrees with its chunk and the record rules, every committed mark is still committed, how
many chunks are committed) and only the scope's latest transitions are read, so a no-op item's
load no longer grows with the campaign. What it decides must be what the full load decides:
the same records in the scope, the same completeness, and every corruption anywhere in the
campaign refused with the full load's LEDGER_CORRUPT message. Stores that cannot check in the
database (the MSSQL double, the local file) load everything, which answers the same questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.port import CampaignShape, ChunkResult, LeaseStatus, LedgerStore
from dpone.plan.chunks import Chunk
from ledger_backends import Backend, bad_record, make_shape


def _campaign(store: LedgerStore, chunks: int = 8) -> CampaignShape:
    """Chunks 1-2 committed, 3 failed, 4 running, the rest untouched."""
    shape = make_shape("bf-scoped", chunks=chunks)
    store.initialize(shape, "a", 5)
    for index, committed in ((1, True), (2, True), (3, False), (4, None)):
        chunk = shape.chunks[index - 1]
        outcome = store.acquire_lease(shape, chunk, "w", 60)
        assert outcome.status is LeaseStatus.ACQUIRED and outcome.lease is not None
        if committed is True:
            store.complete(outcome.lease, chunk, ChunkResult(committed=True, rows=index))
        elif committed is False:
            failure = ChunkResult(committed=False, error_code="E", error_message="boom")
            store.complete(outcome.lease, chunk, failure)
    return shape


def _commit(store: LedgerStore, chunks: Sequence[Chunk], shape: CampaignShape) -> None:
    for chunk in chunks:
        outcome = store.acquire_lease(shape, chunk, "finisher", 30)
        assert outcome.lease is not None
        store.complete(outcome.lease, chunk, ChunkResult(committed=True))


@pytest.mark.parametrize("scope", [(1, 4), (3, 3), (5, 8)])
def test_a_scoped_load_decides_as_the_full_load_in_its_scope(
    backend: Backend, scope: tuple[int, int]
) -> None:
    shape = _campaign(backend.open())
    full = backend.open().load(shape.run_key)
    scoped = backend.open().initialize(shape, "b", 5, scope)
    assert full is not None
    first, last = scope
    for index in range(first, last + 1):
        assert scoped.state_of(index) == full.state_of(index)
        assert scoped.records.get(index) == full.records.get(index)
    assert scoped.shape == full.shape
    assert not scoped.complete and not full.complete
    if scoped.scope is not None:  # a store that checked the campaign where it lives
        assert backend.name == "postgres"
        assert set(scoped.records) <= set(range(first, last + 1))
        assert scoped.committed_total == 2
        with pytest.raises(ValueError, match="outside the loaded chunks"):
            scoped.state_of(last + 1 if last < shape.chunk_count else first - 1)


def test_a_scoped_load_says_when_the_whole_campaign_is_complete(backend: Backend) -> None:
    shape = make_shape("bf-scoped", chunks=4)
    store = backend.open()
    store.initialize(shape, "a", 5)
    assert not backend.open().initialize(shape, "b", 5, (2, 3)).complete
    _commit(store, shape.chunks[:3], shape)  # chunk 4, outside the scope, is not
    assert not backend.open().initialize(shape, "b", 5, (2, 3)).complete
    _commit(store, shape.chunks[3:], shape)
    assert backend.open().initialize(shape, "b", 5, (2, 3)).complete


@pytest.mark.parametrize(
    "override",
    [
        {"idempotency_key": "sha256:" + "0" * 64},
        {"chunk_start": '"1999-01-01"'},
        {"state": "exploded"},
        {"attempt": 0},
        {"state": "running"},  # running with no lease owner or expiry
    ],
    ids=["key", "bounds", "state", "attempt", "running-without-lease"],
)
def test_a_corrupt_record_outside_the_scope_is_refused(
    backend: Backend, override: dict[str, Any]
) -> None:
    shape = _campaign(backend.open())
    backend.inject(shape.run_key, bad_record(shape, 7, **override))
    with pytest.raises(DponeError) as full:
        backend.open().load(shape.run_key)
    with pytest.raises(DponeError) as scoped:
        backend.open().initialize(shape, "b", 5, (1, 2))
    assert scoped.value.code == errors.LEDGER_CORRUPT
    assert scoped.value.message == full.value.message
    assert "chunk 7" in scoped.value.message


@pytest.mark.parametrize("edit", ['"1999-01-01"', None], ids=["edited", "deleted"])
def test_an_edited_chunk_row_outside_the_scope_is_refused(
    backend: Backend, edit: str | None
) -> None:
    if not backend.sql:
        pytest.skip("the local file store keeps no separate chunk rows")
    shape = _campaign(backend.open())
    backend.edit_shape_row(shape.run_key, 8, edit)
    with pytest.raises(DponeError) as scoped:
        backend.open().initialize(shape, "b", 5, (1, 2))
    assert scoped.value.code == errors.LEDGER_CORRUPT


@pytest.mark.postgres
def test_postgres_checks_the_campaign_in_one_pipeline_and_reads_only_the_scope(
    pg_dsn: str, pg_schema: str, sent: list[tuple[str, bool]]
) -> None:
    from dpone.ledger.postgres import PostgresLedger

    shape = _campaign(PostgresLedger(pg_dsn, pg_schema))
    fresh = PostgresLedger(pg_dsn, pg_schema)
    try:
        sent.clear()
        ledger = fresh.initialize(shape, "b", 5, (2, 3))
        loads = [(statement, piped) for statement, piped in sent if piped]
        assert len(loads) == 3, sent  # the head, the campaign's check, the scope's records
        assert not any(
            "FROM" in s and '.campaign_chunk" WHERE run_key = %s ORDER' in s for s, _ in sent
        )
        assert any("BETWEEN" in statement for statement, _ in loads)
        assert ledger.scope == (2, 3) and set(ledger.records) == {2, 3}
        assert ledger.committed_total == 2
    finally:
        fresh.close()


@pytest.mark.postgres
def test_lost_committed_transitions_outside_the_scope_are_refused(
    pg_dsn: str, pg_schema: str
) -> None:
    from dpone.ledger.postgres import PostgresLedger

    store = PostgresLedger(pg_dsn, pg_schema)
    try:
        shape = _campaign(store)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                f'DELETE FROM "{pg_schema}".chunk_transition WHERE run_key = %s '
                "AND chunk_index = 2",
                (shape.run_key,),
            )
        with pytest.raises(DponeError) as scoped:
            PostgresLedger(pg_dsn, pg_schema).initialize(shape, "b", 5, (5, 8))
        assert scoped.value.code == errors.LEDGER_CORRUPT
        assert "lost their committed transitions" in scoped.value.message
    finally:
        store.close()


def test_a_checked_load_of_a_complete_campaign_reads_no_record(backend: Backend) -> None:
    """What a run asks once its chunks are committed: is the campaign complete? On Postgres
    the check answers without reading any chunk's record; elsewhere the full load does."""
    shape = make_shape("bf-scoped", chunks=4)
    store = backend.open()
    store.initialize(shape, "a", 5)
    _commit(store, shape.chunks, shape)
    checked = backend.open().load_checked(shape)
    assert checked is not None and checked.complete
    if checked.scope is not None:
        assert backend.name == "postgres"
        assert checked.scope == (1, 0) and checked.records == {}
        assert checked.committed_total == 4
    backend.inject(shape.run_key, bad_record(shape, 3, idempotency_key="sha256:" + "0" * 64))
    with pytest.raises(DponeError) as full:
        backend.open().load(shape.run_key)
    with pytest.raises(DponeError) as again:
        backend.open().load_checked(shape)
    assert again.value.message == full.value.message
