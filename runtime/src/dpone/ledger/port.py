"""The state-store port every ledger adapter implements, and the records it speaks in.

The ledger, never Airflow, decides what is committed. Adapters declare their capabilities;
mapped execution refuses a store that lacks any of the three distributed ones.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from dpone.plan.chunks import Bound, Chunk
from dpone.records import record

T = TypeVar("T")


class ChunkState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMMITTED = "committed"
    FAILED = "failed"


@record
class Capabilities:
    distributed_lock: bool
    distributed_chunk_lease: bool
    compare_and_set_completion: bool

    @property
    def mapped_ready(self) -> bool:
        return (
            self.distributed_lock
            and self.distributed_chunk_lease
            and self.compare_and_set_completion
        )


@record
class CampaignShape:
    """What a campaign is: its key, the chunk list and the hashes that must not drift."""

    run_key: str
    workload: str
    process: str
    plan_hash: str
    config_hash: str
    chunks: tuple[Chunk, ...]

    @property
    def chunk_count(self) -> int:
        return len(self.chunks)


@record
class ChunkRecord:
    """The latest known transition of one chunk (a ledger row, merged latest-wins per chunk)."""

    chunk_index: int
    state: ChunkState
    attempt: int
    idempotency_key: str
    lease_owner: str | None = None
    lease_expires_at: dt.datetime | None = None
    rows: int | None = None
    checksum: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    seq: int = 0
    recorded_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    #: the source's checksum of the chunk, when the read-back gate compared content
    source_checksum: str | None = None


@record
class Ledger:
    """A merged view: the campaign snapshot plus the latest record of every chunk."""

    shape: CampaignShape
    records: dict[int, ChunkRecord]
    cancelled: bool = False
    cancel_reason: str | None = None
    now: dt.datetime | None = None  # the store's clock when loaded (database clock for SQL)
    #: the first and last chunk whose records were loaded (a mapped item's chunks: the store
    #: checked the rest of the campaign where it lives; ``(1, 0)``: none); None: every chunk's
    scope: tuple[int, int] | None = None
    #: with a scope, how many of the campaign's chunks are committed
    committed_total: int = 0

    def state_of(self, index: int) -> ChunkState:
        if self.scope is not None and not self.scope[0] <= index <= self.scope[1]:
            raise ValueError(f"chunk {index} is outside the loaded chunks {self.scope}")
        record = self.records.get(index)
        return record.state if record else ChunkState.PENDING

    @property
    def complete(self) -> bool:
        if self.scope is not None:
            return self.committed_total == self.shape.chunk_count
        return all(self.state_of(c.index) is ChunkState.COMMITTED for c in self.shape.chunks)


@record
class Amendment:
    """One extension of a campaign's plan, as the ledger recorded it (ADR 0020)."""

    run_key: str
    old_plan_hash: str
    new_plan_hash: str
    old_chunk_count: int
    new_chunk_count: int
    amended_by: str  # the owner token of the run that extended it (host:pid:random)
    amended_at: dt.datetime | None = None  # the store's clock


@record
class Restatement:
    """A committed chunk marked to be moved again, as the ledger recorded it."""

    run_key: str
    chunk_index: int
    transition: int  # the PENDING transition the restatement appended
    reason: str
    requested_by: str
    prior_rows: int | None = None  # what the committed record said it had moved
    prior_checksum: str | None = None
    requested_at: dt.datetime | None = None  # the store's clock


ConfigHashAt = Callable[[Bound], str]
"""The planned configuration's config_hash with the window's end replaced by the given bound:
what the stored campaign's config_hash must be when only the end moved."""


@record
class Lease:
    """Proof of ownership of one chunk attempt; completion is compare-and-set on (owner, attempt)."""

    run_key: str
    chunk_index: int
    owner: str
    attempt: int
    expires_at: dt.datetime


class LeaseStatus(StrEnum):
    ACQUIRED = "acquired"
    ALREADY_COMMITTED = "already_committed"
    BUSY = "busy"  # an active, unexpired lease of another owner
    CANCELLED = "cancelled"


@record
class LeaseOutcome:
    status: LeaseStatus
    lease: Lease | None = None
    holder: ChunkRecord | None = None
    cancel_reason: str | None = None  # set with CANCELLED: what the operator recorded


@record
class ChunkResult:
    """What a chunk attempt achieved; written by complete()."""

    committed: bool
    rows: int = 0
    checksum: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: the source's checksum of the chunk, when the read-back gate compared content
    source_checksum: str | None = None


