"""The ledger protocol every adapter shares, and the SQL algorithm the Postgres and MSSQL adapters run.

Pure parts (lock keys, bound encoding, record validation, the lease decision, failure records) are
used by every store, the local file one included, so the three cannot drift apart. ``SqlLedger``
is the lock / lease / compare-and-set algorithm written once against ``LedgerTx``: a dialect
supplies the statements and the lock primitive, never the decisions.

Ordering comes from a per-chunk transition number appended under the chunk's lock and fenced by
``UNIQUE (run_key, chunk_index, transition)``; the identity ``seq`` is kept for audit only, because
a sequence is assigned at insert, not at commit, and so orders nothing across chunks.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import operator
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum
from typing import Any, ClassVar, Generic, Protocol, Self, TypedDict, TypeVar

from dpone import errors
from dpone.credentials.connections import redact
from dpone.credentials.redaction import redact_text
from dpone.errors import DponeError
from dpone.ledger.amend import check_extension, config_changed
from dpone.ledger.port import (
    Amendment,
    CampaignShape,
    Capabilities,
    ChunkRecord,
    ChunkResult,
    ChunkState,
    ConfigHashAt,
    Lease,
    LeaseOutcome,
    LeaseStatus,
    Ledger,
    Restatement,
)
from dpone.lifecycle.faults import fault_point
from dpone.plan.canonical import json_scalar
from dpone.plan.chunks import Bound, Chunk, plan_hash
from dpone.records import record

SCHEMA_VERSION = 4
"""The audit-schema version this release writes; a newer stored version is refused.

