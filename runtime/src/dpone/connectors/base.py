"""The connector contract: specs, the Source/Sink ports, identifier rules and the row checksum.

Everything here is database-neutral and imports only the standard library, so the orchestrator and
the tests can speak about sources and sinks without a driver installed. The checksum is defined once
(``canonical_text`` + ``RowChecksum``) and every dialect reproduces it exactly, in SQL where the
database can (Postgres) and in Python where it cannot (SQLite, MSSQL), so a source and a sink of
different kinds, or an internal and a mapped run, can be compared.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import struct
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Literal, Self

from dpone import errors
from dpone.connectors.column_types import ColumnType
from dpone.errors import DponeError
from dpone.records import record

#: The contract :mod:`dpone.connectors` re-exports: what callers build specs, sources and sinks with.
__all__ = [
    "CHAINED_SCHEME",
    "CHECKSUM_SCHEME",
    "ChunkFence",
    "ChunkWindow",
    "ChunkWrite",
    "RowChecksum",
    "Sink",
    "SinkOptions",
    "SinkSpec",
    "Source",
    "SourceSpec",
    "TableRef",
]

Bound = str | int
InnerMode = Literal["replace", "merge", "append", "full_refresh"]
INNER_MODES: tuple[str, ...] = ("replace", "merge", "append", "full_refresh")
CHUNK_TYPES: tuple[str, ...] = ("date", "timestamp", "integer")
ReadBack = Literal["checksum", "count", "off"]
#: The read-back gate's levels (manifest ``sink.read_back``), strongest first.
READ_BACK_LEVELS: tuple[str, ...] = ("checksum", "count", "off")

#: Name and version of the checksum scheme; part of every checksum string.
CHECKSUM_SCHEME = "rowsum-pghash64-v1"
#: The scheme two Postgres sides compare in (ADR 0027): each row's fields chained, not joined.
CHAINED_SCHEME = "rowsum-pgchain64-v1"
_MASK64 = (1 << 64) - 1
_MASK32 = 0xFFFFFFFF
_TIMESTAMP_BOUND = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})Z$")


# --- specs ----------------------------------------------------------------------------------------
@record
class TableRef:
    """A table by schema (None: the connection's default) and name; never pre-quoted."""

    schema: str | None
    name: str

    def display(self) -> str:
        """schema.name for messages (identifiers only, never data)."""
        return self.name if self.schema is None else f"{self.schema}.{self.name}"


@record
class SourceSpec:
    """Where a chunk's rows come from: a table or a trusted SELECT (exactly one), optional columns.

    ``connection`` is the connection *name* (for messages); the DSN is passed separately and never
    stored in a spec. ``role`` is ``target`` when the sink's table is read back through this
    interface (the preflight, `dpone verify`): its messages then name the target, and its read
    failures are DPONE_SINK_FAILED.
    """

    connection: str
    table: TableRef | None = None
    query: str | None = None
    columns: tuple[str, ...] | None = None
    role: Literal["source", "target"] = "source"

    def __post_init__(self) -> None:
        if (self.table is None) == (self.query is None):
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"{self.role} {self.connection!r} needs exactly one of table or query",
            )
        if self.query is not None and not strip_query(self.query):
            raise DponeError(
                errors.CONNECTOR_INVALID, f"{self.role} {self.connection!r}: empty query"
            )
        if self.columns is not None:
            if not self.columns:
                raise DponeError(
                    errors.CONNECTOR_INVALID, f"{self.role} {self.connection!r}: empty column list"
                )
            check_unique(self.columns, f"{self.role} {self.connection!r} columns")

    def display(self) -> str:
        what = f"table {self.table.display()!r}" if self.table else "query"
        return f"{self.role} {self.connection!r} {what}"

    @property
    def failure_code(self) -> str:
        """The code of a failed read: the source's, or the sink's when the target is read."""
        return errors.SOURCE_FAILED if self.role == "source" else errors.SINK_FAILED


@record
class SinkSpec:
    """Where rows are written and how: replace the chunk's range, merge on keys, append, or
    full_refresh (delete every row of the target, then insert what was read)."""

    connection: str
    table: TableRef
    inner_mode: InnerMode
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.inner_mode not in INNER_MODES:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"sink {self.connection!r}: inner_mode must be one of {', '.join(INNER_MODES)}, "
                f"got {self.inner_mode!r}",
            )
        if self.inner_mode == "merge" and not self.keys:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"sink {self.connection!r}: inner_mode merge needs at least one key column",
            )
        check_unique(self.keys, f"sink {self.connection!r} keys")

    def display(self) -> str:
        return f"sink {self.connection!r} table {self.table.display()!r}"