class LedgerStore(Protocol):
    """The port. Every method is safe to call from many processes at once (for distributed stores).

    - initialize: under a short campaign lock (bounded wait, then DPONE_AIRFLOW_MAPPING_CAMPAIGN_BUSY)
      create the campaign if absent, else verify plan_hash, config_hash and chunk count
      (DPONE_LEDGER_SHAPE_MISMATCH); return the merged ledger. Never held while data moves.
      With ``scope`` (a mapped item's first and last chunk), a store that can check the whole
      campaign where it lives (its chunk rows equal the plan's, every latest record agrees
      with its chunk, every committed mark is still committed) loads only those chunks'
      records and says how many of the campaign's are committed; any disagreement, or a
      store that cannot, loads every record (and names what is wrong).
    - load_checked: the planned campaign checked as a scoped initialize checks it, with no
      chunk's records (scope ``(1, 0)``): whether it is complete, for a run that just committed
      its chunks; a store that cannot check where it lives loads every record.
    - acquire_lease: under the chunk's lock: cancelled -> CANCELLED; committed -> ALREADY_COMMITTED;
      running with unexpired lease (database clock) -> BUSY; else write RUNNING(owner, attempt+1,
      expiry = db now + lease_seconds).
    - complete: under the chunk's lock, compare the latest record's (owner, attempt) with the lease;
      mismatch or a non-running latest record -> DponeError(DPONE_BACKFILL_CHUNK_LEASE_LOST); else
      append COMMITTED or FAILED.
    - complete_in_transaction: like complete, but runs ``write(connection)`` after the CAS check and
      inside the same database transaction as the completion record (exactly-once when the sink is
      the ledger's own database). If ``write`` raises, that transaction is rolled back, a FAILED
      record is appended (CAS-checked) in a fresh transaction and the exception propagates.
      Stores that cannot do that raise NotImplementedError.
    - renew: extend an owned lease (CAS on owner and attempt) for chunks that run long.
    - cancel: mark the campaign cancelled (or undo it), recording who asked; acquire_lease reads
      it before every lease. False when there was nothing to undo (nothing written).
    - extend: under the campaign lock, grow the stored campaign to ``shape`` when its chunks are
      the first chunks of ``shape`` (same bounds and keys) and ``config_hash_at(stored end)`` is
      the stored config_hash: append the new chunk rows, a new campaign snapshot (new plan_hash,
      config_hash, chunk count; cancel flag kept) and an Amendment, in one transaction. Anything
      else raises DPONE_LEDGER_SHAPE_MISMATCH with the reason and the way out. A campaign
      already at ``shape`` is left as it is. Returns the merged ledger (as initialize).
    - amendments: the recorded extensions of a campaign, oldest first.
    - restate: under each chunk's lock (ascending, one transaction, all or nothing): every
      selected chunk leased now (RUNNING, unexpired by the store's clock) refuses the whole call
      (DPONE_BACKFILL_CHUNK_BUSY); every COMMITTED one gets a PENDING transition (next transition
      number, so the fence holds), loses its committed mark and gains a Restatement; others are
      left as they are (they move anyway). Returns the restated indexes. The next lease of a
      restated chunk is a new attempt under the usual lease and fence.
    - restatements: every recorded restatement of a campaign, oldest first.
    - committed_count: how many of the campaign's chunks are committed (committed and not
      restated since; 0 for an unknown campaign). A COMMITTED record is final unless restated
      (which drops its mark in the same transaction), so a campaign is complete only when this is its
      chunk count: one short read that spares a run the full load of every chunk's record
      while the campaign cannot be complete yet.
    """

    capabilities: Capabilities
    name: str

    def initialize(
        self,
        shape: CampaignShape,
        owner: str,
        lock_timeout_s: float,
        scope: tuple[int, int] | None = None,
    ) -> Ledger: ...

    def load(self, run_key: str) -> Ledger | None: ...

    def load_checked(self, shape: CampaignShape) -> Ledger | None: ...

    def extend(
        self,
        shape: CampaignShape,
        config_hash_at: ConfigHashAt,
        owner: str,
        lock_timeout_s: float,
    ) -> Ledger: ...

    def amendments(self, run_key: str) -> list[Amendment]: ...

    def restate(
        self, shape: CampaignShape, indexes: Sequence[int], reason: str, requested_by: str
    ) -> list[int]: ...

    def restatements(self, run_key: str) -> list[Restatement]: ...

    def committed_count(self, run_key: str) -> int: ...

    def acquire_lease(
        self, shape: CampaignShape, chunk: Chunk, owner: str, lease_seconds: float
    ) -> LeaseOutcome: ...

    def complete(self, lease: Lease, chunk: Chunk, result: ChunkResult) -> None: ...

    def complete_in_transaction(
        self, lease: Lease, chunk: Chunk, write: Callable[[Any], ChunkResult]
    ) -> ChunkResult: ...

    def renew(self, lease: Lease, lease_seconds: float) -> Lease: ...

    def cancel(
        self, run_key: str, reason: str, undo: bool = False, by: str | None = None
    ) -> bool: ...

    def list_campaigns(self, workload: str | None = None) -> list[str]: ...

    def close(self) -> None: ...