Version 2 adds ``committed_chunk``: one row per chunk ever committed, written in the same
transaction as its COMMITTED transition, so committed transitions that disappear later are
detected (DPONE_LEDGER_CORRUPT) instead of the chunk being moved again. Version 3 adds
``chunk_transition.source_checksum`` (the read-back gate's source side). Version 4 adds
``campaign_amendment`` (one row per extension of a campaign's plan, ADR 0020) and
``chunk_restatement`` (one row per restated chunk)."""

DEFAULT_SCHEMA = "dpone_audit"
SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
ERROR_MESSAGE_LIMIT = 2000
DISTRIBUTED = Capabilities(
    distributed_lock=True, distributed_chunk_lease=True, compare_and_set_completion=True
)


class TxMode(StrEnum):
    """What a ledger transaction is for; dialects tune timeouts and batching by it."""

    READ = "read"  # load: one consistent read-only snapshot
    CAMPAIGN = "campaign"  # initialize / cancel: under the campaign lock
    CHUNK = "chunk"  # acquire / complete / renew: under one chunk's lock, ledger rows only
    WRITE = "write"  # complete_in_transaction: the caller's data write shares the transaction


def check_schema_name(schema: str) -> str:
    """The audit schema is spliced into SQL as an identifier, so it must be a plain one."""
    if not isinstance(schema, str) or not SCHEMA_NAME.match(schema):
        raise DponeError(
            errors.CONFIG_INVALID,
            f"audit schema name {schema!r} is not a plain identifier (letters, digits, _; "
            "at most 63 characters, not starting with a digit)",
        )
    return schema


def bound_text(value: Bound) -> str:
    """A chunk bound as stored: its canonical JSON scalar ("2024-01-01" quoted, 42 bare).

    json_scalar writes what json.dumps writes for an exact str or int, without its per-call
    set-up (a campaign of 8,760 chunks encodes 17,520 bounds); anything else takes json.dumps."""
    text = json_scalar(value)
    return (
        text if text is not None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    )


def parse_bound(text: str) -> Bound:
    value = json.loads(text)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"not a chunk bound: {text!r}")
    return value


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()


def campaign_lock_key(schema: str, run_key: str) -> int:
    """Signed 64-bit advisory-lock key of a campaign: sha256, never the 32-bit ``hashtext``."""
    return int.from_bytes(_digest("dpone-campaign", schema, run_key)[:8], "big", signed=True)


@functools.lru_cache(maxsize=1024)
def chunk_lock_class(schema: str, run_key: str) -> int:
    """Signed 32-bit first half of the two-integer chunk lock key (the second is the index).

    A collision between two campaigns only makes them share a lock slot for equal indexes (a short
    wait, never a wrong answer): every row is still keyed by run_key.
    """
    return int.from_bytes(_digest("dpone-chunk", schema, run_key)[:4], "big", signed=True)


def schema_lock_key(schema: str) -> int:
    """Advisory-lock key that serializes DDL on one audit schema across processes."""
    return int.from_bytes(_digest("dpone-ddl", schema)[:8], "big", signed=True)


def lock_resource(schema: str, run_key: str, chunk_index: int | None = None) -> str:
    """A short, case-stable applock resource name (nvarchar(255)) for a campaign or a chunk."""
    campaign = _digest("dpone-campaign", schema, run_key).hex()[:32]
    if chunk_index is None:
        return f"dpone/{schema}/{campaign}"
    return f"dpone/{schema}/{campaign}/{chunk_index}"


def utc(value: Any) -> dt.datetime:
    """A database timestamp as an aware UTC datetime (drivers return naive UTC or aware values)."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):
        raise TypeError(f"expected a timestamp, got {type(value).__name__}")
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def optional_utc(value: Any) -> dt.datetime | None:
    return None if value is None else utc(value)


def optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def as_stored(value: Any) -> Any:
    return value


R = TypeVar("R")


class RowCodec(Generic[R]):
    """One record type's stored row, said once: ``spec`` lists its columns in the order of the
    dataclass's fields as ``column[:type][=field]`` (type ``int``, ``bool``, ``utc``, or none for
    text; a trailing ``?`` for nullable; a bare ``:?`` keeps the stored value as it is; ``=field``
    where the attribute is named otherwise); ``generated`` columns are filled in by the database
    on insert."""

    _DECODERS: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "": str,
        "int": int,
        "bool": bool,
        "utc": utc,
        "?": as_stored,
        "int?": optional_int,
        "utc?": optional_utc,
    }

    def __init__(self, make: Callable[..., R], spec: str, *, generated: str = "") -> None:
        self._make = make
        parsed = [re.fullmatch(r"(\w+)(?::([\w?]*))?(?:=(\w+))?", item) for item in spec.split()]
        columns = [(m[1], self._DECODERS[m[2] or ""], m[3] or m[1]) for m in parsed if m]
        assert len(columns) == len(spec.split()), spec
        self._decoders = tuple(decode for _, decode, _ in columns)
        #: field name -> (decoder, nullable), in column order: the JSON form's keys
        self._fields = {
            field: (decode, (m[2] or "").endswith("?"))
            for m, (_, decode, field) in zip(parsed, columns, strict=True)
            if m
        }
        written = [(name, field) for name, _, field in columns if name not in generated.split()]
        #: the select list, in the order :meth:`decode` reads
        self.selected = ", ".join(name for name, _, _ in columns)
        #: the insert list, in the order :meth:`params` gives
        self.inserted = ", ".join(name for name, _ in written)
        self._written = tuple(field for _, field in written)

    def decode(self, row: Sequence[Any]) -> R:
        return self._make(*map(operator.call, self._decoders, row))

    def params(self, record: object) -> tuple[Any, ...]:
        values = (getattr(record, name) for name in self._written)
        return tuple(v.value if isinstance(v, Enum) else v for v in values)

    def to_json(self, record: object, *, omit: str = "") -> dict[str, Any]:
        """The record as a JSON object keyed by field, timestamps as UTC ISO text (the local file
        store's form); ``omit`` names fields the enclosing object already holds."""
        entry: dict[str, Any] = {}
        omitted = omit.split()
        for name in self._fields:
            if name not in omitted:
                value = getattr(record, name)
                if isinstance(value, dt.datetime):
                    value = value.astimezone(dt.UTC).isoformat()
                entry[name] = value.value if isinstance(value, Enum) else value
        return entry

    def from_json(self, entry: Mapping[str, Any], **known: Any) -> R:
        """The record :meth:`to_json` wrote; ``known`` gives the omitted fields."""
        values = dict(known)
        for name, (decode, nullable) in self._fields.items():
            if name not in known:
                values[name] = decode(entry.get(name) if nullable else entry[name])
        return self._make(**values)


def first_line(text: str, limit: int = ERROR_MESSAGE_LIMIT) -> str:
    """Driver messages put row values in DETAIL lines; keep only the primary line."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit]


def stored_text(text: str | None) -> str | None:
    """Free text a ledger row keeps (error message, cancel reason): redacted, then bounded to
    ERROR_MESSAGE_LIMIT characters."""
    return None if text is None else redact_text(text)[:ERROR_MESSAGE_LIMIT]


def failure_from_exception(exc: BaseException) -> tuple[str, str]:
    """The (error_code, error_message) a FAILED record stores for an exception of a chunk write."""
    if isinstance(exc, DponeError):
        return exc.code, redact_text(exc.message)[:ERROR_MESSAGE_LIMIT]
    return errors.SINK_FAILED, first_line(redact_text(f"{type(exc).__name__}: {exc}"))


@record
class CampaignHead:
    """The latest campaign snapshot row, without its chunk list."""

    run_key: str
    workload: str
    process: str
    plan_hash: str
    config_hash: str
    chunk_count: int
    cancelled: bool
    cancel_reason: str | None
    created_by: str
    seq: int = 0
    created_at: dt.datetime | None = None

    @classmethod
    def new(cls, shape: CampaignShape, owner: str) -> CampaignHead:
        """The first snapshot of the campaign ``shape`` plans (seq and created_at: the store's)."""
        return cls(
            shape.run_key,
            shape.workload,
            shape.process,
            shape.plan_hash,
            shape.config_hash,
            shape.chunk_count,
            cancelled=False,
            cancel_reason=None,
            created_by=owner,
        )

    def cancelling(self, reason: str, undo: bool, by: str | None = None) -> CampaignHead:
        """The snapshot with the cancelled flag set (``undo``: cleared) for ``reason``, written
        by ``by`` (who asked; None: the snapshot's writer is kept)."""
        writer = self.created_by if by is None else redact_text(by)[:ERROR_MESSAGE_LIMIT]
        return replace(
            self, cancelled=not undo, cancel_reason=stored_text(reason), created_by=writer
        )


@record
class StoredTransition:
    """One chunk transition row exactly as stored (state and bounds not yet validated)."""

    seq: int
    chunk_index: int
    transition: int
    state: str
    attempt: int
    idempotency_key: str
    chunk_start: str
    chunk_end: str
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    started_at: dt.datetime | None
    rows: int | None
    checksum: str | None
    error_code: str | None
    error_message: str | None
    recorded_at: dt.datetime | None
    source_checksum: str | None = None


@record
class NewTransition:
    """A transition to append; recorded_at and seq come from the database."""

    chunk_index: int
    transition: int
    state: ChunkState
    attempt: int
    idempotency_key: str
    chunk_start: str
    chunk_end: str
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    started_at: dt.datetime | None
    rows: int | None = None
    checksum: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    source_checksum: str | None = None

    @classmethod
    def of(
        cls,
        chunk: ShapeRow,
        transition: int,
        state: ChunkState,
        attempt: int,
        *,
        owner: str | None = None,
        expires: dt.datetime | None = None,
        started_at: dt.datetime | None = None,
    ) -> NewTransition:
        """Transition ``transition`` of the stored chunk (its index, bounds and key), leased to
        ``owner`` until ``expires`` when it is held; every store builds its records here."""
        return cls(
            chunk_index=chunk.chunk_index,
            transition=transition,
            state=state,
            attempt=attempt,
            idempotency_key=chunk.idempotency_key,
            chunk_start=chunk.chunk_start,
            chunk_end=chunk.chunk_end,
            lease_owner=owner,
            lease_expires_at=expires,
            started_at=started_at,
        )


@record
class ShapeRow:
    """One chunk of the stored campaign shape: bounds as stored and its idempotency key."""

    chunk_index: int
    chunk_start: str
    chunk_end: str
    idempotency_key: str

    @classmethod
    def of(cls, chunk: Chunk) -> ShapeRow:
        return _shape_row(chunk)


@functools.lru_cache(maxsize=200_000)
def _shape_row(chunk: Chunk) -> ShapeRow:
    """Chunks are immutable and re-encoded on every call of a campaign: encode each once."""
    return ShapeRow(
        chunk.index, bound_text(chunk.start), bound_text(chunk.end), chunk.idempotency_key
    )


@record
class ChunkView:
    """Everything a chunk decision needs, read in one statement under the chunk's lock."""

    now: dt.datetime
    campaign_found: bool
    cancelled: bool
    cancel_reason: str | None
    shape: ShapeRow | None
    latest: StoredTransition | None


def corrupt(run_key: str, chunk_index: int | None, why: str) -> DponeError:
    where = f"campaign {run_key!r}" + (f" chunk {chunk_index}" if chunk_index is not None else "")
    return DponeError(errors.LEDGER_CORRUPT, f"{where}: {why}")


def validate_transition(
    run_key: str, shape: Mapping[int, ShapeRow], row: StoredTransition
) -> ChunkRecord:
    """A stored transition as a ChunkRecord, or LEDGER_CORRUPT naming the campaign and chunk."""
    expected = shape.get(row.chunk_index)
    if expected is None:
        raise corrupt(
            run_key,
            row.chunk_index,
            f"record seq {row.seq} names a chunk index outside 1..{len(shape)}",
        )
    if row.idempotency_key != expected.idempotency_key:
        raise corrupt(
            run_key,
            row.chunk_index,
            f"record seq {row.seq} has idempotency key {row.idempotency_key!r}, "
            f"the campaign has {expected.idempotency_key!r}",
        )
    if (row.chunk_start, row.chunk_end) != (expected.chunk_start, expected.chunk_end):
        raise corrupt(
            run_key,
            row.chunk_index,
            f"record seq {row.seq} has bounds [{row.chunk_start}, {row.chunk_end}), "
            f"the campaign has [{expected.chunk_start}, {expected.chunk_end})",
        )
    try:
        state = ChunkState(row.state)
    except ValueError:
        raise corrupt(
            run_key, row.chunk_index, f"record seq {row.seq} has unknown state {row.state!r}"
        ) from None
    if row.attempt < 1:
        raise corrupt(run_key, row.chunk_index, f"record seq {row.seq} has attempt {row.attempt}")
    if state is ChunkState.RUNNING and (row.lease_owner is None or row.lease_expires_at is None):
        raise corrupt(
            run_key, row.chunk_index, f"running record seq {row.seq} has no lease owner or expiry"
        )
    return ChunkRecord(
        chunk_index=row.chunk_index,
        state=state,
        attempt=row.attempt,
        idempotency_key=row.idempotency_key,
        lease_owner=row.lease_owner,
        lease_expires_at=row.lease_expires_at,
        rows=row.rows,
        checksum=row.checksum,
        error_code=row.error_code,
        error_message=row.error_message,
        seq=row.seq,
        recorded_at=row.recorded_at,
        started_at=row.started_at,
        source_checksum=row.source_checksum,
    )


def shape_from_rows(head: CampaignHead, rows: Sequence[ShapeRow]) -> CampaignShape:
    """Rebuild the campaign shape from stored rows; LEDGER_CORRUPT if they disagree with the head."""
    if len(rows) != head.chunk_count:
        raise corrupt(
            head.run_key,
            None,
            f"{len(rows)} chunk rows stored, the snapshot says {head.chunk_count}",
        )
    chunks: list[Chunk] = []
    for position, row in enumerate(rows, start=1):
        if row.chunk_index != position:
            raise corrupt(
                head.run_key,
                row.chunk_index,
                f"chunk rows are not contiguous (expected {position})",
            )
        try:
            start, end = parse_bound(row.chunk_start), parse_bound(row.chunk_end)
        except ValueError:
            raise corrupt(
                head.run_key, row.chunk_index, "stored bounds are not JSON scalars"
            ) from None
        chunks.append(Chunk(row.chunk_index, start, end, row.idempotency_key))
    shape = tuple(chunks)
    if plan_hash(shape) != head.plan_hash:
        raise corrupt(
            head.run_key, None, "stored chunk rows do not hash to the snapshot's plan_hash"
        )
    return CampaignShape(
        head.run_key, head.workload, head.process, head.plan_hash, head.config_hash, shape
    )


def verified_shape(
    head: CampaignHead, rows: Sequence[ShapeRow], planned: CampaignShape | None
) -> CampaignShape:
    """The stored shape, verified. ``planned`` is a shape check_shape_input accepted (chunks
    1..n that hash to its plan_hash). When the rows are, text for text, its chunks' rows under
    the same plan_hash (the common case: every run plans before it loads), its chunks are that
    shape: parsing the rows back and hashing them again would give the same chunks and hash, at
    a cost that grows with the campaign. Anything else is rebuilt from the rows by
    shape_from_rows, which names what is wrong."""
    if (
        planned is not None
        and planned.plan_hash == head.plan_hash
        and len(rows) == len(planned.chunks)
        and all(row == ShapeRow.of(chunk) for row, chunk in zip(rows, planned.chunks, strict=True))
    ):
        return CampaignShape(
            head.run_key,
            head.workload,
            head.process,
            head.plan_hash,
            head.config_hash,
            planned.chunks,
        )
    return shape_from_rows(head, rows)


def merge_ledger(
    head: CampaignHead,
    shape: CampaignShape,
    latest: Sequence[StoredTransition],
    now: dt.datetime | None,
    committed_marks: Set[int] | None = None,
    *,
    scope: tuple[int, int] | None = None,
    checked: CampaignCheck | None = None,
) -> Ledger:
    """The campaign snapshot merged with the latest record of every chunk (validated).

    ``committed_marks`` (chunks recorded as committed) must all still be committed: a COMMITTED
    transition is final (a restatement drops the mark with it), so a marked chunk whose latest
    record is anything else lost its transitions to an edit or a partial restore, and moving it
    again would duplicate rows. With a ``scope``, ``latest`` holds only its chunks' records and
    ``checked`` is the whole campaign's check in the database (marks included).
    """
    chunks = shape.chunks if scope is None else shape.chunks[scope[0] - 1 : scope[1]]
    rows = {chunk.index: ShapeRow.of(chunk) for chunk in chunks}
    records: dict[int, ChunkRecord] = {}
    for row in latest:
        if row.chunk_index in records:
            raise corrupt(head.run_key, row.chunk_index, "two latest records for one chunk")
        records[row.chunk_index] = validate_transition(head.run_key, rows, row)
    if committed_marks:
        lost = sorted(
            index
            for index in committed_marks
            if index not in records or records[index].state is not ChunkState.COMMITTED
        )
        if lost:
            shown = ", ".join(str(i) for i in lost[:10]) + (" ..." if len(lost) > 10 else "")
            raise corrupt(
                head.run_key,
                None,
                f"{len(lost)} committed chunk(s) lost their committed transitions (chunks "
                f"{shown}); refusing to move them again: restore the ledger from a backup",
            )
    return Ledger(
        shape=shape,
        records=records,
        cancelled=head.cancelled,
        cancel_reason=head.cancel_reason if head.cancelled else None,
        now=now,
        scope=scope,
        committed_total=checked.committed if checked is not None else 0,
    )


def extended_head(head: CampaignHead, shape: CampaignShape) -> CampaignHead:
    """The snapshot of an extended campaign: the new plan, the rest (cancel flag too) kept."""
    return replace(
        head,
        plan_hash=shape.plan_hash,
        config_hash=shape.config_hash,
        chunk_count=shape.chunk_count,
        seq=0,
        created_at=None,
    )


AMENDMENTS: RowCodec[Amendment] = RowCodec(
    Amendment,
    "run_key old_plan_hash new_plan_hash old_chunk_count:int new_chunk_count:int "
    "amended_by amended_at:utc?",
    generated="amended_at",
)


@record
class Extension:
    """One extend() request (see the port): grow the stored campaign to ``shape``."""

    shape: CampaignShape
    config_hash_at: ConfigHashAt
    owner: str

    def of(
        self, head: CampaignHead | None, stored_rows: Callable[[], Sequence[ShapeRow]]
    ) -> tuple[CampaignHead, Amendment] | None:
        """The grown snapshot and its amendment, or None when there is nothing to grow (no
        campaign, or one already at ``shape``); the stored rows are read only when needed."""
        shape = self.shape
        if head is None or head.plan_hash == shape.plan_hash:
            return None
        stored = shape_from_rows(head, stored_rows())
        check_extension(stored, head.config_hash, shape, self.config_hash_at)
        amendment = Amendment(
            run_key=shape.run_key,
            old_plan_hash=head.plan_hash,
            new_plan_hash=shape.plan_hash,
            old_chunk_count=head.chunk_count,
            new_chunk_count=shape.chunk_count,
            amended_by=self.owner,
        )
        return extended_head(head, shape), amendment


def restate_selection(shape: CampaignShape, indexes: Sequence[int]) -> list[Chunk]:
    """The planned chunks of ``indexes``, ascending and once each (the lock order)."""
    wanted = sorted(set(indexes))
    outside = [i for i in wanted if not 1 <= i <= shape.chunk_count]
    if outside or not wanted:
        raise DponeError(
            errors.USAGE,
            f"campaign {shape.run_key!r}: restate needs chunks within 1-{shape.chunk_count}"
            + (f" (got {outside[:5]})" if outside else ""),
        )
    return [shape.chunks[i - 1] for i in wanted]


def restate_plan(
    run_key: str, seen: Sequence[tuple[Chunk, dt.datetime, ChunkRecord | None]]
) -> list[int]:
    """The indexes a restatement marks, or DPONE_BACKFILL_CHUNK_BUSY naming the chunks leased
    now: a pod is moving them, so nothing is restated. Marked: the committed chunks, and the
    RUNNING ones whose lease expired, whose attempt (a frozen pod that may yet wake) must not
    record its completion of rows read before the restatement: the PENDING record fences it."""
    busy = [
        (chunk.index, record)
        for chunk, now, record in seen
        if record is not None
        and record.state is ChunkState.RUNNING
        and record.lease_expires_at is not None
        and record.lease_expires_at > now
    ]
    if busy:
        shown = ", ".join(
            f"chunk {index} (attempt {r.attempt} of {r.lease_owner}, until "
            f"{r.lease_expires_at.isoformat() if r.lease_expires_at else '?'})"
            for index, r in busy[:5]
        )
        raise DponeError(
            errors.CHUNK_BUSY,
            f"campaign {run_key!r}: {len(busy)} selected chunk(s) leased now: {shown}; nothing "
            "was restated: restate them once their run has committed them (or its lease expired)",
        )
    return [
        chunk.index
        for chunk, _, record in seen
        if record is not None and record.state in (ChunkState.COMMITTED, ChunkState.RUNNING)
    ]


def restate_busy(run_key: str, busy: Sequence[int]) -> DponeError:
    """DPONE_BACKFILL_CHUNK_BUSY for chunks a run's open transaction holds (the one-commit
    placement: no RUNNING record is committed while they move)."""
    shown = ", ".join(str(index) for index in busy[:10]) + (", ..." if len(busy) > 10 else "")
    which = f"chunk {shown}" if len(busy) == 1 else f"chunks {shown}"
    return DponeError(
        errors.CHUNK_BUSY,
        f"campaign {run_key!r}: {len(busy)} selected chunk(s) being moved now, {which} (a "
        "run's open transaction holds their lock); nothing was restated: restate them once "
        "their run has committed them",
    )


def restated_record(chunk: Chunk, latest: ChunkRecord, transition: int) -> NewTransition:
    """The PENDING transition that hands a committed chunk back to the lease rule (its attempt
    kept: the next lease is attempt + 1)."""
    return NewTransition.of(ShapeRow.of(chunk), transition, ChunkState.PENDING, latest.attempt)


def restatement_of(
    run_key: str, record: NewTransition, prior: ChunkRecord, reason: str, requested_by: str
) -> Restatement:
    return Restatement(
        run_key=run_key,
        chunk_index=record.chunk_index,
        transition=record.transition,
        reason=stored_text(reason) or "",
        requested_by=stored_text(requested_by) or "",
        prior_rows=prior.rows,
        prior_checksum=prior.checksum,
    )


RESTATEMENTS: RowCodec[Restatement] = RowCodec(
    Restatement,
    "run_key chunk_index:int transition:int reason requested_by prior_rows:int? "
    "prior_checksum:? requested_at:utc?",
    generated="requested_at",
)


def verify_shape(stored: CampaignHead, shape: CampaignShape) -> None:
    """DPONE_LEDGER_SHAPE_MISMATCH when the stored campaign is not the one this run plans."""
    if (stored.plan_hash, stored.chunk_count) == (shape.plan_hash, shape.chunk_count):
        if stored.config_hash != shape.config_hash:
            raise config_changed(shape.run_key)
        return
    drift = [
        f"{name} stored {old!r} != planned {new!r}"
        for name, old, new in (
            ("plan_hash", stored.plan_hash, shape.plan_hash),
            ("config_hash", stored.config_hash, shape.config_hash),
            ("chunk_count", stored.chunk_count, shape.chunk_count),
        )
        if old != new
    ]
    if drift:
        raise DponeError(
            errors.LEDGER_SHAPE_MISMATCH, f"campaign {shape.run_key!r}: " + "; ".join(drift)
        )


def check_shape_input(shape: CampaignShape) -> None:
    """A shape whose chunk list is not 1..n or does not hash to its plan_hash is a caller bug."""
    for position, chunk in enumerate(shape.chunks, start=1):
        if chunk.index != position:
            raise DponeError(
                errors.INTERNAL,
                f"campaign {shape.run_key!r}: chunk {chunk.index} at position {position}",
            )
    if plan_hash(shape.chunks) != shape.plan_hash:
        raise DponeError(
            errors.INTERNAL, f"campaign {shape.run_key!r}: chunks do not hash to plan_hash"
        )


def check_chunk(run_key: str, chunk: Chunk, stored: ShapeRow | None) -> None:
    """The chunk a caller names must be the stored campaign's chunk, byte for byte."""
    if stored is None:
        raise corrupt(run_key, chunk.index, "no such chunk in the stored campaign")
    if stored != ShapeRow.of(chunk):
        raise corrupt(
            run_key,
            chunk.index,
            f"the stored chunk [{stored.chunk_start}, {stored.chunk_end}) key {stored.idempotency_key!r} "
            f"differs from the planned [{bound_text(chunk.start)}, {bound_text(chunk.end)}) "
            f"key {chunk.idempotency_key!r}",
        )


@record
class LeaseDecision:
    """What acquire_lease does with a chunk: the outcome status and the attempt to write, if any."""

    status: LeaseStatus
    attempt: int | None = None  # set when a new RUNNING record must be appended
    reuse: bool = False  # the caller already holds the active lease (same owner): no new record


def decide_lease(
    cancelled: bool, latest: ChunkRecord | None, now: dt.datetime, owner: str
) -> LeaseDecision:
    """The lease rule, in the port's order: cancelled, committed, active lease, else a new attempt."""
    if cancelled:
        return LeaseDecision(LeaseStatus.CANCELLED)
    if latest is None:
        return LeaseDecision(LeaseStatus.ACQUIRED, attempt=1)
    if latest.state is ChunkState.COMMITTED:
        return LeaseDecision(LeaseStatus.ALREADY_COMMITTED)
    if latest.state is ChunkState.RUNNING:
        assert latest.lease_expires_at is not None
        if latest.lease_expires_at > now:
            if latest.lease_owner == owner:
                return LeaseDecision(LeaseStatus.ACQUIRED, attempt=latest.attempt, reuse=True)
            return LeaseDecision(LeaseStatus.BUSY)
    return LeaseDecision(LeaseStatus.ACQUIRED, attempt=latest.attempt + 1)


def check_owner(lease: Lease, latest: ChunkRecord | None) -> ChunkRecord:
    """Compare-and-set guard: the latest record must be this lease's RUNNING attempt."""
    if (
        latest is None
        or latest.state is not ChunkState.RUNNING
        or latest.lease_owner != lease.owner
        or latest.attempt != lease.attempt
    ):
        now_held = (
            "no record"
            if latest is None
            else f"{latest.state.value} attempt {latest.attempt} owned by {latest.lease_owner!r}"
        )
        raise DponeError(
            errors.CHUNK_LEASE_LOST,
            f"campaign {lease.run_key!r} chunk {lease.chunk_index}: owner {lease.owner!r} attempt "
            f"{lease.attempt} no longer holds the lease (latest: {now_held}); this attempt's "
            "completion was not recorded",
        )
    return latest


def completion_record(
    lease: Lease, chunk: Chunk, latest: ChunkRecord, transition: int, result: ChunkResult
) -> NewTransition:
    """The COMMITTED or FAILED transition that closes a lease (the lease expiry is cleared)."""
    state = ChunkState.COMMITTED if result.committed else ChunkState.FAILED
    shape = ShapeRow.of(chunk)
    closing = NewTransition.of(
        shape, transition, state, lease.attempt, owner=lease.owner, started_at=latest.started_at
    )
    return replace(
        closing,
        rows=result.rows,
        checksum=result.checksum,
        error_code=result.error_code,
        error_message=stored_text(result.error_message),
        source_checksum=result.source_checksum,
    )


def running_record(
    chunk: Chunk,
    transition: int,
    attempt: int,
    owner: str,
    expires: dt.datetime,
    started: dt.datetime,
) -> NewTransition:
    shape = ShapeRow.of(chunk)
    return NewTransition.of(
        shape,
        transition,
        ChunkState.RUNNING,
        attempt,
        owner=owner,
        expires=expires,
        started_at=started,
    )


def check_renewal(
    lease: Lease, stored: ShapeRow | None, row: StoredTransition | None
) -> ChunkRecord:
    """The running record a renewal extends: the chunk must exist in the stored campaign and
    its latest transition must be this lease's RUNNING attempt."""
    if stored is None:
        raise corrupt(lease.run_key, lease.chunk_index, "no such chunk in the stored campaign")
    latest = None
    if row is not None:
        latest = validate_transition(lease.run_key, {lease.chunk_index: stored}, row)
    return check_owner(lease, latest)


def renewal_record(
    lease: Lease, running: ChunkRecord, stored: ShapeRow, transition: int, expires: dt.datetime
) -> NewTransition:
    """The RUNNING transition of the same attempt with a later expiry."""
    return NewTransition.of(
        stored,
        transition,
        ChunkState.RUNNING,
        lease.attempt,
        owner=lease.owner,
        expires=expires,
        started_at=running.started_at,
    )


def check_lease_chunk(lease: Lease, chunk: Chunk) -> None:
    """A lease completes only the chunk it was taken for."""
    if lease.chunk_index != chunk.index:
        raise DponeError(
            errors.INTERNAL,
            f"lease of chunk {lease.chunk_index} used to complete chunk {chunk.index}",
        )


@record
class Appended:
    """What a combined read-and-append step wrote (None when its condition did not hold)."""

    transition: int
    attempt: int
    lease_expires_at: dt.datetime | None


def validated_latest(run_key: str, chunk: Chunk, view: ChunkView) -> ChunkRecord | None:
    """The view's latest record, after checking the campaign, the chunk and the record itself."""
    if not view.campaign_found:
        raise corrupt(run_key, chunk.index, "no campaign snapshot: initialize the campaign first")
    check_chunk(run_key, chunk, view.shape)
    assert view.shape is not None
    if view.latest is None:
        return None
    return validate_transition(run_key, {chunk.index: view.shape}, view.latest)


def next_transition(view: ChunkView) -> int:
    return 1 if view.latest is None else view.latest.transition + 1


def _reason_of(decision: LeaseDecision, view: ChunkView) -> str | None:
    """The cancel reason a CANCELLED lease outcome carries to the pod's error message."""
    return view.cancel_reason if decision.status is LeaseStatus.CANCELLED else None


@record
class StoredState:
    """What a load reads of a campaign in one transaction: its head (None: no such campaign)
    with the database clock read beside it, its chunk rows (None when not asked for), each
    chunk's latest transition and the chunks ever committed."""

    head: CampaignHead | None
    now: dt.datetime | None = None
    shape_rows: list[ShapeRow] | None = None
    latest: list[StoredTransition] = field(default_factory=list)
    marks: set[int] = field(default_factory=set)


@record
class CampaignCheck:
    """A campaign checked where it is stored, in one statement: its chunk rows (their count,
    and the plan hash of their text, built as :func:`dpone.plan.chunks.plan_hash` builds it),
    the latest records that disagree with their chunk row or break a record rule (what
    :func:`validate_transition` refuses), the committed marks whose chunk is no longer
    committed (what :func:`merge_ledger` refuses) and the chunks committed."""

    chunk_rows: int
    rows_plan_hash: str | None
    bad_records: int
    lost_marks: int
    committed: int

    def agrees(self, head: CampaignHead, planned: CampaignShape) -> bool:
        """Whether the stored campaign is the planned one with nothing wrong in it: its chunk
        rows are the plan's text for text (a different row, or a row text the plan would have
        written otherwise, gives another hash)."""
        count = len(planned.chunks)
        return (
            head.plan_hash == planned.plan_hash == self.rows_plan_hash
            and head.chunk_count == count
            and self.chunk_rows == count
            and self.bad_records == 0
            and self.lost_marks == 0
        )


@record
class ScopedState:
    """What a scoped load reads in one transaction: the head with the database clock, the
    whole campaign's check, and the latest transition of each chunk in the scope."""

    head: CampaignHead | None
    now: dt.datetime | None = None
    check: CampaignCheck | None = None
    latest: list[StoredTransition] = field(default_factory=list)


def scoped_ledger(
    planned: CampaignShape, scope: tuple[int, int], state: ScopedState
) -> Ledger | None:
    """The ledger of the scope's chunks when the stored campaign checked out as the planned
    one; None when it did not (the full load then names what is wrong)."""
    head, check = state.head, state.check
    if head is None or check is None or not check.agrees(head, planned):
        return None
    return merge_ledger(head, planned, state.latest, state.now, scope=scope, checked=check)


def state_in_turn(tx: LedgerTx, run_key: str, with_shape: bool) -> StoredState:
    """A load's reads one statement after the other (a dialect without pipelining)."""
    head = tx.campaign_head(run_key)
    if head is None:
        return StoredState(None)
    now = tx.db_now()
    rows = tx.shape_rows(run_key) if with_shape else None
    return StoredState(head, now, rows, tx.latest_transitions(run_key), tx.committed_marks(run_key))


class LedgerTx(Protocol):
    """One open ledger transaction of a SQL dialect. Locks are transaction-scoped: commit or
    rollback releases them, so a crashed process can never leave one behind."""

    connection: Any

    def lock_campaign(self, run_key: str, timeout_s: float) -> None:
        """Take the campaign lock or raise DPONE_AIRFLOW_MAPPING_CAMPAIGN_BUSY after timeout_s."""

    def lock_chunk(self, run_key: str, chunk_index: int) -> None:
        """Take the chunk lock (bounded wait; ChunkLockTimeout). May be sent lazily (pipelined)."""

    def campaign_head(self, run_key: str) -> CampaignHead | None: ...

    def insert_campaign(self, head: CampaignHead) -> None: ...

    def insert_shape(self, run_key: str, rows: Sequence[ShapeRow]) -> None: ...

    def chunk_view(self, run_key: str, chunk_index: int) -> ChunkView: ...

    def append_transition(self, run_key: str, record: NewTransition) -> None: ...

    def lease_append(
        self, run_key: str, chunk: Chunk, owner: str, lease_seconds: float
    ) -> tuple[ChunkView, Appended | None]:
        """Read the chunk and append a new RUNNING attempt iff the lease rule says so."""

    def close_append(
        self, run_key: str, chunk: Chunk, lease: Lease, result: ChunkResult
    ) -> tuple[ChunkView, Appended | None]:
        """Read the chunk and append COMMITTED/FAILED iff the lease still owns it (CAS)."""

    def shape_rows(self, run_key: str) -> list[ShapeRow]: ...

    def latest_transitions(self, run_key: str) -> list[StoredTransition]: ...

    def committed_marks(self, run_key: str) -> set[int]:
        """Indexes of the campaign's chunks that were ever committed (schema version 2)."""

    def load_state(self, run_key: str, with_shape: bool) -> StoredState:
        """What a load reads, in this one transaction (see :func:`state_in_turn`)."""

    def insert_amendment(self, amendment: Amendment) -> None:
        """Record one extension (schema version 4); the store's clock stamps it."""

    def amendments(self, run_key: str) -> list[Amendment]: ...

    def insert_restatement(self, restatement: Restatement) -> None:
        """Record one restatement (schema version 4); the store's clock stamps it."""

    def unmark_committed(self, run_key: str, chunk_index: int) -> None:
        """Drop a restated chunk's committed mark: it is no longer committed."""

    def restatements(self, run_key: str) -> list[Restatement]: ...

    def db_now(self) -> dt.datetime: ...

    def run_keys(self, workload: str | None) -> list[str]: ...


class ChunkLockTimeout(DponeError):
    """The chunk lock stayed taken past the bounded wait (its holder is stalled mid-transaction)."""

    def __init__(self, run_key: str, chunk_index: int, timeout_s: float) -> None:
        super().__init__(
            errors.CHUNK_BUSY,
            f"campaign {run_key!r} chunk {chunk_index}: the chunk lock was not free within "
            f"{timeout_s:g}s (another transaction on this chunk is stalled)",
        )


class WriteFailed(Exception):
    """Carries an exception of a caller's write through the transaction so it is rolled back
    but never translated into a ledger error."""

    def __init__(self, cause: BaseException | None, result: ChunkResult | None = None) -> None:
        super().__init__("chunk write failed")
        self.cause = cause
        self.result = result


@dataclass
class _GroupLeases:
    """What a group's leasing reached: its leases (with their outcomes), the refused lease that
    ended it, or the chunk ``left`` before it."""

    leased: list[tuple[Chunk, Lease]] = field(default_factory=list)
    outcomes: list[LeaseOutcome] = field(default_factory=list)
    refused: list[tuple[Chunk, LeaseOutcome, ChunkResult | None]] = field(default_factory=list)
    left: Chunk | None = None


def _written(write: Callable[[], Any]) -> Any:
    """Run a group's write; any exception, or a result not committed, is WriteFailed."""
    try:
        return write()
    except Exception as exc:
        raise WriteFailed(exc) from exc


@dataclass
class GroupMove:
    """What :meth:`SqlLedger.lease_and_complete_group` did (ADR 0022).

    ``members``: the chunks whose lease statement ran in the group's transaction, in order,
    with their outcome and (for a leased one) result: committed together, or the one chunk of a
    group that failed alone (its failure recorded as by ``lease_and_complete``). A refused lease
    (committed, cancelled) ends the group as its last member. ``left``: a chunk taken for the
    group whose lock another session held (not leased here: move it next, on its own wait).
    ``rolled_back``: the leases of a group of several chunks whose transaction rolled back
    (nothing of it is recorded; ``cause`` says why): move those chunks again one by one.
    """

    members: list[tuple[Chunk, LeaseOutcome, ChunkResult | None]]
    left: Chunk | None = None
    rolled_back: list[tuple[Chunk, Lease]] = field(default_factory=list)
    cause: BaseException | None = None


class ViewThenAppend:
    """The combined steps as a read, the Python rule, then an append (for dialects without a
    single conditional-insert statement)."""

    def chunk_view(self, run_key: str, chunk_index: int) -> ChunkView:
        raise NotImplementedError

    def append_transition(self, run_key: str, record: NewTransition) -> None:
        raise NotImplementedError

    def lease_append(
        self, run_key: str, chunk: Chunk, owner: str, lease_seconds: float
    ) -> tuple[ChunkView, Appended | None]:
        view = self.chunk_view(run_key, chunk.index)
        latest = validated_latest(run_key, chunk, view)
        decision = decide_lease(view.cancelled, latest, view.now, owner)
        if decision.status is not LeaseStatus.ACQUIRED or decision.reuse:
            return view, None
        assert decision.attempt is not None
        expires = view.now + dt.timedelta(seconds=lease_seconds)
        record = running_record(
            chunk, next_transition(view), decision.attempt, owner, expires, view.now
        )
        self.append_transition(run_key, record)
        return view, Appended(record.transition, record.attempt, expires)

    def close_append(
        self, run_key: str, chunk: Chunk, lease: Lease, result: ChunkResult
    ) -> tuple[ChunkView, Appended | None]:
        view = self.chunk_view(run_key, chunk.index)
        latest = validated_latest(run_key, chunk, view)
        try:
            running = check_owner(lease, latest)
        except DponeError:
            return view, None
        record = completion_record(lease, chunk, running, next_transition(view), result)
        self.append_transition(run_key, record)
        return view, Appended(record.transition, record.attempt, None)


class StoreBase(ABC):
    """What every ledger store (SQL or local file) does the same way around its own locking."""

    @abstractmethod
    def initialize(
        self,
        shape: CampaignShape,
        owner: str,
        lock_timeout_s: float,
        scope: tuple[int, int] | None = None,
    ) -> Ledger: ...

    @abstractmethod
    def _grow(self, extension: Extension, lock_timeout_s: float) -> None:
        """Under the campaign lock: apply ``extension.of`` to the stored campaign, if it grows."""

    def extend(
        self,
        shape: CampaignShape,
        config_hash_at: ConfigHashAt,
        owner: str,
        lock_timeout_s: float,
    ) -> Ledger:
        """Grow the stored campaign to ``shape`` (see the port), then initialize as usual."""
        check_shape_input(shape)
        self._grow(Extension(shape, config_hash_at, owner), lock_timeout_s)
        return self.initialize(shape, owner, lock_timeout_s)

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SqlStoreOptions(TypedDict, total=False):
    """The keyword options every SQL store passes through to ``SqlLedger.__init__``."""

    lock_timeout_s: float
    chunk_lock_timeout_s: float
    application_name: str
    create: bool


class SqlLedger(StoreBase):
    """The lock / lease / compare-and-set protocol over a SQL audit schema (see the port)."""

    capabilities: Capabilities = DISTRIBUTED
    name: str = "sql"
    #: opened without creating (`ledger list`) on a schema that does not exist: no campaigns
    absent: bool = False

    def __init__(
        self,
        dsn: str,
        schema: str = DEFAULT_SCHEMA,
        lease_seconds: float = 300.0,
        *,
        lock_timeout_s: float = 10.0,
        chunk_lock_timeout_s: float = 30.0,
        application_name: str = "dpone-ledger",
        create: bool = True,
    ) -> None:
        """The one constructor of every SQL store: a dialect sets its own options first, then
        this settles the shared ones, lets the dialect prepare its connection (``_prepare``) and
        creates or migrates the audit schema (``create``), or only reads its version."""
        self.schema = check_schema_name(schema)
        self.lease_seconds = float(lease_seconds)
        self.lock_timeout_s = float(lock_timeout_s)
        self.chunk_lock_timeout_s = float(chunk_lock_timeout_s)
        # Chunk rows of a campaign never change once written: verify them (count, contiguity,
        # plan hash) on the first load only, so reloading a large campaign reads just the
        # latest transitions. Every transition is still validated against this shape.
        self._verified_shapes: dict[tuple[str, str], CampaignShape] = {}
        self._dsn = dsn
        self._prepare(dsn, application_name)
        if create:
            self.ensure_schema()
        else:
            self.inspect_schema()

    @abstractmethod
    def _prepare(self, dsn: str, application_name: str) -> None:
        """The dialect's statements and connection settings; no connection is opened yet."""

    @abstractmethod
    def ensure_schema(self) -> None:
        """Create or migrate the audit schema, safely from many processes."""

    @abstractmethod
    def inspect_schema(self) -> None:
        """Read the audit schema's version without creating or migrating anything."""

    @abstractmethod
    def _transaction(self, op: str, mode: TxMode) -> AbstractContextManager[LedgerTx]:
        """Open a transaction; commit on success, roll back on error; translate driver errors
        (connection loss -> DPONE_CONNECTION_FAILED) but re-raise WriteFailed untouched."""

    # --- driver failures, with the DSN redacted and the driver's first line only ---------------
    _dsn: str = ""

    def _unreachable(self, reason: str) -> DponeError:
        return DponeError(
            errors.CONNECTION_FAILED,
            f"cannot connect to the ledger database {redact(self._dsn)}: {reason}",
        )

    def _lost_during(self, op: str, detail: str) -> DponeError:
        return DponeError(
            errors.CONNECTION_FAILED,
            f"the ledger database connection failed during {op} ({redact(self._dsn)}): "
            f"{detail}; the outcome of this call is unknown, retry the task",
        )

    def _database_error(self, op: str, detail: str) -> DponeError:
        return DponeError(
            errors.LEDGER_UNAVAILABLE,
            f"ledger database error during {op} in schema {self.schema!r}: {detail}",
        )

    # --- the audit schema's version -------------------------------------------------------------
    def _check_version(self, version: int | None) -> None:
        """Refuse a schema a newer dpone migrated."""
        if version is not None and version > SCHEMA_VERSION:
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"audit schema {self.schema!r} is at version {version}; this dpone knows versions "
                f"up to {SCHEMA_VERSION}: upgrade dpone",
            )

    def _foreign_version_table(self) -> DponeError:
        """A schema_version table that is not dpone's (another tool's migrations)."""
        return DponeError(
            errors.LEDGER_UNAVAILABLE,
            f"schema {self.schema!r} holds a schema_version table that is not a dpone audit "
            "schema's (another tool's?): give the ledger a schema of its own (state.schema, "
            "or --schema)",
        )

    def _inspected(self, version: int | None) -> None:
        """What reading (never migrating) a schema at ``version`` allows: none is an empty
        ledger; an older one is refused, since reading it needs the migration a run applies."""
        self._check_version(version)
        self.absent = version is None
        if version is not None and version < SCHEMA_VERSION:
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"audit schema {self.schema!r} is at version {version} of {SCHEMA_VERSION}: the "
                "next `dpone run` on it migrates it; listing never changes a ledger",
            )

    # --- campaign -------------------------------------------------------------------------------
    def initialize(
        self,
        shape: CampaignShape,
        owner: str,
        lock_timeout_s: float,
        scope: tuple[int, int] | None = None,
    ) -> Ledger:
        """Create or verify the campaign under the campaign lock; merge-load outside of it, so
        the lock is held for one short transaction however large the campaign is; with a
        scope, load only its chunks where the dialect can check the rest in the database."""
        check_shape_input(shape)
        with self._transaction("initialize", TxMode.CAMPAIGN) as tx:
            tx.lock_campaign(shape.run_key, lock_timeout_s)
            fault_point("campaign_locked")
            stored = tx.campaign_head(shape.run_key)
            if stored is None:
                tx.insert_campaign(CampaignHead.new(shape, owner))
                tx.insert_shape(shape.run_key, [ShapeRow.of(chunk) for chunk in shape.chunks])
            else:
                verify_shape(stored, shape)
        scoped = self._load_scope(shape, scope) if scope is not None else None
        if scoped is not None:
            return scoped
        ledger = self._load(shape.run_key, shape)
        if ledger is None:
            raise corrupt(shape.run_key, None, "the campaign vanished right after initialization")
        if ledger.shape.chunks != shape.chunks:
            raise corrupt(shape.run_key, None, "stored chunks differ from the planned chunks")
        return ledger

    def load(self, run_key: str) -> Ledger | None:
        return self._load(run_key, None)

    def load_checked(self, shape: CampaignShape) -> Ledger | None:
        return self._load_scope(shape, (1, 0)) or self.load(shape.run_key)

    def _load_scope(self, planned: CampaignShape, scope: tuple[int, int]) -> Ledger | None:
        """The scope's ledger when the dialect checks the whole campaign in the database (see
        :class:`CampaignCheck`); None here: the full load."""
        return None

    def _grow(self, extension: Extension, lock_timeout_s: float) -> None:
        """The chunk rows, the snapshot and the amendment commit together under the campaign
        lock, so many pods of a regenerated DAG extend it once and every other one finds it done."""
        run_key = extension.shape.run_key
        with self._transaction("extend", TxMode.CAMPAIGN) as tx:
            tx.lock_campaign(run_key, lock_timeout_s)
            head = tx.campaign_head(run_key)
            grown = extension.of(head, lambda: tx.shape_rows(run_key))
            if grown is not None:
                assert head is not None
                extended, amendment = grown
                new_chunks = extension.shape.chunks[head.chunk_count :]
                tx.insert_shape(run_key, [ShapeRow.of(chunk) for chunk in new_chunks])
                tx.insert_campaign(extended)
                tx.insert_amendment(amendment)

    def amendments(self, run_key: str) -> list[Amendment]:
        with self._transaction("amendments", TxMode.READ) as tx:
            return tx.amendments(run_key)

    def restate(
        self, shape: CampaignShape, indexes: Sequence[int], reason: str, requested_by: str
    ) -> list[int]:
        """Mark committed chunks to be moved again (see the port): the campaign lock (one
        restatement at a time), each chunk's lock in ascending order, then every decision, then
        the writes, in one transaction."""
        chunks = restate_selection(shape, indexes)
        with self._transaction("restate", TxMode.CAMPAIGN) as tx:
            tx.lock_campaign(shape.run_key, self.lock_timeout_s)
            held = getattr(tx, "chunks_held_elsewhere", None)
            if held is not None:  # never wait for a run's transaction: refuse at once
                busy = held(shape.run_key, [chunk.index for chunk in chunks])
                if busy:
                    raise restate_busy(shape.run_key, busy)
            seen = []
            for chunk in chunks:
                view, latest = self._view(tx, shape.run_key, chunk)
                seen.append((chunk, view, latest))
            todo = restate_plan(shape.run_key, [(c, v.now, r) for c, v, r in seen])
            for chunk, view, latest in seen:
                if chunk.index not in todo:
                    continue
                assert latest is not None and view.latest is not None
                record = restated_record(chunk, latest, view.latest.transition + 1)
                tx.append_transition(shape.run_key, record)
                tx.unmark_committed(shape.run_key, chunk.index)
                tx.insert_restatement(
                    restatement_of(shape.run_key, record, latest, reason, requested_by)
                )
        return todo

    def restatements(self, run_key: str) -> list[Restatement]:
        with self._transaction("restatements", TxMode.READ) as tx:
            return tx.restatements(run_key)

    def committed_count(self, run_key: str) -> int:
        with self._transaction("committed_count", TxMode.READ) as tx:
            return len(tx.committed_marks(run_key))

    def _load(self, run_key: str, planned: CampaignShape | None) -> Ledger | None:
        """The campaign's reads in one transaction (pipelined where the dialect can); its chunk
        rows are read and verified once per plan of the campaign."""
        known = any(key[0] == run_key for key in self._verified_shapes)
        with self._transaction("load", TxMode.READ) as tx:
            state = tx.load_state(run_key, with_shape=not known)
            head = state.head
            if head is None:
                return None
            shape = self._verified_shapes.get((run_key, head.plan_hash))
            if shape is None:
                rows = tx.shape_rows(run_key) if state.shape_rows is None else state.shape_rows
                shape = verified_shape(head, rows, planned)
        self._verified_shapes[(run_key, head.plan_hash)] = shape
        return merge_ledger(head, shape, state.latest, state.now, state.marks)

    def cancel(self, run_key: str, reason: str, undo: bool = False, by: str | None = None) -> bool:
        """Append a snapshot with the cancelled flag flipped (under the campaign lock); False,
        and nothing written, when ``undo`` finds the campaign not cancelled."""
        with self._transaction("cancel", TxMode.CAMPAIGN) as tx:
            tx.lock_campaign(run_key, self.lock_timeout_s)
            head = tx.campaign_head(run_key)
            if head is None:
                raise DponeError(
                    errors.USAGE, f"no campaign {run_key!r} in audit schema {self.schema!r}"
                )
            if undo and not head.cancelled:
                return False
            tx.insert_campaign(head.cancelling(reason, undo, by))
            return True

    def list_campaigns(self, workload: str | None = None) -> list[str]:
        if self.absent:
            return []
        with self._transaction("list_campaigns", TxMode.READ) as tx:
            return tx.run_keys(workload)

    # --- chunks ---------------------------------------------------------------------------------
    def _view(
        self, tx: LedgerTx, run_key: str, chunk: Chunk
    ) -> tuple[ChunkView, ChunkRecord | None]:
        """Lock the chunk, read it, and validate what was read against the stored campaign."""
        tx.lock_chunk(run_key, chunk.index)
        view = tx.chunk_view(run_key, chunk.index)
        return view, validated_latest(run_key, chunk, view)

    @staticmethod
    def _disagree(run_key: str, chunk: Chunk, what: str) -> DponeError:
        return DponeError(
            errors.INTERNAL,
            f"campaign {run_key!r} chunk {chunk.index}: the SQL and Python lease rules disagree "
            f"({what}); the transaction was rolled back",
        )

    def acquire_lease(
        self, shape: CampaignShape, chunk: Chunk, owner: str, lease_seconds: float
    ) -> LeaseOutcome:
        """Under the chunk lock, one read-and-conditional-append; the Python rule re-decides from
        the same read and must agree with what the statement wrote, else nothing commits."""
        try:
            with self._transaction("acquire_lease", TxMode.CHUNK) as tx:
                return self._lease_in(tx, shape, chunk, owner, lease_seconds)
        except ChunkLockTimeout:
            return LeaseOutcome(LeaseStatus.BUSY)

    def _lease_in(
        self, tx: LedgerTx, shape: CampaignShape, chunk: Chunk, owner: str, lease_seconds: float
    ) -> LeaseOutcome:
        """The lease decision and its RUNNING record inside ``tx`` (which holds the chunk lock
        from here to its end)."""
        tx.lock_chunk(shape.run_key, chunk.index)
        view, appended = tx.lease_append(shape.run_key, chunk, owner, lease_seconds)
        fault_point("lease_locked")
        return self._leased(shape.run_key, chunk, owner, view, appended)

    def _leased(
        self, run_key: str, chunk: Chunk, owner: str, view: ChunkView, appended: Appended | None
    ) -> LeaseOutcome:
        """The Python rule re-decided from what a lease statement read; it must agree with what
        the statement appended, else the transaction rolls back."""
        latest = validated_latest(run_key, chunk, view)
        decision = decide_lease(view.cancelled, latest, view.now, owner)
        wants_append = decision.status is LeaseStatus.ACQUIRED and not decision.reuse
        if wants_append != (appended is not None):
            raise self._disagree(run_key, chunk, f"decision {decision}")
        if decision.status is not LeaseStatus.ACQUIRED:
            return LeaseOutcome(
                decision.status, holder=latest, cancel_reason=_reason_of(decision, view)
            )
        if appended is None:
            assert latest is not None and latest.lease_expires_at is not None
            attempt, expires = latest.attempt, latest.lease_expires_at
        else:
            if appended.attempt != decision.attempt or appended.lease_expires_at is None:
                raise self._disagree(run_key, chunk, f"attempt {appended.attempt}")
            attempt, expires = appended.attempt, appended.lease_expires_at
        lease = Lease(run_key, chunk.index, owner, attempt, utc(expires))
        return LeaseOutcome(LeaseStatus.ACQUIRED, lease=lease)

    def lease_and_complete(
        self,
        shape: CampaignShape,
        chunk: Chunk,
        owner: str,
        lease_seconds: float,
        write: Callable[[Any, Lease], ChunkResult],
    ) -> tuple[LeaseOutcome, ChunkResult | None]:
        """Lease, ``write(connection, lease)`` and the completion record in ONE transaction.

        The chunk lock taken by the lease statement is the lease while the transaction lives
        (another attempt waits for it, then sees COMMITTED); the RUNNING record of the attempt
        and its COMMITTED record commit with the data, or nothing does. A crash rolls all of it
        back and frees the lock at once. A failed write is rolled back, then the attempt is
        recorded (RUNNING, then FAILED) in fresh CAS-checked transactions and the write's
        exception propagates (ADR 0021).
        """
        try:
            with self._transaction("lease_and_complete", TxMode.WRITE) as tx:
                outcome = self._lease_in(tx, shape, chunk, owner, lease_seconds)
                if outcome.lease is None:
                    return outcome, None
                lease = outcome.lease
                try:
                    result = write(tx.connection, lease)
                except Exception as exc:
                    raise WriteFailed(exc) from exc
                if not result.committed:
                    raise WriteFailed(None, result)
                self._close_in(tx, lease, chunk, result)
                return outcome, result
        except ChunkLockTimeout:
            return LeaseOutcome(LeaseStatus.BUSY), None
        except WriteFailed as failed:
            return self._record_failed_attempt(shape, chunk, owner, lease_seconds, failed)

    def lease_and_complete_group(
        self,
        shape: CampaignShape,
        first: Chunk,
        owner: str,
        lease_seconds: float,
        write: Callable[[Any, Lease, Chunk], ChunkResult],
        next_chunk: Callable[[], Chunk | None],
    ) -> GroupMove:
        """Several chunks in ONE transaction, each with its own lease statement, write, gate
        and compare-and-set completion (ADR 0022); ``next_chunk`` is asked after each chunk
        and ends the group with None (its budget, or nothing pending).

        Only ``first`` waits for its chunk lock (bounded, then BUSY); a later chunk whose lock
        is taken ends the group before it (``left``): a group never waits holding locks. A
        failure of the first chunk is recorded as ``lease_and_complete`` records it (and its
        exception propagates); a failure after it rolls the whole group back and reports the
        group's leases in ``rolled_back``, recording nothing.
        """
        group = _GroupLeases()
        members: list[tuple[Chunk, LeaseOutcome, ChunkResult | None]] = []
        chunk: Chunk | None = first
        try:
            with self._transaction("lease_and_complete_group", TxMode.WRITE) as tx:
                while chunk is not None and self._lease_next(
                    tx, group, shape, chunk, owner, lease_seconds
                ):
                    lease = group.leased[-1][1]
                    result = _written(functools.partial(write, tx.connection, lease, chunk))
                    self._close_members(tx, group, [(chunk, lease, result)])
                    members.append((chunk, group.outcomes[-1], result))
                    chunk = next_chunk()
                fault_point("group_closed")
            return GroupMove(members + group.refused, group.left)
        except ChunkLockTimeout:  # only the first chunk's lock is waited for
            return GroupMove([(first, LeaseOutcome(LeaseStatus.BUSY), None)])
        except WriteFailed as failed:
            return self._group_failed(shape, first, owner, lease_seconds, group, failed)

    def lease_and_complete_set(
        self,
        shape: CampaignShape,
        chunks: list[Chunk],
        owner: str,
        lease_seconds: float,
        write_set: Callable[[Any, list[tuple[Chunk, Lease]]], list[ChunkResult]],
    ) -> GroupMove:
        """A set-based group (ADR 0022): ``chunks`` (contiguous) in ONE transaction, their
        leases, then ONE ``write_set(connection, leases)`` that writes and gates them all and
        returns each one's result, then their compare-and-set completions. A store whose
        transaction has ``lease_set`` and ``close_set`` (Postgres) leases the group in one round
        trip and completes it in another; the others run each chunk's statements in turn. The
        same rules as :meth:`lease_and_complete_group`: only the first chunk waits for its lock;
        a chunk whose lock is taken ends the leasing before it (``left``); a refused lease ends
        it as the last member; a group of one fails as ``lease_and_complete`` records it; a
        failure of a group of several rolls it back and records nothing. Chunks after the last
        member, ``left`` or the rolled-back ones were not leased: the caller moves them next."""
        group = _GroupLeases()
        try:
            with self._transaction("lease_and_complete_group", TxMode.WRITE) as tx:
                self._lease_set(tx, group, shape, chunks, owner, lease_seconds)
                members: list[tuple[Chunk, LeaseOutcome, ChunkResult | None]] = []
                if group.leased:
                    results = _written(functools.partial(write_set, tx.connection, group.leased))
                    closing = [
                        (chunk, lease, result)
                        for (chunk, lease), result in zip(group.leased, results, strict=True)
                    ]
                    self._close_members(tx, group, closing)
                    members = [
                        (chunk, outcome, result)
                        for (chunk, _, result), outcome in zip(closing, group.outcomes, strict=True)
                    ]
                fault_point("group_closed")
            return GroupMove(members + group.refused, group.left)
        except ChunkLockTimeout:  # only the first chunk's lock is waited for
            return GroupMove([(chunks[0], LeaseOutcome(LeaseStatus.BUSY), None)])
        except WriteFailed as failed:
            return self._group_failed(shape, chunks[0], owner, lease_seconds, group, failed)

    def _lease_set(
        self,
        tx: LedgerTx,
        group: _GroupLeases,
        shape: CampaignShape,
        chunks: list[Chunk],
        owner: str,
        lease_seconds: float,
    ) -> None:
        """A set-based group's leases: with ``tx.lease_set``, one round trip that locks the
        chunks in order (the first with a wait, the others only if free now) and runs their
        lease statements up to the first that appends nothing; each is then re-decided as
        ``_lease_in`` does. A chunk that needed no append (its own lease still held) lets the
        rest go on in the next round trip. Without it, each chunk's lease in turn."""
        lease_set = getattr(tx, "lease_set", None)
        if lease_set is None:
            for chunk in chunks:
                if not self._lease_next(tx, group, shape, chunk, owner, lease_seconds):
                    return
            return
        rest = chunks
        while rest:
            locked, rows = lease_set(shape.run_key, rest, owner, lease_seconds, not group.leased)
            fault_point("lease_locked")
            for chunk, (view, appended) in zip(rest, rows, strict=False):
                decide = functools.partial(
                    self._leased, shape.run_key, chunk, owner, view, appended
                )
                if not self._admit(group, chunk, decide):
                    return
            if len(rows) < locked or locked == len(rest):
                rest = rest[len(rows) :]  # a reused lease stopped the statement: go on
            else:
                group.left = rest[locked]
                return

    def _lease_next(
        self,
        tx: LedgerTx,
        group: _GroupLeases,
        shape: CampaignShape,
        chunk: Chunk,
        owner: str,
        lease_seconds: float,
    ) -> bool:
        """One more chunk's lock and lease statement in a group's transaction; False when the
        group ends here (its lock taken elsewhere: ``left``; or its lease refused)."""
        if group.leased and not self._try_lock(tx, shape.run_key, chunk):
            group.left = chunk
            return False
        lease = functools.partial(self._lease_member, tx, shape, chunk, owner, lease_seconds)
        return self._admit(group, chunk, lease)

    @staticmethod
    def _admit(group: _GroupLeases, chunk: Chunk, lease: Callable[[], LeaseOutcome]) -> bool:
        """Add a chunk's lease to the group; False when refused (it ends the group as its last
        member). A ledger error on a chunk after the first rolls the group back, that chunk
        ``left`` to be moved alone, where its own error is recorded."""
        try:
            outcome = lease()
        except DponeError as exc:
            if not group.leased:
                raise
            group.left = chunk
            raise WriteFailed(exc) from exc
        if outcome.lease is None:
            group.refused = [(chunk, outcome, None)]
            return False
        group.leased.append((chunk, outcome.lease))
        group.outcomes.append(outcome)
        return True

    def _close_members(
        self, tx: LedgerTx, group: _GroupLeases, closing: list[tuple[Chunk, Lease, ChunkResult]]
    ) -> None:
        """The completions of written group members (the ``completion`` timing phase): every
        result must be committed, then each compare-and-set (one round trip with
        ``tx.close_set``). A group of one fails as
        lease_and_complete (rolled back, not recorded); of several, WriteFailed rolls it back."""
        for _, _, result in closing:
            if not result.committed:
                raise WriteFailed(None, result)
        close_set = getattr(tx, "close_set", None)
        try:
            if close_set is None or len(closing) == 1:
                rows = [tx.close_append(lease.run_key, c, lease, r) for c, lease, r in closing]
            else:
                rows = close_set(closing[0][1].run_key, closing)
            for (chunk, lease, _), (view, appended) in zip(closing, rows, strict=True):
                self._closed(lease, chunk, view, appended)
        except DponeError as exc:
            if len(group.leased) == 1:
                raise
            raise WriteFailed(exc) from exc

    def _group_failed(
        self,
        shape: CampaignShape,
        first: Chunk,
        owner: str,
        lease_seconds: float,
        group: _GroupLeases,
        failed: WriteFailed,
    ) -> GroupMove:
        """A group of several rolled back records nothing; a group of one records its failed
        attempt as lease_and_complete does."""
        if len(group.leased) > 1 or group.left is not None:
            return GroupMove([], group.left, group.leased, failed.cause)
        recorded = self._record_failed_attempt(shape, first, owner, lease_seconds, failed)
        return GroupMove([(first, *recorded)])

    @staticmethod
    def _try_lock(tx: LedgerTx, run_key: str, chunk: Chunk) -> bool:
        """Take a group's next chunk lock only if it is free now (False without try-locks)."""
        try_lock = getattr(tx, "try_lock_chunk", None)
        return bool(try_lock is not None and try_lock(run_key, chunk.index))

    def _lease_member(
        self, tx: LedgerTx, shape: CampaignShape, chunk: Chunk, owner: str, lease_seconds: float
    ) -> LeaseOutcome:
        """One chunk's lease statement in a group's transaction (the ``lease`` timing phase)."""
        return self._lease_in(tx, shape, chunk, owner, lease_seconds)

    def _close_in(self, tx: LedgerTx, lease: Lease, chunk: Chunk, result: ChunkResult) -> None:
        """The compare-and-set completion inside ``tx`` (see complete)."""
        view, appended = tx.close_append(lease.run_key, chunk, lease, result)
        self._closed(lease, chunk, view, appended)

    def _closed(
        self, lease: Lease, chunk: Chunk, view: ChunkView, appended: Appended | None
    ) -> None:
        """What a completion statement read and appended, checked: the lease still held (else
        LEASE_LOST and the transaction rolls back), and the record appended."""
        latest = validated_latest(lease.run_key, chunk, view)
        check_owner(lease, latest)  # raises LEASE_LOST: the transaction rolls back
        if appended is None:
            raise self._disagree(lease.run_key, chunk, "owner matches but nothing appended")

    def _record_failed_attempt(
        self,
        shape: CampaignShape,
        chunk: Chunk,
        owner: str,
        lease_seconds: float,
        failed: WriteFailed,
    ) -> tuple[LeaseOutcome, ChunkResult | None]:
        """The rolled-back attempt's RUNNING and FAILED records, so its number and error stay
        in the history; the write's own exception is what the caller sees."""
        try:
            outcome = self.acquire_lease(shape, chunk, owner, lease_seconds)
        except DponeError as ledger_error:
            if failed.cause is None:
                raise
            failed.cause.add_note(f"dpone: the FAILED record was not written: {ledger_error}")
            raise failed.cause from None
        if outcome.lease is None:  # another attempt took the chunk in between
            if failed.cause is not None:
                raise failed.cause
            return outcome, failed.result
        return outcome, self._record_failed_write(outcome.lease, chunk, failed)

    def complete(self, lease: Lease, chunk: Chunk, result: ChunkResult) -> None:
        """Compare-and-set on (owner, attempt) and append COMMITTED or FAILED, in one statement."""
        check_lease_chunk(lease, chunk)
        with self._transaction("complete", TxMode.CHUNK) as tx:
            tx.lock_chunk(lease.run_key, chunk.index)
            view, appended = tx.close_append(lease.run_key, chunk, lease, result)
            fault_point("close_locked")
            latest = validated_latest(lease.run_key, chunk, view)
            check_owner(lease, latest)  # raises LEASE_LOST: the transaction rolls back
            if appended is None:
                raise self._disagree(lease.run_key, chunk, "owner matches but nothing appended")

    def complete_in_transaction(
        self, lease: Lease, chunk: Chunk, write: Callable[[Any], ChunkResult]
    ) -> ChunkResult:
        """CAS, then ``write(connection)`` and the completion record in one transaction.

        A raising write (or one that returns committed=False) is rolled back; the FAILED record is
        then appended in a fresh, CAS-checked transaction and the write's exception propagates.
        """
        check_lease_chunk(lease, chunk)
        try:
            with self._transaction("complete_in_transaction", TxMode.WRITE) as tx:
                view, latest = self._view(tx, lease.run_key, chunk)
                running = check_owner(lease, latest)
                assert view.latest is not None
                try:
                    result = write(tx.connection)
                except Exception as exc:
                    raise WriteFailed(exc) from exc
                if not result.committed:
                    raise WriteFailed(None, result)
                tx.append_transition(
                    lease.run_key,
                    completion_record(lease, chunk, running, view.latest.transition + 1, result),
                )
                return result
        except WriteFailed as failed:
            return self._record_failed_write(lease, chunk, failed)

    def _record_failed_write(self, lease: Lease, chunk: Chunk, failed: WriteFailed) -> ChunkResult:
        if failed.cause is None:
            assert failed.result is not None
            self.complete(lease, chunk, failed.result)
            return failed.result
        code, message = failure_from_exception(failed.cause)
        try:
            self.complete(
                lease, chunk, ChunkResult(committed=False, error_code=code, error_message=message)
            )
        except DponeError as ledger_error:
            failed.cause.add_note(f"dpone: the FAILED record was not written: {ledger_error}")
        raise failed.cause

    def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        """Append a RUNNING record of the same attempt with a later expiry (CAS on owner, attempt)."""
        with self._transaction("renew", TxMode.CHUNK) as tx:
            tx.lock_chunk(lease.run_key, lease.chunk_index)
            view = tx.chunk_view(lease.run_key, lease.chunk_index)
            stored = view.shape if view.campaign_found else None
            running = check_renewal(lease, stored, view.latest)
            assert stored is not None and view.latest is not None
            expires = view.now + dt.timedelta(seconds=lease_seconds)
            record = renewal_record(lease, running, stored, view.latest.transition + 1, expires)
            tx.append_transition(lease.run_key, record)
        return Lease(lease.run_key, lease.chunk_index, lease.owner, lease.attempt, expires)