@record
class ChunkWindow:
    """One chunk: the half-open range [lower, upper) on ``column`` of type date|timestamp|integer.

    Date bounds are ``YYYY-MM-DD`` strings, timestamp bounds ``YYYY-MM-DDTHH:MM:SSZ`` (UTC), integer
    bounds ints. Bounds are only ever bound as parameters, so any string is treated as data.
    """

    column: str
    type: str
    lower: Bound
    upper: Bound

    def __post_init__(self) -> None:
        if self.type not in CHUNK_TYPES:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"chunk type must be one of {', '.join(CHUNK_TYPES)}, got {self.type!r}",
            )
        want: type = int if self.type == "integer" else str
        for bound in (self.lower, self.upper):
            if isinstance(bound, bool) or not isinstance(bound, want):
                raise DponeError(
                    errors.CONNECTOR_INVALID,
                    f"chunk bound {bound!r} of a {self.type} chunk must be a {want.__name__}",
                )
        if not self.lower < self.upper:  # type: ignore[operator]
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"chunk lower bound {self.lower!r} is not below upper bound {self.upper!r}",
            )

    def display(self) -> str:
        return f"{self.column} [{self.lower}, {self.upper})"


#: The rows a read or write covers: a chunk's window, or None for every row (a full refresh).
Scope = ChunkWindow | None
#: What a worker reads next (Source.expect): a window, none, or a function that names it from
#: the rows the current read copied, asked once that read has ended.
Expected = Scope | Callable[[int], Scope]


def scope_display(window: Scope) -> str:
    """What a read or write covers, for messages: a chunk's range, or every row (no window)."""
    return "all rows" if window is None else f"chunk {window.display()}"


@record
class ChunkWrite:
    """What one write (a chunk, or every row) wrote: its row count, its read-back checksum (None
    if disabled), the path used and, when the read-back gate compared content, the source's
    checksum of the same rows."""

    rows: int
    checksum: str | None
    method: str
    source_checksum: str | None = None


FENCE_TABLE = "dpone_chunk_fence"
"""The fence table a sink keeps beside its target (same schema / database); created by dpone."""
_FENCE_CAMPAIGN = re.compile(r"^[A-Za-z0-9:_.\-]{1,120}$")


@record
class ChunkFence:
    """The fencing token of one chunk attempt, checked inside the sink's own data transaction.

    A completion check after the data commit is not a fence: a stalled attempt could commit its
    rows after a newer attempt took the chunk. So the sink transaction itself claims the chunk's
    fence row (``dpone_chunk_fence``) with the ledger's attempt number before it writes: the claim
    only ever raises the stored attempt, its row lock is the per-chunk lock in the sink database
    (held to commit), and a claim that finds a newer attempt rolls the transaction back.
    """

    campaign: str  # the ledger's run_key: keys the fence row, so campaigns never collide
    chunk_index: int
    attempt: int

    def __post_init__(self) -> None:
        if not _FENCE_CAMPAIGN.match(self.campaign):
            raise DponeError(
                errors.CONNECTOR_INVALID, f"fence campaign {self.campaign[:40]!r} is not a key"
            )
        if self.chunk_index < 1 or self.attempt < 1:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"fence of chunk {self.chunk_index} attempt {self.attempt}: both must be >= 1",
            )

    def refuse_repeated_append(self, shown: str, inner_mode: str, claimed_before: bool) -> None:
        """Refuse an append when an earlier attempt of this chunk committed its rows in the sink
        (its fence row was there before this claim) but the ledger never recorded the
        completion: replace and merge rewrite the chunk, an append would add its rows twice."""
        if not claimed_before or inner_mode != "append":
            return
        raise DponeError(
            errors.APPEND_ALREADY_WRITTEN,
            f"{shown}: chunk {self.chunk_index} attempt {self.attempt}: an earlier attempt "
            "already appended this chunk's rows and committed (the sink's fence row shows it); "
            "the ledger never recorded that completion, so appending again would duplicate "
            "the rows; this attempt wrote nothing",
        )

    def superseded(self, shown: str, stored_attempt: int) -> DponeError:
        """The refusal when the sink already saw a newer attempt of this chunk."""
        return DponeError(
            errors.CHUNK_LEASE_LOST,
            f"{shown}: chunk {self.chunk_index} attempt {self.attempt} was superseded by attempt "
            f"{stored_attempt} in the sink's fence; this attempt's writes were rolled back",
        )


