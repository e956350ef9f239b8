"""The backfill orchestrator: initialise the campaign under a short lock, then move the selected
chunks one lease at a time, completing each with compare-and-set.

Mapped items run their range sequentially and stop at the first failure (the state machine of
the contract); internal runs spread the whole campaign over ``parallel_workers`` threads, each
with its own store and connector connections, and keep going past a failed chunk.

A full_refresh process (no backfill section) is one unit of work outside the ledger: the whole
source replaces the whole target in one sink transaction (:func:`run_full_refresh`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from dpone import errors
from dpone.credentials.connections import dsn_kind, resolve_dsn
from dpone.errors import DponeError, ErrorRecord
from dpone.ledger.port import (
    CampaignShape,
    ChunkResult,
    ChunkState,
    Lease,
    LeaseOutcome,
    LeaseStatus,
    Ledger,
    LedgerStore,
)
from dpone.lifecycle.collection import collect_from_here
from dpone.lifecycle.faults import fault_point
from dpone.lifecycle.interrupt import STOP
from dpone.observability.exporting import RunObserver
from dpone.observability.progress import NoProgressSink
from dpone.observability.result import ChunkTiming, RunOutcome
from dpone.packing.pack import ProcessPlan, WorkloadPack, config_hash_at
from dpone.packing.verify import Selection
from dpone.plan.chunks import Chunk
from dpone.records import record


def _no_run(*_: object) -> list[Chunk]:
    """No next run to read ahead (a set-based group without a lone worker's feed)."""
    return []


class ProgressSink(Protocol):
    def start(self, total: int, label: str) -> None: ...

    def advance(
        self, committed: int, skipped: int, failed: int, rows: int, chunk: ChunkTiming
    ) -> None: ...

    def finish(self) -> None: ...


@dataclass
class RunSettings:
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    lock_timeout_s: float = 30.0
    progress: ProgressSink = field(default_factory=NoProgressSink)
    owner_prefix: str = ""
    warn: Callable[[str], None] = lambda message: None
    observer: RunObserver = field(default_factory=RunObserver)


def new_owner(prefix: str = "") -> str:
    """A unique attempt token: host, pid and a random part (never reused): 12 hex digits of 48
    random bits, as uuid4's first 12 (no uuid import on a pod's path)."""
    host = os.uname().nodename[:40]
    return f"{prefix}{host}:{os.getpid()}:{os.urandom(6).hex()}"


@record
class RunContext:
    pack: WorkloadPack
    plan: ProcessPlan
    selection: Selection
    settings: RunSettings

    def dsn(self, connection: str) -> str:
        return resolve_dsn(connection, self.settings.environ)

    def open_store(self) -> LedgerStore:
        from dpone.ledger.factory import open_store

        state = self.plan.config.state
        dsn = self.dsn(state.connection) if state.connection else None
        return open_store(state.backend, dsn=dsn, schema=state.schema, path=state.path)

    @functools.cached_property
    def same_transaction(self) -> bool:
        """Ledger and sink share one Postgres connection: data and completion commit together.

        Asked for every chunk; the answer (resolving and registering the DSN) is kept."""
        cfg = self.plan.config
        if cfg.state.backend != "audit_schema" or cfg.state.connection != cfg.sink.connection:
            return False
        return dsn_kind(self.dsn(cfg.sink.connection)) == "postgres"

    def shape(self) -> CampaignShape:
        assert self.plan.run_key is not None and self.plan.backfill_plan_hash is not None
        return CampaignShape(
            run_key=self.plan.run_key,
            workload=self.pack.workload.name,
            process=self.plan.name,
            plan_hash=self.plan.backfill_plan_hash,
            config_hash=self.plan.config_hash,
            chunks=self.plan.chunks,
        )


class LeaseKeeper:
    """Renews a lease while a chunk's data moves outside the ledger's transaction.

    Without it a chunk that runs longer than lease_seconds could be taken over by another
    attempt (correct, since the old owner's completion then fails compare-and-set, but wasted
    work). It renews every third of the lease on its own store, opened on first need: a
    database connection is never shared between threads, and short chunks open nothing.
    """

    def __init__(
        self, open_store: Callable[[], LedgerStore], lease: Lease, lease_seconds: float
    ) -> None:
        self._open_store = open_store
        self.lease = lease
        self.lease_seconds = lease_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpone-lease-keeper", daemon=True)
        self._store: LedgerStore | None = None

    def _run(self) -> None:
        interval = max(self.lease_seconds / 3.0, 0.5)
        while not self._stop.wait(interval):
            try:
                if self._store is None:
                    self._store = self._open_store()
                self.lease = self._store.renew(self.lease, self.lease_seconds)
            except DponeError:
                return  # completion's compare-and-set will report the lost lease

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._store is not None:
            try:
                self._store.close()
            except Exception:
                pass


class ChunkMover:
    """One worker's connections: a store, and the source and sink opened on first need."""

    def __init__(self, ctx: RunContext, store: LedgerStore) -> None:
        self.ctx = ctx
        self.store = store
        assert ctx.plan.config.backfill is not None
        self.lease_seconds = float(ctx.plan.config.backfill.lease_seconds)
        self._source: Any = None
        self._sink: Any = None

    def _connectors(self) -> tuple[Any, Any]:
        if self._sink is None:
            from dpone.connectors.factory import open_sink, open_source

            source_spec, sink_spec = connector_specs(self.ctx.plan)
            cfg = self.ctx.plan.config
            self._source = open_source(source_spec, self.ctx.dsn(cfg.source.connection))
            self._sink = open_sink(
                sink_spec, self.ctx.dsn(cfg.sink.connection), sink_options(self.ctx.plan)
            )
        return self._source, self._sink

    def window(self, chunk: Chunk) -> Any:
        return self.span([chunk])

    def span(self, run: list[Chunk]) -> Any:
        """The window of contiguous chunks: the first one's start to the last one's end."""
        from dpone.connectors.base import ChunkWindow

        spec = self.ctx.plan.config.backfill
        assert spec is not None
        return ChunkWindow(spec.chunk.column, spec.chunk.type, run[0].start, run[-1].end)

    def preflight(self) -> list[str]:
        _, sink = self._connectors()
        spec = self.ctx.plan.config.backfill
        if spec is None or not hasattr(sink, "preflight"):
            return []
        warnings: list[str] = sink.preflight(spec.chunk.column)
        return warnings

    def interrupt(self) -> None:
        """Cancel the data statement this worker has in flight (called from the signal watcher).

        The ledger's connection is cancelled only when the data moves inside its transaction;
        otherwise it runs short ledger statements only, and a cancel landing on one of them
        would fail the release of the lease instead of the data transfer.
        """
        things = [self._source, self._sink]
        if self.ctx.same_transaction:
            things.append(self.store)
        for thing in things:
            interrupt = getattr(thing, "interrupt", None)
            if interrupt is not None:
                interrupt()
        # the read-back gate's source side, when it runs
        getattr(self._sink, "interrupt_read_back", lambda: None)()

    def _release(self, lease: Lease, chunk: Chunk, failed: ChunkResult) -> None:
        """Record a FAILED completion; after a stop request, try once more when the first try
        failed for another reason than a lost lease (a cancel request may have landed on it)."""
        try:
            self.store.complete(lease, chunk, failed)
        except DponeError as exc:
            if not STOP.requested or exc.code == errors.CHUNK_LEASE_LOST:
                raise
            self.store.complete(lease, chunk, failed)

    def move(self, lease: Lease, chunk: Chunk, upcoming: Chunk | None = None) -> ChunkResult:
        """Move one chunk and record its completion (compare-and-set on the lease); the source
        may read ``upcoming`` (the chunk this worker moves next) ahead while this one is written.

        The split placement (the one-database placement is lease_and_move): the sink
        transaction claims the chunk's fence row with the lease's attempt (a stale attempt's
        transaction rolls back), then the completion is recorded in the ledger.
        """
        source, sink = self._connectors()
        window = self.window(chunk)
        source.expect(self.window(upcoming) if upcoming is not None else None)
        with STOP.cancellable(self.interrupt):
            return self._move_fenced(lease, chunk, source, sink, window)

    @functools.cached_property
    def one_commit(self) -> bool:
        """Lease, data, read-back gate and completion commit together (ADR 0021): the ledger
        lives in the sink's Postgres database."""
        return self.ctx.same_transaction and hasattr(self.store, "lease_and_complete")

    def lease_and_move(
        self,
        chunk: Chunk,
        owner: str,
        lease_seconds: float,
        upcoming: Chunk | None,
        leases: list[Lease],
    ) -> tuple[LeaseOutcome, ChunkResult | None]:
        """The one-commit chunk: the lease's RUNNING record, the rows, the gate and the
        COMMITTED record in one transaction on the ledger's connection; ``leases`` gets the
        lease once taken (for the caller's record of a failure)."""
        source, sink = self._connectors()
        window = self.window(chunk)

        def write(connection: Any, lease: Lease) -> ChunkResult:
            leases.append(lease)
            source.expect(self.window(upcoming) if upcoming is not None else None)
            fault_point("chunk_leased")
            try:
                # the ledger rolls the whole transaction back when this raises: no savepoint
                written = sink.write_chunk(source, window, connection=connection, isolated=False)
            except DponeError as exc:
                STOP.settle()  # a stop's last cancel must not land on the rollback or record
                raise interrupted_or(exc, "the chunk's transaction was rolled back") from None
            fault_point("chunk_written")
            return committed(written)

        with STOP.cancellable(self.interrupt):
            store: Any = self.store
            try:
                outcome: tuple[LeaseOutcome, ChunkResult | None] = store.lease_and_complete(
                    self.ctx.shape(), chunk, owner, lease_seconds, write
                )
            except DponeError as exc:
                if STOP.requested and leases and exc.code != errors.CHUNK_LEASE_LOST:
                    self._release_after_stop(leases[-1], chunk)
                raise
            return outcome

    @functools.cached_property
    def coalesce(self) -> Any:
        """The group budget (``backfill.coalesce``, ADR 0022) where consecutive chunks may
        share one transaction (the one-commit placement), else None."""
        bf = self.ctx.plan.config.backfill
        assert bf is not None
        if not (self.one_commit and bf.coalesce.enabled):
            return None
        if not hasattr(self.store, "lease_and_complete_group"):
            return None
        return bf.coalesce

    def lease_and_move_group(
        self,
        first: Chunk,
        owner: str,
        lease_seconds: float,
        feed: _Feed,
        more: Callable[[int, int], bool],
        leases: list[tuple[Chunk, Lease, float]],
    ) -> Any:
        """Coalesced chunks (ADR 0022): from ``first`` on, each chunk's lease statement, rows,
        gate and COMMITTED record in ONE transaction, the next one taken from ``feed`` while
        ``more(rows, chunks moved so far)`` says so; ``leases`` gets (chunk, lease, start) per chunk
        leased. Returns the ledger's GroupMove; a group of one fails as lease_and_move does."""
        source, sink = self._connectors()
        moved = [0]

        def write(connection: Any, lease: Lease, chunk: Chunk) -> ChunkResult:
            leases.append((chunk, lease, time.monotonic()))
            upcoming = feed.upcoming()
            source.expect(self.window(upcoming) if upcoming is not None else None)
            fault_point("chunk_leased")
            try:
                written = sink.write_chunk(
                    source, self.window(chunk), connection=connection, isolated=False
                )
            except DponeError as exc:
                STOP.settle()  # a stop's last cancel must not land on the rollback or record
                raise interrupted_or(exc, "the chunk group's transaction was rolled back") from None
            fault_point("chunk_written")
            moved[0] += written.rows
            return committed(written)

        def next_chunk() -> Chunk | None:
            return feed.next_in_group() if more(moved[0], len(leases)) else None

        with STOP.cancellable(self.interrupt):
            store: Any = self.store
            try:
                return store.lease_and_complete_group(
                    self.ctx.shape(), first, owner, lease_seconds, write, next_chunk
                )
            except DponeError as exc:
                if STOP.requested and leases and exc.code != errors.CHUNK_LEASE_LOST:
                    self._release_after_stop(leases[-1][1], leases[-1][0])
                raise

    @functools.cached_property
    def set_based(self) -> bool:
        """Coalesced groups are moved set-based (ADR 0022): one delete, one copy and one grouped
        checksum a side for a run of contiguous chunks; needs a sink and a source that can
        (a Postgres sink in inner mode replace, a Postgres source)."""
        if self.coalesce is None:
            return False
        source, sink = self._connectors()
        can = getattr(sink, "can_write_group", None)
        return bool(can is not None and can(source) and hasattr(source, "window_checksums"))

    def lease_and_move_set(
        self,
        chunks: list[Chunk],
        owner: str,
        lease_seconds: float,
        leases: list[tuple[Chunk, Lease, float]],
        upcoming: Callable[[int, int], list[Chunk]] = _no_run,
    ) -> Any:
        """A set-based group (ADR 0022): each chunk's lease statement, then ONE write of the
        leased chunks' span with each chunk's gate, then each one's COMMITTED record, in ONE
        transaction; ``leases`` gets (chunk, lease, start) per chunk leased. ``upcoming`` gives
        the run this worker moves next from the chunks and rows this group copied, asked once
        its rows are copied, and the source reads that run's span ahead (while the group is
        read back and committed). Returns the ledger's GroupMove; a group of one is written
        and fails as lease_and_move does."""
        source, sink = self._connectors()

        def write_set(connection: Any, leased: list[tuple[Chunk, Lease]]) -> list[ChunkResult]:
            now = time.monotonic()
            leases.extend((chunk, lease, now) for chunk, lease in leased)

            def next_span(copied: int) -> Any:
                following = upcoming(len(leased), copied)
                return self.span(following) if following else None

            source.expect(next_span)
            for _ in leased:
                fault_point("chunk_leased")
            windows = [self.window(chunk) for chunk, _ in leased]
            try:
                if len(windows) == 1:
                    writes = [
                        sink.write_chunk(source, windows[0], connection=connection, isolated=False)
                    ]
                else:
                    writes = sink.write_group(source, windows, connection)
            except DponeError as exc:
                STOP.settle()  # a stop's last cancel must not land on the rollback or record
                raise interrupted_or(exc, "the chunk group's transaction was rolled back") from None
            for _ in leased:
                fault_point("chunk_written")
            return [committed(written) for written in writes]

        with STOP.cancellable(self.interrupt):
            store: Any = self.store
            try:
                return store.lease_and_complete_set(
                    self.ctx.shape(), chunks, owner, lease_seconds, write_set
                )
            except DponeError as exc:
                if STOP.requested and leases and exc.code != errors.CHUNK_LEASE_LOST:
                    self._release_after_stop(leases[-1][1], leases[-1][0])
                raise

    def release_rolled_back(self, chunk: Chunk, owner: str, lease_seconds: float) -> int | None:
        """Record a stopped group's chunk as released: its attempt's RUNNING and FAILED
        (DPONE_RUN_INTERRUPTED) records, the FAILED one tried again after a stop's cancel.
        Returns the attempt recorded (None when another attempt holds the chunk now)."""
        STOP.settle()
        stopped = STOP.record("the chunk group's transaction was rolled back")
        failed = ChunkResult(False, error_code=stopped.code, error_message=stopped.message[:500])
        outcome = self.store.acquire_lease(self.ctx.shape(), chunk, owner, lease_seconds)
        if outcome.lease is None:
            return None
        self._release(outcome.lease, chunk, failed)
        return outcome.lease.attempt

    def _release_after_stop(self, lease: Lease, chunk: Chunk) -> None:
        """Make sure a chunk stopped in the one-commit placement is released: the FAILED
        record written after the rollback may itself have met a stop's cancel. A
        compare-and-set: refused (and ignored) when that record is there or no RUNNING one is."""
        STOP.settle()
        stopped = STOP.record("the chunk's transaction was rolled back")
        failed = ChunkResult(False, error_code=stopped.code, error_message=stopped.message[:500])
        with contextlib.suppress(DponeError):
            self.store.complete(lease, chunk, failed)

    def _move_fenced(
        self, lease: Lease, chunk: Chunk, source: Any, sink: Any, window: Any
    ) -> ChunkResult:
        from dpone.connectors.base import ChunkFence

        fence = ChunkFence(lease.run_key, chunk.index, lease.attempt)
        try:
            with LeaseKeeper(self.ctx.open_store, lease, self.lease_seconds):
                written = sink.write_chunk(source, window, fence=fence)
        except DponeError as exc:
            STOP.settle()  # a stop's last cancel must not land on the release
            error = interrupted_or(exc, "the chunk's sink transaction was rolled back")
            failed = ChunkResult(False, error_code=error.code, error_message=error.message[:500])
            try:
                self._release(lease, chunk, failed)
            except DponeError as ledger_exc:
                if ledger_exc.code != errors.CHUNK_LEASE_LOST or error is not exc:
                    raise
                if exc.code != errors.CHUNK_LEASE_LOST:  # the write failed; the lease was gone
                    raise DponeError(
                        errors.CHUNK_LEASE_LOST,
                        f"{ledger_exc.message}; this attempt's sink transaction failed and was "
                        f"rolled back ({exc.code})",
                    ) from None
            raise error from None
        fault_point("data_committed")
        result = committed(written)
        try:
            self.store.complete(lease, chunk, result)
        except DponeError as exc:
            if exc.code != errors.CHUNK_LEASE_LOST:
                raise
            raise DponeError(
                errors.CHUNK_LEASE_LOST,
                f"{exc.message}; the sink had committed this attempt's {written.rows} row(s) "
                f"under fence attempt {lease.attempt}, its fence claimed before the newer "
                "attempt's: the newer attempt's fenced transaction replaces them (the next "
                "run's, if that attempt fails)",
            ) from None
        return result

    def close(self) -> None:
        for thing in (self._source, self._sink, self.store):
            close = getattr(thing, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    pass


def committed(written: Any) -> ChunkResult:
    """The completion of a chunk the sink wrote (and the read-back gate let through)."""
    return ChunkResult(
        True, rows=written.rows, checksum=written.checksum, source_checksum=written.source_checksum
    )


def sink_options(plan: ProcessPlan) -> Any:
    """The sink's options for ``plan``: the read-back gate's level and the columns whose
    narrowing the manifest accepts (the gate leaves their content out, not their rows)."""
    from dpone.connectors.base import SinkOptions

    sink = plan.config.sink
    accepted = tuple(getattr(sink, "accept_narrowing", ()))
    return SinkOptions(read_back=cast(Any, sink.read_back), accept_narrowing=accepted)


def connector_specs(plan: ProcessPlan) -> tuple[Any, Any]:
    """Translate the manifest's source and sink into the connector layer's specs."""
    from dpone.connectors.base import InnerMode, SinkSpec, SourceSpec, TableRef

    cfg = plan.config
    src = cfg.source
    source = SourceSpec(
        connection=src.connection,
        table=TableRef(src.table.schema, src.table.name) if src.table else None,
        query=src.query,
        columns=src.columns,
    )
    # A full_refresh process is the sink mode full_refresh over every row (Sink.write_all); a
    # backfill's inner_mode full_refresh (one-chunk windows only) is the same sink mode over
    # that chunk: the whole target is deleted, not only the chunk's range.
    inner = cfg.backfill.inner_mode if cfg.backfill else "full_refresh"
    sink = SinkSpec(
        connection=cfg.sink.connection,
        table=TableRef(cfg.sink.table.schema, cfg.sink.table.name),
        inner_mode=cast(InnerMode, inner),
        keys=cfg.sink.keys,
    )
    return source, sink


def _interrupt(*things: Any) -> None:
    for thing in things:
        thing.interrupt()
        getattr(thing, "interrupt_read_back", lambda: None)()


def interrupted_or(exc: DponeError, what: str) -> DponeError:
    """``exc``, or DPONE_RUN_INTERRUPTED when a stop request caused it (a cancelled statement)."""
    if not STOP.requested or exc.code == errors.CHUNK_LEASE_LOST:
        return exc
    return DponeError(errors.RUN_INTERRUPTED, STOP.record(what).message)


@dataclass
class _Tally:
    """Thread-safe counters shared by the workers of one run."""

    outcome: RunOutcome
    progress: ProgressSink
    observer: RunObserver = field(default_factory=RunObserver)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    #: chunks whose write met a key the target holds (DponeError.key_conflict), with how they
    #: failed: moved again once the run's other chunks have moved, then recorded as they end
    deferred: list[tuple[Chunk, int, DponeError, float]] = field(default_factory=list)
    retrying: bool = False

    def record(self, timing: ChunkTiming) -> None:
        with self.lock:
            o = self.outcome
            o.timings.append(timing)
            if timing.status == "committed":
                o.chunks_committed += 1
                o.rows_written += timing.rows or 0
            elif timing.status == "skipped_resume":
                o.chunks_skipped_resume += 1
            elif timing.status == "not_started":
                o.chunks_not_started += 1
            elif timing.status == "busy":
                o.chunks_busy += 1
            elif timing.status == "cancelled":
                o.chunks_cancelled += 1
            elif timing.status == "interrupted":
                o.chunks_interrupted += 1
            else:
                o.chunks_failed += 1
            self.progress.advance(
                o.chunks_committed, o.chunks_skipped_resume, o.chunks_failed, o.rows_written, timing
            )
            self.observer.chunk_recorded(timing)

    def fail(self, record: ErrorRecord) -> None:
        with self.lock:
            if self.outcome.error is None:
                self.outcome.error = record

    def unskip(self, chunks: Sequence[Chunk]) -> None:
        """Take back the "already committed" of ``chunks``: a restatement handed them back."""
        indexes = {chunk.index for chunk in chunks}
        with self.lock:
            o = self.outcome
            kept = [
                t for t in o.timings if not (t.status == "skipped_resume" and t.index in indexes)
            ]
            o.chunks_skipped_resume -= len(o.timings) - len(kept)
            o.timings = kept


def _run_chunk(
    mover: ChunkMover,
    chunk: Chunk,
    owner: str,
    tally: _Tally,
    lease_s: float,
    upcoming: Chunk | None = None,
) -> bool:
    """Lease, move, complete one chunk (``upcoming``: the worker's next, which the source may
    read ahead); returns False when the run should stop (mapped item)."""
    started = time.monotonic()
    if mover.one_commit:
        return _run_chunk_one_commit(mover, chunk, owner, tally, lease_s, upcoming, started)
    try:
        outcome = mover.store.acquire_lease(mover.ctx.shape(), chunk, owner, lease_s)
    except DponeError as exc:
        return _lease_failed(exc, chunk, tally)
    refused = _lease_refused(outcome, chunk, tally)
    if refused is not None:
        return refused
    lease = outcome.lease
    assert lease is not None
    fault_point("chunk_leased")
    try:
        result = mover.move(lease, chunk, upcoming)
    except DponeError as exc:
        return _chunk_failed(exc, chunk, lease.attempt, started, tally)
    return _chunk_committed(result, chunk, lease.attempt, started, tally)


class _Feed:
    """One worker's next chunks: taken from the run's queue, read one ahead by a lone worker
    (``upcoming``), and those handed back (a group's busy chunk; a rolled-back group's chunks,
    to be moved alone) first. What is held when the worker ends goes back to the queue."""

    def __init__(self, take: Callable[[], Chunk | None], read_ahead: bool) -> None:
        self._take = take
        self.read_ahead = read_ahead
        self.held: list[tuple[Chunk, bool]] = []  # (chunk, move it alone)
        self.planned: int | None = None  # the size of the run read ahead (upcoming_run)

    def next(self) -> tuple[Chunk, bool] | None:
        if self.held:
            return self.held.pop(0)
        chunk = self._take()
        return None if chunk is None else (chunk, False)

    def next_in_group(self) -> Chunk | None:
        """The next chunk for a group: none when the next one is to be moved alone."""
        if self.held:
            return None if self.held[0][1] else self.held.pop(0)[0]
        return self._take()

    def next_run(
        self, first: Chunk, most: int, take_run: Callable[[int], list[Chunk]]
    ) -> list[Chunk]:
        """``first`` and up to ``most - 1`` chunks that follow it without a gap (a set-based
        group's chunks): held ones first (none to be moved alone), else a block taken from the
        queue at once (``take_run``); a chunk that does not follow is handed back."""
        run = [first]
        while len(run) < most and self.held and not self.held[0][1]:
            if not _follows(run[-1], self.held[0][0]):
                return run
            run.append(self.held.pop(0)[0])
        if self.held or len(run) >= most:
            return run
        block = take_run(most - len(run))
        for position, chunk in enumerate(block):
            if not _follows(run[-1], chunk):
                self.hand_back(block[position:], alone=False)
                break
            run.append(chunk)
        return run

    def upcoming_run(self, most: int, take_run: Callable[[int], list[Chunk]]) -> list[Chunk]:
        """The run of chunks this lone worker moves as its next set-based group, for the source
        to read their span ahead while this group is written: taken now as next_run would take
        it, held in order, and its size kept (``planned``) so that the next group is that same
        run unless chunks are handed back before it."""
        taken = self.next() if self.read_ahead else None
        if taken is None:
            return []
        chunk, alone = taken
        if alone:
            self.hand_back([chunk], alone=True)
            return []
        run = self.next_run(chunk, most, take_run)
        self.hand_back(run, alone=False)
        self.planned = len(run)
        return run

    def run_size(self, pace: int) -> int:
        """The next set-based group's size: the planned run's when one was read ahead."""
        planned, self.planned = self.planned, None
        return planned or pace

    def upcoming(self) -> Chunk | None:
        """The chunk this worker moves next, for the source to read ahead (a lone worker)."""
        if not self.read_ahead:
            return None
        if not self.held:
            chunk = self._take()
            if chunk is None:
                return None
            self.held.append((chunk, False))
        return self.held[0][0]

    def hand_back(self, chunks: list[Chunk], alone: bool) -> None:
        self.held[:0] = [(chunk, alone) for chunk in chunks]

    def leftovers(self) -> list[Chunk]:
        return [chunk for chunk, _ in self.held]


def _run_group(
    mover: ChunkMover,
    first: Chunk,
    feed: _Feed,
    owner: str,
    tally: _Tally,
    lease_s: float,
    budget: Any,
) -> bool:
    """Coalesced chunks (ADR 0022): this worker's next chunks in one transaction until the
    group moved ``budget.max_rows`` rows, ran ``budget.max_seconds`` or holds
    ``budget.max_chunks`` chunks (or a stop, a cancel, a busy chunk or the end of the work ends
    it); each chunk is recorded as _run_chunk records it.
    A group of several chunks that fails rolls back, and its chunks are handed back to be moved
    one by one; after a stop request they are released instead."""
    started = time.monotonic()
    leases: list[tuple[Chunk, Lease, float]] = []

    def more(rows: int, chunks: int) -> bool:
        if STOP.requested or tally.stop.is_set() or chunks >= budget.max_chunks:
            return False
        elapsed = time.monotonic() - started
        return bool(rows < budget.max_rows and elapsed < budget.max_seconds)

    try:
        move = mover.lease_and_move_group(first, owner, lease_s, feed, more, leases)
    except DponeError as exc:  # a group of one chunk failed (recorded as in _run_chunk)
        if not leases:
            return _lease_failed(exc, first, tally)
        chunk, lease, since = leases[-1]
        return _chunk_failed(exc, chunk, lease.attempt, since, tally)
    if move.rolled_back:
        return _group_rolled_back(mover, move, leases, owner, tally, lease_s, feed)
    if move.left is not None:  # its lock was held elsewhere: it starts the next group
        feed.hand_back([move.left], alone=False)
    starts = [since for _, _, since in leases] + [time.monotonic()]
    return _record_members(move.members, list(itertools.pairwise(starts)), tally)


def _record_members(
    members: list[tuple[Chunk, LeaseOutcome, ChunkResult | None]],
    spans: list[tuple[float, float]],
    tally: _Tally,
) -> bool:
    """Record a group's members as _run_chunk records a chunk, each leased one over its
    (since, until) span; False when one says the worker should stop."""
    keep_going = True
    for position, (chunk, outcome, result) in enumerate(members):
        refused = _lease_refused(outcome, chunk, tally)
        if refused is not None:
            keep_going = keep_going and refused
            continue
        assert outcome.lease is not None and result is not None
        since, until = spans[position]
        if not result.committed:  # a group of one: recorded FAILED as in _run_chunk
            failed = DponeError(result.error_code or errors.INTERNAL, result.error_message or "")
            keep_going = _chunk_failed(failed, chunk, outcome.lease.attempt, since, tally)
            continue
        _chunk_committed(result, chunk, outcome.lease.attempt, since, tally, until)
    return keep_going


def _follows(before: Chunk, chunk: Chunk) -> bool:
    return chunk.index == before.index + 1 and chunk.start == before.end


@dataclass
class _SetPace:
    """A worker's pace over its set-based groups, to size the next one within the budget."""

    rows_per_chunk: float = 0.0
    seconds_per_chunk: float = 0.0

    @property
    def known(self) -> bool:
        return self.seconds_per_chunk > 0

    def size(self, budget: Any) -> int:
        """The next group's chunks: a worker's first group is one chunk (nothing says yet how
        many rows a chunk holds), then as many as the last group's pace fits in the budget."""
        if not self.known:
            return 1
        most = int(budget.max_chunks)
        if self.rows_per_chunk > 0:
            most = min(most, int(budget.max_rows / self.rows_per_chunk))
        if self.seconds_per_chunk > 0:
            most = min(most, int(budget.max_seconds / self.seconds_per_chunk))
        return max(1, most)

    def learn(self, chunks: int, rows: int, seconds: float) -> None:
        if chunks > 0:
            self.rows_per_chunk = rows / chunks
            self.seconds_per_chunk = seconds / chunks


def _run_set(
    mover: ChunkMover,
    chunks: list[Chunk],
    feed: _Feed,
    owner: str,
    tally: _Tally,
    lease_s: float,
    pace: _SetPace,
    upcoming: Callable[[_SetPace], list[Chunk]] = _no_run,
) -> bool:
    """A set-based group (ADR 0022): contiguous ``chunks`` in one transaction, written and
    gated set-based; recorded, rolled back and handed back as _run_group does. Chunks the
    group did not reach (after a busy or refused one) go back to the feed; ``upcoming`` is
    the next group's run (a lone worker reads it ahead), given this group's pace so far: its
    chunks and rows copied in the time since it started."""
    started = time.monotonic()
    leases: list[tuple[Chunk, Lease, float]] = []

    def following(copied_chunks: int, copied_rows: int) -> list[Chunk]:
        so_far = _SetPace()
        so_far.learn(copied_chunks, copied_rows, time.monotonic() - started)
        return upcoming(so_far)

    try:
        move = mover.lease_and_move_set(chunks, owner, lease_s, leases, following)
    except DponeError as exc:  # a group of one chunk failed (recorded as in _run_chunk)
        if not leases:
            feed.hand_back(chunks[1:], alone=False)
            return _lease_failed(exc, chunks[0], tally)
        feed.hand_back(chunks[len(leases) :], alone=False)
        chunk, lease, since = leases[-1]
        return _chunk_failed(exc, chunk, lease.attempt, since, tally)
    reached = len(move.members) + len(move.rolled_back) + (move.left is not None)
    feed.hand_back(chunks[reached:], alone=False)
    if move.rolled_back:
        return _group_rolled_back(mover, move, leases, owner, tally, lease_s, feed)
    if move.left is not None:  # its lock was held elsewhere: it starts the next group
        feed.hand_back([move.left], alone=False)
    ended = time.monotonic()
    span = (ended - started) / max(1, len(move.members))
    spans = [(started + n * span, started + (n + 1) * span) for n in range(len(move.members))]
    rows = sum(r.rows or 0 for _, _, r in move.members if r is not None and r.committed)
    pace.learn(len(move.members), rows, ended - started)
    return _record_members(move.members, spans, tally)


def _group_rolled_back(
    mover: ChunkMover,
    move: Any,
    leases: list[tuple[Chunk, Lease, float]],
    owner: str,
    tally: _Tally,
    lease_s: float,
    feed: _Feed,
) -> bool:
    """A group of several chunks rolled back (nothing of it was recorded): its chunks are
    moved again one by one, so the good ones commit and the failing one fails with its own
    error and records; after a stop request each is released (RUNNING, FAILED) instead."""
    chunks = [chunk for chunk, _ in move.rolled_back]
    if not STOP.requested:
        feed.hand_back(chunks + ([move.left] if move.left is not None else []), alone=True)
        return True
    if move.left is not None:
        feed.hand_back([move.left], alone=True)  # not started: back to the queue
    since = {chunk.index: start for chunk, _, start in leases}
    stopped = STOP.record("the chunk group's transaction was rolled back")
    for chunk, lease in move.rolled_back:
        try:
            attempt = mover.release_rolled_back(chunk, owner, lease_s)
        except DponeError:
            attempt = None  # not recorded: the chunk holds no RUNNING record either
        error = DponeError(stopped.code, stopped.message)
        _chunk_failed(error, chunk, attempt or lease.attempt, since[chunk.index], tally)
    return False


def _run_chunk_one_commit(
    mover: ChunkMover,
    chunk: Chunk,
    owner: str,
    tally: _Tally,
    lease_s: float,
    upcoming: Chunk | None,
    started: float,
) -> bool:
    """_run_chunk where lease, data and completion are one transaction (ADR 0021)."""
    leases: list[Lease] = []
    try:
        outcome, result = mover.lease_and_move(chunk, owner, lease_s, upcoming, leases)
    except DponeError as exc:
        if not leases:  # the lease statement itself failed: nothing was recorded
            return _lease_failed(exc, chunk, tally)
        return _chunk_failed(exc, chunk, leases[-1].attempt, started, tally)
    refused = _lease_refused(outcome, chunk, tally)
    if refused is not None:
        return refused
    assert outcome.lease is not None and result is not None
    if not result.committed:
        failed = DponeError(result.error_code or errors.INTERNAL, result.error_message or "failed")
        return _chunk_failed(failed, chunk, outcome.lease.attempt, started, tally)
    return _chunk_committed(result, chunk, outcome.lease.attempt, started, tally)


def _lease_failed(exc: DponeError, chunk: Chunk, tally: _Tally) -> bool:
    if STOP.requested:  # the stop cancelled the lease statement: nothing was recorded
        tally.record(ChunkTiming(chunk.index, "not_started"))
        return False
    tally.record(ChunkTiming(chunk.index, "failed", error_code=exc.code))
    tally.fail(exc.records[0])
    return False


def _lease_refused(outcome: LeaseOutcome, chunk: Chunk, tally: _Tally) -> bool | None:
    """What _run_chunk returns for a lease it did not get; None when it got it."""
    if outcome.status is LeaseStatus.CANCELLED:
        tally.outcome.cancelled = True
        tally.record(ChunkTiming(chunk.index, "cancelled", error_code=errors.CAMPAIGN_CANCELLED))
        why = f" (reason: {outcome.cancel_reason})" if outcome.cancel_reason else ""
        tally.fail(
            ErrorRecord(
                errors.CAMPAIGN_CANCELLED,
                f"campaign cancelled{why}: no new chunk started; `dpone ledger cancel --undo` "
                "resumes it",
            )
        )
        tally.stop.set()
        return False
    if outcome.status is LeaseStatus.ALREADY_COMMITTED:
        tally.record(ChunkTiming(chunk.index, "skipped_resume"))
        return True
    if outcome.status is LeaseStatus.BUSY:
        holder = outcome.holder
        if holder is not None and holder.lease_expires_at is not None:
            why = f"is leased by another attempt until {holder.lease_expires_at.isoformat()}"
        else:  # the one-commit placement: the lease is the chunk's lock, held by a transaction
            why = (
                "is being moved by another attempt (an open transaction holds its lock; "
                "`dpone ledger status` names it)"
            )
        tally.record(ChunkTiming(chunk.index, "busy", error_code=errors.CHUNK_BUSY))
        tally.fail(ErrorRecord(errors.CHUNK_BUSY, f"chunk {chunk.index} {why}"))
        return False
    return None


def _chunk_failed(
    exc: DponeError, chunk: Chunk, attempt: int, started: float, tally: _Tally
) -> bool:
    if exc.key_conflict and not tally.retrying and not STOP.requested:
        # Another chunk's rows may hold the key (the source moved a row to an earlier chunk,
        # and the later one, restated too, still holds it): try again after the others.
        with tally.lock:
            tally.deferred.append((chunk, attempt, exc, started))
        return True
    status = {
        errors.CHUNK_LEASE_LOST: "lease_lost",
        errors.CHUNK_BUSY: "busy",
        errors.RUN_INTERRUPTED: "interrupted",
    }.get(exc.code, "failed")
    tally.record(
        ChunkTiming(
            chunk.index,
            status,
            attempt=attempt,
            duration_ms=int((time.monotonic() - started) * 1000),
            error_code=exc.code,
        )
    )
    tally.fail(
        ErrorRecord(exc.code, f"chunk {chunk.index} [{chunk.start}, {chunk.end}): {exc.message}")
    )
    return False


def _chunk_committed(
    result: ChunkResult,
    chunk: Chunk,
    attempt: int,
    started: float,
    tally: _Tally,
    ended: float | None = None,
) -> bool:
    """Record a committed chunk; a coalesced one's time runs from its lease to the next
    chunk's lease (the group's last: to the group's commit), so a group's chunks add up."""
    until = time.monotonic() if ended is None else ended
    tally.record(
        ChunkTiming(
            chunk.index,
            "committed",
            attempt=attempt,
            rows=result.rows,
            checksum=result.checksum,
            duration_ms=int((until - started) * 1000),
            source_checksum=result.source_checksum,
        )
    )
    return True


def _preflight(ctx: RunContext, mover: ChunkMover, outcome: RunOutcome) -> None:
    """The tables and columns a run needs, before any lease (DPONE_PREFLIGHT_FAILED)."""
    # imported here: a run with nothing to do (a cleared task, a retry) needs no connector code
    # (about 9 ms of a no-op's start-up)
    from dpone.run.preflight import require_tables

    try:
        require_tables(ctx.plan, *connector_specs(ctx.plan), ctx.dsn)
        with STOP.cancellable(mover.interrupt):  # a stop does not wait for a blocked query
            warnings = mover.preflight()
        for warning in warnings:
            ctx.settings.warn(warning)
    except DponeError:
        _refused_before_any_lease(outcome)
        raise


def _no_interrupt() -> None:
    """A store that cannot cancel its wait (it ends at its own timeout)."""


def _refused_before_any_lease(outcome: RunOutcome) -> None:
    """A run refused before data moved reports every count 0 (dpone.run-result.v1), not the
    chunks it had selected with none of them accounted for."""
    outcome.chunks_selected = outcome.chunks_skipped_resume = 0
    outcome.timings.clear()


def _scope(selected: Sequence[Chunk], shape: CampaignShape) -> tuple[int, int] | None:
    """A mapped item's consecutive chunks as (first, last): the ledger loads only their
    records; None when the run selects the whole campaign (or chunks apart)."""
    if not selected or len(selected) == shape.chunk_count:
        return None
    first, last = selected[0].index, selected[-1].index
    if [chunk.index for chunk in selected] != list(range(first, last + 1)):
        return None
    return first, last


def _open_campaign(ctx: RunContext, store: LedgerStore, owner: str) -> Ledger:
    """Initialize the campaign; a stored campaign of another plan is extended when this plan
    grows it on the same grid (ADR 0020), else the refusal says why and the way out."""
    shape, timeout = ctx.shape(), ctx.settings.lock_timeout_s
    interrupt: Callable[[], None] = getattr(store, "interrupt", _no_interrupt)
    with STOP.cancellable(interrupt):  # a stop does not wait out the campaign lock
        try:
            return store.initialize(shape, owner, timeout, _scope(ctx.selection.chunks, shape))
        except DponeError as exc:
            if exc.code != errors.LEDGER_SHAPE_MISMATCH:
                raise
        config = ctx.plan.config
        ledger = store.extend(shape, functools.partial(config_hash_at, config), owner, timeout)
    ctx.settings.warn(
        f"campaign {shape.run_key} ({ctx.plan.name}) extended to {shape.chunk_count} chunks; "
        "committed chunks stay committed (see `dpone ledger status`)"
    )
    return ledger


def run_backfill(ctx: RunContext, outcome: RunOutcome) -> RunOutcome:
    """Initialise (short campaign lock), then execute the selection. Fills ``outcome``."""
    started = time.monotonic()
    settings = ctx.settings
    plan = ctx.plan
    bf = plan.config.backfill
    assert bf is not None
    owner = new_owner(settings.owner_prefix)
    mapped = ctx.selection.item is not None
    if mapped and bf.inner_mode == "append" and not ctx.same_transaction:
        # check passes when ledger and sink share a connection *name*; only on Postgres do data
        # and completion really commit together, so refuse here before anything is opened.
        raise DponeError(
            errors.MAPPED_APPEND_UNSAFE,
            f"process {plan.name!r}: mapped append needs the ledger and the sink in one Postgres "
            f"transaction; this sink's DSN is not Postgres (use replace or merge)",
        )
    store = ctx.open_store()
    if mapped and not store.capabilities.mapped_ready:
        store.close()
        raise DponeError(
            errors.MAPPING_STATE_UNSUPPORTED,
            f"state store {store.name!r} lacks distributed lock / chunk lease / compare-and-set "
            f"completion; mapped execution refuses it",
        )
    movers: list[ChunkMover] = [ChunkMover(ctx, store)]
    try:
        # An internal run whose campaign does not exist yet checks the tables first: a refusal
        # then leaves no campaign behind, so the corrected configuration (another column list,
        # another query) starts it instead of meeting a shape mismatch. Otherwise only a run
        # with chunks to move checks them (below): a mapped item's no-op needs no connector.
        checked = False
        if not mapped and plan.run_key not in store.list_campaigns():
            _preflight(ctx, movers[0], outcome)
            checked = True
        ledger = _open_campaign(ctx, store, owner)
    except BaseException:
        movers[0].close()  # its source and sink (a preflight opened them) and the store
        raise
    outcome.chunks_selected = len(ctx.selection.chunks)
    tally = _Tally(outcome, settings.progress, settings.observer)
    label = f"{ctx.pack.workload.name}/{plan.name}"
    pending = [c for c in ctx.selection.chunks if not ledger.state_of(c.index) == "committed"]
    # start() before the first record(): a progress sink must know its total and label first.
    settings.progress.start(len(ctx.selection.chunks), label)
    for chunk in ctx.selection.chunks:
        if ledger.state_of(chunk.index) == "committed":
            tally.record(ChunkTiming(chunk.index, "skipped_resume"))
    workers = 1 if mapped else max(1, min(bf.parallel_workers, len(pending) or 1))
    try:
        if pending and not checked:
            _preflight(ctx, movers[0], outcome)
        for _ in range(workers - 1):
            movers.append(ChunkMover(ctx, ctx.open_store()))
        work: queue.Queue[Chunk] = queue.Queue()
        for chunk in pending:
            work.put(chunk)

        read_ahead = workers == 1

        taking = threading.Lock()  # a block taken at once is a run of consecutive chunks

        def take() -> Chunk | None:
            with taking:
                try:
                    return work.get_nowait()
                except queue.Empty:
                    return None

        def take_run(most: int) -> list[Chunk]:
            block: list[Chunk] = []
            with taking:
                # the rest shared out between the workers: none waits while another holds it all
                most = min(most, max(1, -(-work.qsize() // workers)))
                while len(block) < most:
                    try:
                        block.append(work.get_nowait())
                    except queue.Empty:
                        break
            return block

        def worker(mover: ChunkMover) -> None:
            # A lone worker (internal or a mapped item) takes its next chunk one ahead, so that
            # its source reads it while this one is written. Not with several workers: their
            # reads already overlap each other's writes (docs/benchmarks.md). A chunk taken and
            # not moved goes back to the queue. In the one-commit placement a worker moves its
            # consecutive chunks in coalesced groups (ADR 0022); a rolled-back group's chunks
            # come back from the feed to be moved alone.
            feed = _Feed(take, read_ahead)
            lease_s = float(bf.lease_seconds)
            budget = mover.coalesce
            pace = _SetPace()

            def run_ahead(so_far: _SetPace) -> list[Chunk]:
                # the next set-based group, sized by the pace known now; after a worker's first
                # group (one chunk: nothing said before it how many rows a chunk holds), by the
                # rows that group copied and the time its copy took
                if budget is None:
                    return []
                return feed.upcoming_run((pace if pace.known else so_far).size(budget), take_run)

            try:
                while not tally.stop.is_set() and not STOP.requested:
                    taken = feed.next()
                    if taken is None:
                        return
                    chunk, alone = taken
                    if budget is not None and not alone and mover.set_based:
                        run = feed.next_run(chunk, feed.run_size(pace.size(budget)), take_run)
                        keep_going = _run_set(
                            mover, run, feed, owner, tally, lease_s, pace, run_ahead
                        )
                    elif budget is not None and not alone:
                        keep_going = _run_group(mover, chunk, feed, owner, tally, lease_s, budget)
                    else:
                        upcoming = feed.upcoming()
                        keep_going = _run_chunk(mover, chunk, owner, tally, lease_s, upcoming)
                    if not keep_going and (mapped or tally.outcome.cancelled):
                        tally.stop.set()
                        return
            finally:
                for chunk in feed.leftovers():
                    work.put(chunk)

        def move_queued() -> None:
            if workers == 1:
                worker(movers[0])
                return
            threads = [threading.Thread(target=worker, args=(m,), daemon=True) for m in movers]
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():  # a timed join keeps the main thread responsive
                    thread.join(0.5)

        collect_from_here()  # start-up is over: its objects stay out of later collections
        move_queued()
        deferred, tally.deferred[:] = sorted(tally.deferred, key=lambda d: d[0].index), []
        tally.retrying = True
        if deferred and not (STOP.requested or tally.stop.is_set()):
            for chunk, *_ in deferred:
                work.put(chunk)
            move_queued()
        else:  # a stop came first: each ends as its first attempt did
            for chunk, attempt, exc, since in deferred:
                _chunk_failed(exc, chunk, attempt, since, tally)
        moving = {chunk.index for chunk in pending}
        skipped = [chunk for chunk in ctx.selection.chunks if chunk.index not in moving]
        for last_pass in (False, False, True):
            restated = _restated_meanwhile(ctx, store, owner, skipped, tally) if pending else []
            if not restated:
                break
            tally.unskip(restated)
            skipped = [chunk for chunk in skipped if chunk not in restated]
            for chunk in restated:
                if last_pass:  # restated again and again while this run moved them
                    tally.record(ChunkTiming(chunk.index, "not_started"))
                else:
                    work.put(chunk)
            if not last_pass:
                move_queued()
        left: list[Chunk] = []
        while (rest := take()) is not None:
            left.append(rest)
        for chunk in sorted(left, key=lambda c: c.index):
            tally.record(ChunkTiming(chunk.index, "not_started"))
        # A run that found nothing to do (a cleared task, a retry) reports the campaign as it
        # loaded it: whoever commits a campaign's last chunk reloads after its own commit and
        # sees it complete, so this run owes no second read. A run that moved chunks reloads the
        # whole campaign only once every chunk is committed: until then the count of committed
        # chunks says it is not complete in one short read.
        final = _reload_if_complete(store, ctx.shape()) if pending else ledger
        outcome.campaign_complete = bool(final and final.complete)
        if final is not None and final.complete:
            _write_verification(store, final, outcome)
    finally:
        settings.progress.finish()
        for mover in movers:
            mover.close()
    if STOP.requested and (outcome.error is None or outcome.chunks_interrupted):
        outcome.error = STOP.record(
            f"{outcome.chunks_interrupted} chunk(s) rolled back and released, "
            f"{outcome.chunks_not_started} not started"
        )
    if outcome.error is None and outcome.chunks_failed:
        outcome.error = ErrorRecord(errors.CHUNK_FAILED, f"{outcome.chunks_failed} chunk(s) failed")
    outcome.duration_ms = int((time.monotonic() - started) * 1000)
    return outcome


def run_full_refresh(ctx: RunContext, outcome: RunOutcome) -> RunOutcome:
    """A full_refresh process: the whole target replaced by the whole source in ONE transaction.

    Ledger semantics: none. A full refresh has nothing to resume (a half-done one is rolled back,
    and every run must refresh again, so a "committed" record would only make the next run skip a
    refresh it owes), so no state store is opened and ``state`` is not read. The result reports
    it as one unit (``chunks_selected`` 1, ``run_key`` and ``campaign_complete`` null); the sink's
    table lock makes a concurrent refresh of the same target wait for this one. Opening the
    connectors and the preflight raise (as they do for a backfill); a failed write is recorded in
    ``outcome`` with the target unchanged.
    """
    from dpone.connectors.factory import open_sink, open_source

    started = time.monotonic()
    settings = ctx.settings
    plan = ctx.plan
    cfg = plan.config
    assert cfg.backfill is None
    outcome.chunks_selected = 1
    tally = _Tally(outcome, settings.progress, settings.observer)
    source_spec, sink_spec = connector_specs(plan)
    source: Any = None
    sink: Any = None
    settings.progress.start(1, f"{ctx.pack.workload.name}/{plan.name}")
    try:
        source = open_source(source_spec, ctx.dsn(cfg.source.connection))
        sink = open_sink(sink_spec, ctx.dsn(cfg.sink.connection), sink_options(plan))
        from dpone.run.preflight import require_tables

        # refuse a narrowing before I/O
        require_tables(plan, source_spec, sink_spec, ctx.dsn, types_only=True)
        for warning in sink.preflight():
            settings.warn(warning)
        collect_from_here()
        moving = time.monotonic()
        try:
            with STOP.cancellable(lambda: _interrupt(source, sink)):
                written = sink.write_all(source)
        except DponeError as exc:
            exc = interrupted_or(exc, "the refresh was rolled back, the target is unchanged")
            elapsed = int((time.monotonic() - moving) * 1000)
            status = "interrupted" if exc.code == errors.RUN_INTERRUPTED else "failed"
            tally.record(ChunkTiming(1, status, 1, duration_ms=elapsed, error_code=exc.code))
            tally.fail(exc.records[0])
        else:
            elapsed = int((time.monotonic() - moving) * 1000)
            outcome.method = written.method
            tally.record(
                ChunkTiming(
                    1,
                    "committed",
                    1,
                    written.rows,
                    written.checksum,
                    elapsed,
                    source_checksum=written.source_checksum,
                )
            )
    finally:
        settings.progress.finish()
        for thing in (source, sink):
            if thing is not None:
                try:
                    thing.close()
                except Exception:
                    pass
    outcome.duration_ms = int((time.monotonic() - started) * 1000)
    return outcome


def _restated_meanwhile(
    ctx: RunContext, store: LedgerStore, owner: str, skipped: Sequence[Chunk], tally: _Tally
) -> list[Chunk]:
    """The chunks this run found committed at its start and a `dpone ledger restate` handed
    back while it moved the others: the run moves them too, or "passed" would claim chunks
    that are pending. Read only when the run ended well, skipped chunks and the campaign is
    not complete (a complete campaign has nothing restated): a count, then the run's chunks."""
    o = tally.outcome
    if not skipped or tally.stop.is_set() or STOP.requested:
        return []
    if o.error is not None or o.chunks_failed or o.chunks_busy or o.cancelled:
        return []
    shape = ctx.shape()
    if store.committed_count(shape.run_key) >= shape.chunk_count:
        return []
    scope = _scope(ctx.selection.chunks, shape)
    fresh = store.initialize(shape, owner, ctx.settings.lock_timeout_s, scope)
    return [chunk for chunk in skipped if fresh.state_of(chunk.index) != ChunkState.COMMITTED]


def _reload_if_complete(store: LedgerStore, shape: CampaignShape) -> Ledger | None:
    """The campaign, checked, when all its chunks are committed, else None (not complete);
    with no chunk's records where the store checks it where it lives (the verification export
    loads them)."""
    if store.committed_count(shape.run_key) < shape.chunk_count:
        return None
    return store.load_checked(shape)


def _write_verification(store: LedgerStore, ledger: Ledger, outcome: RunOutcome) -> None:
    """The campaign verification export, written atomically by whoever sees completion (from
    every chunk's record: a ledger loaded for a mapped item's chunks is loaded whole first).
    A full or read-only evidence folder does not undo the committed data: the outcome ends
    DPONE_RESULT_WRITE_FAILED, and the run result still gets written and says so."""
    from dpone.observability.result import verification_document, write_json_atomic

    target = os.environ.get("DPONE_EVIDENCE_DIR")
    if not target:
        return
    if ledger.scope is not None:
        whole = store.load(ledger.shape.run_key)
        if whole is None or not whole.complete:
            return
        ledger = whole
    path = Path(target) / ledger.shape.run_key / "verification.json"
    try:
        write_json_atomic(path, verification_document(ledger))
    except OSError as exc:
        if outcome.error is None:
            outcome.error = ErrorRecord(
                errors.RESULT_WRITE_FAILED,
                f"the campaign is complete ({ledger.shape.chunk_count} chunk(s) committed; the "
                f"ledger and the target have them), but its verification export {str(path)!r} "
                f"could not be written ({type(exc).__name__}: {exc.strerror or 'error'})",
            )