def rows_as_shape(rows: Iterator[Sequence[Any]] | Sequence[Sequence[Any]]) -> list[ShapeRow]:
    return [ShapeRow(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]


TRANSITIONS: RowCodec[StoredTransition] = RowCodec(
    StoredTransition,
    "seq:int chunk_index:int transition:int state attempt:int idempotency_key chunk_start "
    "chunk_end lease_owner:? lease_expires_at:utc? started_at:utc? rows_moved:int?=rows "
    "checksum:? error_code:? error_message:? recorded_at:utc? source_checksum:?",
    generated="seq recorded_at",
)
#: A transition is inserted with its campaign's run_key first.
INSERT_TRANSITION_COLUMNS = "run_key, " + TRANSITIONS.inserted


def transition_params(run_key: str, record: NewTransition) -> tuple[Any, ...]:
    """Parameters for INSERT_TRANSITION_COLUMNS, in order."""
    return (run_key, *TRANSITIONS.params(record))


CAMPAIGNS: RowCodec[CampaignHead] = RowCodec(
    CampaignHead,
    "run_key workload process plan_hash config_hash chunk_count:int cancelled:bool "
    "cancel_reason:? created_by seq:int created_at:utc?",
    generated="seq created_at",
)


def view_from_row(row: Sequence[Any]) -> ChunkView:
    """Decode the chunk-view row: now, campaign found/cancelled/reason, shape (3), transition (17)."""
    shape = None
    if row[4] is not None:
        shape = ShapeRow(int(row[3]), str(row[4]), str(row[5]), str(row[6]))
    latest = None if row[7] is None else TRANSITIONS.decode(row[7:24])
    return ChunkView(
        now=utc(row[0]),
        campaign_found=row[1] is not None,
        cancelled=bool(row[1]),
        cancel_reason=row[2],
        shape=shape,
        latest=latest,
    )
