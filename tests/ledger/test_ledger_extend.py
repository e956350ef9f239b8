"""`extend` over the three stores (real Postgres, the MSSQL double, the local file; ADR 0020).

A grown plan on the same grid keeps the campaign: the stored chunks' records are untouched, the
new chunks are added, the amendment is recorded once. Anything else is refused with the reason,
and nothing is written.
"""

from __future__ import annotations

import datetime as dt

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.port import CampaignShape, ChunkResult, ChunkState, LeaseStatus, LedgerStore
from dpone.plan.chunks import Bound, ChunkSpec, plan_chunks, plan_hash
from ledger_backends import CONFIG_HASH, Backend

RUN_KEY = "orders-2024"
OTHER_CONFIG = "sha256:" + "1" * 64


def shape_of(
    start: str, end: str, step: int = 1, unit: str = "day", config_hash: str = CONFIG_HASH
) -> CampaignShape:
    planned = plan_chunks(ChunkSpec("day", "date", start, end, step, unit), RUN_KEY)
    return CampaignShape(RUN_KEY, "wl", "proc", plan_hash(planned), config_hash, planned)


def same_config(end: Bound) -> str:
    """The planned configuration, its end set back to ``end``: only the end moved."""
    return CONFIG_HASH


def commit(store: LedgerStore, shape: CampaignShape, indexes: range, rows: int = 10) -> None:
    for index in indexes:
        outcome = store.acquire_lease(shape, shape.chunks[index - 1], "pod", 30)
        assert outcome.lease is not None
        store.complete(
            outcome.lease,
            shape.chunks[index - 1],
            ChunkResult(True, rows=rows + index, checksum=f"c{index}"),
        )


def test_a_later_end_extends_the_campaign_and_keeps_its_records(backend: Backend) -> None:
    old = shape_of("2024-01-01", "2024-01-07")
    store = backend.open()
    store.initialize(old, "creator", 5)
    commit(store, old, range(1, 5))
    before = store.load(RUN_KEY)
    assert before is not None

    grown = shape_of("2024-01-01", "2024-01-11")
    with pytest.raises(DponeError) as caught:
        store.initialize(grown, "run-2", 5)
    assert caught.value.code == errors.LEDGER_SHAPE_MISMATCH, "initialize alone never amends"
    ledger = store.extend(grown, same_config, "run-2:host:1", 5)

    assert ledger.shape == grown and ledger.shape.chunk_count == 10
    for index in range(1, 5):  # committed before: the very same records, nothing new
        assert ledger.records[index] == before.records[index]
    assert all(ledger.state_of(i) is ChunkState.PENDING for i in range(5, 11))
    (amendment,) = store.amendments(RUN_KEY)
    assert (amendment.old_chunk_count, amendment.new_chunk_count) == (6, 10)
    assert (amendment.old_plan_hash, amendment.new_plan_hash) == (old.plan_hash, grown.plan_hash)
    assert amendment.amended_by == "run-2:host:1" and amendment.amended_at is not None

    other = backend.open()  # a second pod of the regenerated DAG finds the campaign extended
    assert other.initialize(grown, "run-3", 5).shape == grown
    assert other.extend(grown, same_config, "run-3", 5).shape == grown
    assert len(other.amendments(RUN_KEY)) == 1, "extending again records nothing"
    assert (
        other.acquire_lease(grown, grown.chunks[0], "run-3", 30).status
        is LeaseStatus.ALREADY_COMMITTED
    )
    commit(other, grown, range(5, 11))
    final = backend.open().load(RUN_KEY)
    assert final is not None and final.complete
    assert all(final.records[i] == before.records[i] for i in range(1, 5))

    # an old pod still planning the 6-chunk window is refused: the campaign never shrinks
    with pytest.raises(DponeError) as caught:
        backend.open().extend(old, same_config, "old-pod", 5)
    assert caught.value.code == errors.LEDGER_SHAPE_MISMATCH
    assert "never shrinks" in caught.value.message


def test_an_extension_keeps_a_cancellation(backend: Backend) -> None:
    old = shape_of("2024-01-01", "2024-01-04")
    store = backend.open()
    store.initialize(old, "creator", 5)
    store.cancel(RUN_KEY, "hold on")
    ledger = store.extend(shape_of("2024-01-01", "2024-01-06"), same_config, "run-2", 5)
    assert ledger.cancelled and ledger.cancel_reason == "hold on"