@record
class SinkOptions:
    """Tuning knobs; the defaults are what the orchestrator uses.

    ``read_back`` is the gate (see :class:`ReadBackGate`): ``checksum`` compares the sink's
    read-back with the source's checksum of the chunk, ``count`` only the row counts, ``off``
    nothing. ``checksum=False`` also skips the read-back pass itself (only with ``read_back``
    off; measured separately in bench/data_bench.py).
    """

    checksum: bool = True
    batch_rows: int = 10_000
    copy_block_bytes: int = 4 << 20
    read_back: ReadBack = "checksum"
    #: columns whose narrowing the manifest accepts (``sink.accept_narrowing``): left out of the
    #: read-back's content hash on both sides; the row count of the range is still compared
    accept_narrowing: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.batch_rows < 1 or self.copy_block_bytes < 1:
            raise DponeError(
                errors.CONNECTOR_INVALID, "batch_rows and copy_block_bytes must be positive"
            )
        if self.read_back not in READ_BACK_LEVELS:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"read_back must be one of {', '.join(READ_BACK_LEVELS)}, got {self.read_back!r}",
            )
        if self.read_back != "off" and not self.checksum:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"read_back {self.read_back!r} compares the sink's read-back: "
                "it needs checksum=True",
            )


# --- ports ----------------------------------------------------------------------------------------
Row = tuple[object, ...]


class Closeable(ABC):
    """A source or sink as a context manager: leaving the ``with`` block closes its connections."""

    @abstractmethod
    def close(self) -> None:
        """Close owned connections (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Source(Closeable):
    """Reads the rows of one chunk. Not thread-safe: open one per worker."""

    kind: str = ""

    def __init__(self, spec: SourceSpec, dsn: str) -> None:
        self.spec = spec
        self._dsn = dsn

    def same_dsn(self, dsn: str) -> bool:
        """True when ``dsn`` names exactly this source's database, so SQL can stay in-server."""
        return self._dsn.strip() == dsn.strip()

    @abstractmethod
    def columns(self) -> tuple[str, ...]:
        """The moved column names (``spec.columns`` or the described table/query columns)."""

    @abstractmethod
    def rows(self, window: Scope, batch_rows: int) -> Generator[list[Row], None, None]:
        """The chunk's rows (every row when ``window`` is None) in batches; raises
        DponeError(SOURCE_FAILED | CONNECTION_FAILED)."""

    @abstractmethod
    def checksum(self, window: Scope) -> str:
        """The checksum of the chunk's rows (every row when ``window`` is None) as the source
        holds them."""

    def agree_checksum(self, other: Source | None) -> None:
        """Agree with ``other``, the side this one is compared with checksum by checksum (None:
        a side of another kind), on the row hash both compute: two Postgres sides chain each
        row's fields (ADR 0027). Default: nothing changes, the joined canonical text every
        dialect computes alike."""

    @staticmethod
    def agree_both(one: Source, other: Source) -> None:
        """``one`` and ``other``, compared checksum by checksum, each agree with the other."""
        one.agree_checksum(other)
        other.agree_checksum(one)

    def expect(self, window: Expected) -> None:  # optional hint
        """The window this worker reads next (None: none; a function: named from the rows the
        current read copied, once it has ended): a source may read it ahead while the current
        chunk is written. A hint only: the next read may ask for another window."""

    @classmethod
    def table_checksum(
        cls,
        dsn: str,
        table: TableRef,
        window: Scope,
        columns: Sequence[str] | None = None,
    ) -> str:
        """The checksum of ``table``'s rows in ``window`` (every row without one) on ``dsn``,
        read by this source type, in the portable canonical-text form: for comparing a source
        with its target in any two dialects."""
        spec = SourceSpec("checksum", table=table, columns=tuple(columns) if columns else None)
        with cls(spec, dsn) as source:
            source.agree_checksum(None)
            return source.checksum(window)

    def sibling(self, columns: tuple[str, ...] | None = None) -> Source:
        """A new source over the same spec and DSN (``columns``: only those) with its own
        connections (a Source is not thread-safe): the read-back gate checksums the chunk on it
        while the sink writes."""
        return type(self)(self._spec_of(columns), self._dsn)

    def _spec_of(self, columns: tuple[str, ...] | None) -> SourceSpec:
        return self.spec if columns is None else replace(self.spec, columns=columns)

    def column_types(self) -> dict[str, ColumnType | None]:
        """Each moved column's type as the database's catalog describes it, for the type
        preflight (dpone.run.preflight); family ``any`` for a column whose values carry their
        own kind (a SQLite query's result, an untyped or BLOB SQLite column); None for one the
        catalog gives no type to compare. Empty when the dialect cannot describe types."""
        return {}

    def read_only(self) -> Self:
        """Open this source's connections so that the database refuses writes, where it can
        (Postgres: read-only transactions; SQLite: the file opened read-only). Call it before
        the first read; the default (MSSQL, which has no read-only session) changes nothing."""
        return self

    def interrupt(self) -> None:  # optional: a dialect that cannot cancel ends later
        """Abort the read in flight from another thread (see Sink.cancel)."""


