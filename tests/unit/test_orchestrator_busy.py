"""What a busy chunk's refusal says: the lease's expiry when a record holds it, the open
transaction when its lock is the lease (the one-commit placement has no expiry to give)."""

from __future__ import annotations

import datetime as dt

from dpone import errors
from dpone.ledger.port import ChunkRecord, ChunkState, LeaseOutcome, LeaseStatus
from dpone.observability.progress import NoProgressSink
from dpone.observability.result import RunOutcome
from dpone.plan.chunks import Chunk
from dpone.run.orchestrator import _lease_refused, _Tally


def _refusal(outcome: LeaseOutcome) -> str:
    tally = _Tally(RunOutcome("w", "p", "rk", "internal", "fp"), NoProgressSink())
    assert _lease_refused(outcome, Chunk(51, "2024-01-01", "2024-01-02", "k"), tally) is False
    error = tally.outcome.error
    assert error is not None and error.code == errors.CHUNK_BUSY
    return error.message


def test_a_chunk_whose_lock_is_the_lease_is_named_as_being_moved() -> None:
    # Regression: it said "leased by another attempt until ?"
    message = _refusal(LeaseOutcome(LeaseStatus.BUSY))
    assert message.startswith("chunk 51 is being moved by another attempt")
    assert "?" not in message


def test_a_leased_chunk_gives_its_expiry() -> None:
    until = dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC)
    holder = ChunkRecord(
        chunk_index=51,
        state=ChunkState.RUNNING,
        attempt=2,
        idempotency_key="k",
        lease_expires_at=until,
    )
    message = _refusal(LeaseOutcome(LeaseStatus.BUSY, holder=holder))
    assert message == f"chunk 51 is leased by another attempt until {until.isoformat()}"