@pytest.mark.parametrize(
    ("planned", "config_at", "why"),
    [
        (shape_of("2024-01-01", "2024-01-05"), same_config, "never shrinks"),
        (shape_of("2023-12-30", "2024-01-11"), same_config, "a moved start shifts every chunk"),
        (shape_of("2024-01-01", "2024-01-13", step=2), same_config, "the chunk grid changed"),
        # fewer chunks because they are longer: the grid changed, not a shrink
        (shape_of("2024-01-01", "2024-01-07", step=2), same_config, "the chunk grid changed"),
        (shape_of("2024-01-01", "2024-01-11"), lambda end: OTHER_CONFIG, "may move the end only"),
    ],
    ids=["shrink", "earlier-start", "grid", "grid-fewer-chunks", "config"],
)
def test_what_is_not_an_extension_is_refused_and_writes_nothing(
    backend: Backend, planned: CampaignShape, config_at: object, why: str
) -> None:
    old = shape_of("2024-01-01", "2024-01-07")
    store = backend.open()
    store.initialize(old, "creator", 5)
    commit(store, old, range(1, 3))
    with pytest.raises(DponeError) as caught:
        store.extend(planned, config_at, "run-2", 5)  # type: ignore[arg-type]
    assert caught.value.code == errors.LEDGER_SHAPE_MISMATCH
    assert why in caught.value.message and "new backfill_id" in caught.value.message
    after = backend.open().load(RUN_KEY)
    assert after is not None and after.shape == old, "the stored campaign is unchanged"
    assert store.amendments(RUN_KEY) == []


def test_a_clipped_last_chunk_is_not_extended(backend: Backend) -> None:
    old = shape_of("2024-01-01", "2024-01-06", step=2)  # chunks 1-3, the last [01-05, 01-06)
    store = backend.open()
    store.initialize(old, "creator", 5)
    with pytest.raises(DponeError) as caught:
        store.extend(shape_of("2024-01-01", "2024-01-09", step=2), same_config, "run-2", 5)
    assert "was clipped to the old end" in caught.value.message
    assert store.amendments(RUN_KEY) == []


def test_an_unknown_campaign_is_simply_created(backend: Backend) -> None:
    shape = shape_of("2024-01-01", "2024-01-03")
    ledger = backend.open().extend(shape, same_config, "first", 5)
    assert ledger.shape == shape and backend.open().amendments(RUN_KEY) == []
    assert dt.date.fromisoformat(str(ledger.shape.chunks[-1].end)) == dt.date(2024, 1, 3)


@pytest.mark.postgres
def test_a_version_2_schema_is_migrated_and_its_campaign_extended(
    pg_dsn: str, pg_schema: str
) -> None:
    """An audit schema written by the previous release (version 2) gains campaign_amendment
    on first open; its campaign, created before, extends like any other."""
    import psycopg
    from dpone.ledger.postgres import MIGRATIONS, PostgresLedger

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        for version in (1, 2):
            for statement in MIGRATIONS[version](f'"{pg_schema}"'):
                conn.execute(statement)
            conn.execute(f'INSERT INTO "{pg_schema}".schema_version (version) VALUES ({version})')
        old = shape_of("2024-01-01", "2024-01-04")
        conn.execute(
            f'INSERT INTO "{pg_schema}".campaign (run_key, workload, process, plan_hash, '
            "config_hash, chunk_count, created_by) VALUES (%s, 'wl', 'proc', %s, %s, 3, 'v2')",
            (RUN_KEY, old.plan_hash, CONFIG_HASH),
        )
        for chunk in old.chunks:
            conn.execute(
                f'INSERT INTO "{pg_schema}".campaign_chunk VALUES (%s, %s, %s, %s, %s)',
                (RUN_KEY, chunk.index, f'"{chunk.start}"', f'"{chunk.end}"', chunk.idempotency_key),
            )
    with PostgresLedger(pg_dsn, pg_schema) as store:
        commit(store, old, range(1, 4))
        ledger = store.extend(shape_of("2024-01-01", "2024-01-06"), same_config, "run-2", 5)
        assert ledger.shape.chunk_count == 5 and len(store.amendments(RUN_KEY)) == 1
        assert [ledger.state_of(i).value for i in range(1, 6)] == ["committed"] * 3 + [
            "pending"
        ] * 2