class Sink(Closeable):
    """Writes one chunk (or the whole source) per call, in one transaction, with the spec's inner
    mode."""

    kind: str = ""

    def __init__(self, spec: SinkSpec, dsn: str, options: SinkOptions) -> None:
        self.spec = spec
        self.options = options
        self._dsn = dsn
        self._twin: tuple[Source, Source] | None = None  # (source, its sibling for the gate)
        self._gate: ReadBackGate | None = None  # the gate of the write in flight

    def write_chunk(
        self,
        source: Source,
        window: ChunkWindow,
        connection: object | None = None,
        fence: ChunkFence | None = None,
        *,
        isolated: bool = True,
    ) -> ChunkWrite:
        """Move exactly the rows of ``window`` from ``source`` and write them atomically.

        With ``connection`` (Postgres only: a psycopg connection inside an open transaction) the
        write joins that transaction and is not committed here; it runs in a savepoint and puts
        the caller's session settings back, so the caller's transaction goes on as it was after a
        failure too. ``isolated=False`` drops both (three round trips a chunk): for a caller that
        rolls its transaction back whenever the write raises and whose later statements do not
        depend on the session settings (dpone's own ledger, see complete_in_transaction). Inner mode ``full_refresh``
        deletes every row of the target (not only the window's) before inserting the chunk.
        With ``fence`` the transaction first claims the chunk's fence row (see
        :class:`ChunkFence`): DponeError(CHUNK_LEASE_LOST) when a newer attempt claimed it,
        DponeError(CHUNK_BUSY) when another transaction holds it past the lock wait; either way
        nothing is written.
        """
        return self._transfer(source, window, connection, fence, isolated)

    def write_all(self, source: Source, connection: object | None = None) -> ChunkWrite:
        """Move every row of ``source`` (no chunk predicate) and write them atomically.

        Meant for inner mode ``full_refresh``: the whole target is replaced by the whole source in
        one transaction (``DELETE`` of every row, then the insert; a failure leaves the target as
        it was). ``merge`` and ``append`` work too; ``replace`` needs a window and is refused.
        ``connection`` as for :meth:`write_chunk`.
        """
        return self._transfer(source, None, connection, None)

    @abstractmethod
    def _transfer(
        self,
        source: Source,
        window: Scope,
        connection: object | None,
        fence: ChunkFence | None,
        isolated: bool = True,
    ) -> ChunkWrite:
        """The one write path behind write_chunk (a window) and write_all (None: every row)."""

    def interrupt(self) -> None:  # optional: a dialect that cannot cancel ends later
        """Abort the statement in flight from another thread (a signal handler's helper); the
        writing thread then sees an error and rolls back. Idempotent; a no-op when idle."""

    @abstractmethod
    def preflight(self, window_column: str | None = None) -> list[str]:
        """Human-readable warnings to print before a run (missing index, missing unique key)."""

    def _moved_columns(self, source: Source, window: Scope) -> tuple[str, ...]:
        """The source's columns, checked against what the inner mode needs from them."""
        if self.spec.inner_mode == "replace" and window is None:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"{self.spec.display()}: replace deletes a chunk's range and needs a window; "
                "use inner mode full_refresh to replace the whole table",
            )
        cols = source.columns()
        if self.spec.inner_mode == "replace" and window is not None and window.column not in cols:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"{self.spec.display()}: replace deletes by {window.column!r}, "
                "which is not among the moved columns",
            )
        missing = [k for k in self.spec.keys if k not in cols]
        if self.spec.inner_mode == "merge" and missing:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"{self.spec.display()}: merge keys {missing} are not among the moved columns",
            )
        return cols

    @contextmanager
    def _read_back(self, source: Source, window: Scope) -> Iterator[ReadBackGate]:
        """The read-back gate around one write transaction: entered before the write starts
        (the source's checksum then runs beside it), ``gate.check(written)`` called by the
        dialect after its read-back and before its commit."""
        level, sibling = self._gate_side(source)
        gate = self._gate = ReadBackGate(self.spec, level, window, sibling)
        try:
            yield gate
        finally:
            self._gate = None
            gate.close()

    def _gate_level(self, source: Source) -> str:
        """The read-back gate's level for ``source``: ``sink.read_back``, but count when the
        manifest accepts the narrowing of every moved column (nothing left to hash)."""
        level = self.options.read_back
        if level == "checksum" and self.options.accept_narrowing:
            columns = source.columns()
            hashed = self._hashed(columns)
            if hashed == columns and set(columns) <= set(self.options.accept_narrowing):
                level = "count"
        return level

    def _gate_side(self, source: Source) -> tuple[str, Source | None]:
        """The gate's level for ``source`` and, at level checksum, its sibling source (kept
        open for the next write)."""
        sibling = None
        level = self._gate_level(source)
        if level == "checksum":
            if self._twin is None or self._twin[0] is not source:
                self._close_read_back()
                columns = source.columns()
                hashed = self._hashed(columns)
                only = None if hashed == columns else hashed
                self._twin = (source, source.sibling(only).read_only())
            sibling = self._twin[1]
        return level, sibling

    @contextmanager
    def _read_back_group(
        self, source: Source, windows: Sequence[ChunkWindow]
    ) -> Iterator[GroupReadBackGate]:
        """_read_back for a set-based group (ADR 0022): the source's side checksums every
        window in one grouped statement beside the write; ``gate.check_all`` gates each."""
        level, sibling = self._gate_side(source)
        gate = GroupReadBackGate(self.spec, level, windows, sibling)
        self._gate = gate
        try:
            yield gate
        finally:
            self._gate = None
            gate.close()

    def interrupt_read_back(self) -> None:
        """Abort the gate's source side in flight (from another thread, like interrupt())."""
        gate = self._gate
        if gate is not None:
            gate.interrupt()

    def _hashed(self, columns: tuple[str, ...]) -> tuple[str, ...]:
        """The columns the read-back hashes: the moved ones but those whose narrowing the
        manifest accepts (all of them when that leaves none; the gate then compares counts)."""
        accepted = self.options.accept_narrowing
        return tuple(c for c in columns if c not in accepted) or columns

    def _close_read_back(self) -> None:
        """Close the gate's sibling source (dialects call it from close())."""
        twin, self._twin = self._twin, None
        if twin is not None:
            try:
                twin[1].close()
            except Exception:
                pass

    def _no_external_connection(self, connection: object | None) -> None:
        if connection is not None:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"{self.spec.display()}: an external transaction is only supported for "
                "Postgres sinks",
            )


class ReadBackGate:
    """Proves, inside the sink's transaction and before its commit, that the sink now holds what
    the source holds for the chunk; raises DponeError(READ_BACK_MISMATCH) otherwise.

    The sink's side is its read-back checksum (replace/full_refresh: the target's rows in the
    range; merge: the target's rows whose keys the chunk carries; append: the rows this attempt
    added). The source's side is ``Source.checksum`` (the implementation ``dpone verify`` uses)
    computed on a sibling source in a thread while the sink writes (level ``checksum``), or the
    number of rows the write read from the source (level ``count``). A failed comparison raises
    before the commit, so the dialect's rollback leaves nothing of the chunk behind.
    """

    def __init__(self, spec: SinkSpec, level: str, window: Scope, sibling: Source | None) -> None:
        self._spec = spec
        self.level = level
        self._window = window
        self._sibling = sibling
        self._source_checksum: str | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if sibling is not None:
            self._thread = threading.Thread(target=self._run, name="dpone-read-back", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._sibling is not None
        try:
            self._source_checksum = self._sibling.checksum(self._window)
        except BaseException as exc:  # re-raised in check(), on the writing thread
            self._error = exc

    def _source_side(self) -> str:
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._source_checksum is not None
        return self._source_checksum

    def check(self, written: ChunkWrite) -> ChunkWrite:
        """``written`` with the source's checksum, or DponeError(READ_BACK_MISMATCH)."""
        if self.level == "off":
            return written
        if written.checksum is None:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"{self._spec.display()}: the read-back gate needs the sink's read-back checksum",
            )
        target_rows = checksum_rows(written.checksum)
        source_checksum = None
        source_rows = written.rows
        if self.level == "checksum":
            source_checksum = self._source_side()
            source_rows = checksum_rows(source_checksum)
        if source_rows != target_rows:
            self._refuse(
                f"the source has {source_rows} row(s), the target holds {target_rows} "
                f"({self._what()})"
            )
        if source_checksum is not None and source_checksum != written.checksum:
            self._refuse(f"same count ({source_rows} row(s)), different content ({self._what()})")
        if source_checksum is not None and written.rows != source_rows:
            self._refuse(
                f"the write read {written.rows} row(s) from the source, which holds "
                f"{source_rows} now: the source changed during the move"
            )
        return replace(written, source_checksum=source_checksum)

    def _what(self) -> str:
        return {
            "replace": "the target's rows in the chunk's range",
            "full_refresh": "every row of the target",
            "merge": "the target's rows with the chunk's keys",
            "append": "the rows this write added",
        }[self._spec.inner_mode]

    def _refuse(self, difference: str) -> None:
        raise DponeError(
            errors.READ_BACK_MISMATCH,
            f"{self._spec.display()}: read-back of {scope_display(self._window)} differs from "
            f"the source: {difference}; the chunk's transaction was rolled back (read_back "
            f"{self.level})",
        )

    def interrupt(self) -> None:
        """Cancel the source side's statement in flight (thread-safe; a no-op when done)."""
        if self._thread is not None and self._thread.is_alive() and self._sibling is not None:
            self._sibling.interrupt()

    def close(self) -> None:
        """Stop and join the source side (a failed write leaves it running)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            self.interrupt()
            thread.join()


class _KnownSourceGate(ReadBackGate):
    """A chunk's gate whose source side is already computed (a set-based group's)."""

    def __init__(
        self, spec: SinkSpec, level: str, window: ChunkWindow, source_checksum: str | None
    ) -> None:
        super().__init__(spec, level, window, None)
        self._source_checksum = source_checksum

    def _source_side(self) -> str:
        assert self._source_checksum is not None
        return self._source_checksum


class GroupReadBackGate(ReadBackGate):
    """The read-back gate of a set-based group: the source's side is the checksum of each
    window (``Source.window_checksums``, one grouped statement on the sibling, in a thread
    while the sink writes); ``check_all`` compares each window as its own gate would."""

    def __init__(
        self,
        spec: SinkSpec,
        level: str,
        windows: Sequence[ChunkWindow],
        sibling: Source | None,
    ) -> None:
        self._windows = list(windows)
        self._sums: list[str] | None = None
        super().__init__(spec, level, windows[0], sibling)

    def _run(self) -> None:
        assert self._sibling is not None
        try:
            self._sums = self._sibling.window_checksums(self._windows)  # type: ignore[attr-defined]
        except BaseException as exc:  # re-raised in check_all(), on the writing thread
            self._error = exc

    def check_all(self, writes: Sequence[ChunkWrite]) -> list[ChunkWrite]:
        """Each window's write with its source checksum, or DponeError(READ_BACK_MISMATCH)
        for the first window that differs."""
        sums: list[str | None] = [None] * len(self._windows)
        if self.level == "checksum":
            assert self._thread is not None
            self._thread.join()
            if self._error is not None:
                raise self._error
            assert self._sums is not None
            sums = list(self._sums)
        return [
            _KnownSourceGate(self._spec, self.level, window, known).check(written)
            for window, known, written in zip(self._windows, sums, writes, strict=True)
        ]


def checksum_rows(checksum: str) -> int:
    """The row count inside a checksum string (``scheme:count:hash``)."""
    return int(checksum.split(":")[-2])


# --- identifiers and SQL text ---------------------------------------------------------------------
def check_identifier(name: object, what: str, *, max_chars: int, max_bytes: int = 0) -> str:
    """Reject identifiers that could be truncated or mangled by a server; quoting does the rest."""
    if not isinstance(name, str) or not name:
        raise DponeError(errors.IDENTIFIER_INVALID, f"{what}: expected a non-empty name")
    if "\x00" in name:
        raise DponeError(errors.IDENTIFIER_INVALID, f"{what}: a name cannot contain NUL")
    if len(name) > max_chars or (max_bytes and len(name.encode("utf-8")) > max_bytes):
        limit = f"{max_bytes} bytes" if max_bytes else f"{max_chars} characters"
        raise DponeError(
            errors.IDENTIFIER_INVALID, f"{what}: name {name[:40]!r}... is longer than {limit}"
        )
    return name


def check_unique(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DponeError(errors.CONNECTOR_INVALID, f"{what}: {name!r} appears twice")
        seen.add(name)


def strip_query(query: str) -> str:
    """A trusted query without surrounding blanks and trailing semicolons, ready to nest."""
    return query.strip().rstrip(";").strip()


def sql_text_bound(window: ChunkWindow, value: Bound) -> Bound:
    """A bound for engines that compare timestamps as 'YYYY-MM-DD HH:MM:SS' text (SQLite)."""
    if window.type == "timestamp" and isinstance(value, str):
        match = _TIMESTAMP_BOUND.match(value)
        if match:
            return f"{match.group(1)} {match.group(2)}"
    return value


def index_warnings(
    shown: str,
    spec: SinkSpec,
    window_column: str | None,
    columns: set[str],
    indexes: Sequence[tuple[Sequence[str], bool]],
) -> list[str]:
    """Warnings shared by every dialect: replace without an index, merge without a unique key.

    full_refresh deletes every row, which needs no index.
    """
    out: list[str] = []
    if spec.inner_mode == "replace" and window_column is not None:
        if window_column not in columns:
            out.append(f"target {shown} has no column {window_column!r}: replace deletes will fail")
        elif not any(keys and keys[0] == window_column for keys, _ in indexes):
            out.append(
                f"no index on {shown}.{window_column}: replace deletes will scan the whole table "
                f"for every chunk (create an index whose first column is {window_column})"
            )
    if spec.inner_mode == "merge":
        missing = [k for k in spec.keys if k not in columns]
        if missing:
            out.append(f"target {shown} has no merge key column(s) {missing}")
        elif not any(unique and set(keys) == set(spec.keys) for keys, unique in indexes):
            out.append(
                f"no unique index or constraint on {shown} ({', '.join(spec.keys)}): "
                "merge needs one to detect existing rows"
            )
    return out


# --- checksum -------------------------------------------------------------------------------------
def _trim_fraction(text: str) -> str:
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def canonical_decimal(value: decimal.Decimal) -> str:
    """Plain notation without trailing fractional zeros (Postgres ``trim_scale(v)::text``)."""
    if value.is_nan():
        return "NaN"
    if value.is_infinite():
        return "Infinity" if value > 0 else "-Infinity"
    if value.is_zero():
        return "0"
    return _trim_fraction(format(value, "f"))


def single_precision(value: object) -> object:
    """A single-precision float read as a double (its exact value) as the shortest decimal that
    reads back as the same single: what Postgres prints for a ``real`` and drivers read, so a
    FLOAT from any database checks and moves as the same value (16777216, 1.2345678)."""
    if not isinstance(value, float) or not math.isfinite(value):
        return value
    single = struct.unpack("f", struct.pack("f", value))[0]
    for digits in range(6, 10):
        shortest = float(f"{single:.{digits}g}")
        if struct.unpack("f", struct.pack("f", shortest))[0] == single:
            return shortest
    return single


def canonical_float(value: float) -> str:
    """15 significant digits, then as a decimal (Postgres ``trim_scale(v::float8::numeric)``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return canonical_decimal(decimal.Decimal(format(value, ".15g")))


def canonical_datetime(value: dt.datetime) -> str:
    """UTC wall clock 'YYYY-MM-DD HH:MM:SS[.f]' (naive values are taken as UTC)."""
    if value.tzinfo is not None and value.utcoffset() is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return _trim_fraction(value.replace(tzinfo=None).isoformat(sep=" "))


def canonical_text(value: object) -> str | None:
    """The text every connector hashes for one value; None for SQL NULL.

    Numbers of every kind share one form (12, 12.0 and 12.00 are '12'), timestamps are UTC wall
    clock, booleans '1'/'0', bytes '\\x'+hex, dates ISO; other values their own text.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return canonical_float(value)
    if isinstance(value, decimal.Decimal):
        return canonical_decimal(value)
    if isinstance(value, str):
        return value
    if isinstance(value, dt.datetime):
        return canonical_datetime(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return _trim_fraction(value.replace(tzinfo=None).isoformat())
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


def checksum_order(columns: Sequence[str]) -> list[int]:
    """Column positions in hashing order: by name, so physical column order does not matter."""
    return sorted(range(len(columns)), key=lambda i: columns[i])


def format_checksum(count: int, total: int, scheme: str = CHECKSUM_SCHEME) -> str:
    return f"{scheme}:{count}:{total & _MASK64:016x}"


def checksum_added(after: str, before: str) -> str:
    """The checksum of the rows ``after`` holds beyond those of ``before`` (rows read from the
    same range after and before an append): a checksum is a row count and a sum of row hashes,
    so the added rows' checksum is the difference of both."""
    scheme, count_after, total_after = after.rsplit(":", 2)
    *_, count_before, total_before = before.split(":")
    count = int(count_after) - int(count_before)
    return format_checksum(count, int(total_after, 16) - int(total_before, 16), scheme)


#: lookup3's mix(a, b, c): six steps ``a -= c; a ^= rot(c, k); c += b``, each followed by a turn of
#: the roles (b plays a, c plays b, a plays c), with these rotations k.
_MIX_ROTATIONS = (4, 6, 8, 16, 19, 4)
#: lookup3's final(a, b, c): seven steps ``c ^= b; c -= rot(b, k)``, each followed by the same turn.
_FINAL_ROTATIONS = (14, 11, 25, 16, 4, 14, 24)


def pg_hash64(data: bytes, seed: int = 0) -> int:
    """Postgres's ``hashtextextended(text, seed)`` of UTF-8 ``data``, as an unsigned 64-bit int
    (``seed`` unsigned too: a signed bigint's bits).

    A port of ``hash_bytes_extended`` (src/common/hashfn.c: Bob Jenkins' lookup3, words read
    little-endian, a non-zero seed mixed in first, the result ``b << 32 | c``). Postgres keeps it
    stable across releases because hash partitions and hash indexes survive pg_upgrade; a
    big-endian server computes another value, which the Postgres connector detects with a probe
    (and then hashes in Python instead).
    """
    m = _MASK32
    n = len(data)
    a = b = c = (0x9E3779B9 + n + 3923095) & m
    if seed:
        a = (a + (seed >> 32)) & m
        b = (b + (seed & m)) & m
        for k in _MIX_ROTATIONS:  # mix(a, b, c)
            a = (a - c) & m
            a ^= ((c << k) | (c >> (32 - k))) & m
            c = (c + b) & m
            a, b, c = b, c, a
    full = n // 12
    if full:
        words = struct.unpack_from(f"<{full * 3}I", data)
        for i in range(0, full * 3, 3):
            a = (a + words[i]) & m
            b = (b + words[i + 1]) & m
            c = (c + words[i + 2]) & m
            for k in _MIX_ROTATIONS:  # mix(a, b, c); six turns bring the roles back
                a = (a - c) & m
                a ^= ((c << k) | (c >> (32 - k))) & m
                c = (c + b) & m
                a, b, c = b, c, a
    rest = n - full * 12
    if rest:
        tail = data[full * 12 :] + bytes(12 - rest)
        a = (a + int.from_bytes(tail[0:4], "little")) & m
        if rest > 4:
            b = (b + int.from_bytes(tail[4:8], "little")) & m
        if rest > 8:  # the lowest byte of c is reserved for the length
            c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & m
    for k in _FINAL_ROTATIONS:  # final(a, b, c)
        c ^= b
        c = (c - (((b << k) | (b >> (32 - k))) & m)) & m
        a, b, c = b, c, a
    # seven turns leave the roles turned once: a and b now hold lookup3's b and c
    return (a << 32) | b


def chained_row_hash(fields: Sequence[str | None]) -> int:
    """The 64-bit hash of one row in the chained form (ADR 0027), given its fields' canonical
    texts in column-name order: each field hashed alone, seeded with the hash of the fields
    before it, ``N`` for NULL, else ``"`` + its canonical text. No row text is built or quoted:
    Postgres computes it as nested ``hashtextextended`` calls."""
    value = 0
    for text in fields:
        value = pg_hash64(b"N" if text is None else ('"' + text).encode("utf-8"), value)
    return value


class RowChecksum:
    """Order-independent checksum of rows: count + sum mod 2^64 of a 64-bit hash of each row.

    A row's text is its fields in column-name order joined by ',', each field ``N`` for NULL or
    ``"`` + canonical text with ``"`` doubled + ``"``; its hash is :func:`pg_hash64` of the UTF-8
    bytes, so Postgres computes the same in SQL with ``hashtextextended``. ``chained``: the form
    two Postgres sides compare in, :func:`chained_row_hash` of the fields (CHAINED_SCHEME).
    """

    __slots__ = ("_chained", "_order", "count", "total")

    def __init__(self, columns: Sequence[str], chained: bool = False) -> None:
        self._order = checksum_order(columns)
        self._chained = chained
        self.count = 0
        self.total = 0

    def add(self, row: Sequence[object]) -> None:
        if self._chained:
            value = chained_row_hash([canonical_text(row[i]) for i in self._order])
        else:
            parts = []
            for i in self._order:
                text = canonical_text(row[i])
                parts.append("N" if text is None else '"' + text.replace('"', '""') + '"')
            value = pg_hash64(",".join(parts).encode("utf-8"))
        self.total = (self.total + value) & _MASK64
        self.count += 1

    def add_many(self, rows: Sequence[Sequence[object]]) -> None:
        for row in rows:
            self.add(row)

    def value(self) -> str:
        scheme = CHAINED_SCHEME if self._chained else CHECKSUM_SCHEME
        return format_checksum(self.count, self.total, scheme)
