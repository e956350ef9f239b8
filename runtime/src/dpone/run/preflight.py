"""Refuse a run whose tables cannot work, or would change values, before any chunk is leased.

A missing target table used to be a warning, then every chunk of the campaign was leased, failed
and recorded as failed. Here both sides are described read-only through the connectors (the
source as the process reads it, the target table whole): the source must be readable and hold
the chunk column, the target must exist and hold every column the source moves, and no moved
column's target type may be narrower than its source type (dpone.connectors.column_types: a
narrower column rounds, truncates, pads or drops a time zone without an error on most servers)
unless the manifest accepts it in ``sink.accept_narrowing``. A problem is DPONE_PREFLIGHT_FAILED
at the manifest location (exit 3); a database that cannot be reached stays
DPONE_CONNECTION_FAILED (exit 4, retry).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping

from dpone import errors
from dpone.authoring.models import SinkConfig
from dpone.connectors.base import SinkSpec, Source, SourceSpec
from dpone.connectors.column_types import ColumnType, narrowing
from dpone.credentials.connections import dsn_kind
from dpone.errors import DponeError
from dpone.lifecycle.interrupt import STOP
from dpone.packing.pack import ProcessPlan
from dpone.plan.chunks import parse_timestamp

OpenSource = Callable[[SourceSpec, str], Source]
Types = Mapping[str, ColumnType | None]
_UNREADABLE = (errors.SOURCE_FAILED, errors.SINK_FAILED)
_WAY_OUT = (
    "widen the target column(s), or list them in sink.accept_narrowing to accept that the "
    "target changes such values"
)


def _open_source(spec: SourceSpec, dsn: str) -> Source:
    from dpone.connectors.factory import open_source

    return open_source(spec, dsn)


def _describe(
    spec: SourceSpec, dsn: str, open_source: OpenSource, types: bool = False
) -> tuple[tuple[str, ...], Types] | str:
    """The described columns (and their types when asked), or the reason they could not be
    read (a missing table or column); connection failures propagate."""
    try:
        with open_source(spec, dsn).read_only() as side, STOP.cancellable(side.interrupt):
            columns = side.columns()  # a stop cancels a query blocked on the table's lock
            return columns, side.column_types() if types else {}
    except DponeError as exc:
        if exc.code not in _UNREADABLE or STOP.requested:
            raise
        return exc.message.removeprefix(f"{spec.display()}: ")


def _columns(spec: SourceSpec, dsn: str, open_source: OpenSource) -> tuple[str, ...] | str:
    found = _describe(spec, dsn, open_source)
    return found if isinstance(found, str) else found[0]


def require_tables(
    plan: ProcessPlan,
    source_spec: SourceSpec,
    sink_spec: SinkSpec,
    dsn: Callable[[str], str],
    open_source: OpenSource = _open_source,
    *,
    types_only: bool = False,
) -> None:
    """DPONE_PREFLIGHT_FAILED unless the source, its chunk column and the target's columns are
    all there and no moved column narrows (see :func:`check_types`). ``dsn`` resolves a
    connection name; ``open_source`` is the connector factory. ``types_only`` (a full refresh,
    which reports a missing table as a failed write) runs the type check alone, on what both
    sides show read-only."""
    if types_only:
        source = _describe(source_spec, dsn(source_spec.connection), open_source, types=True)
        target_dsn = dsn(sink_spec.connection)
        plain = _describe(
            SourceSpec(sink_spec.connection, table=sink_spec.table),
            target_dsn,
            open_source,
            types=True,
        )
        if not isinstance(source, str) and not isinstance(plain, str):
            check_types(plan, source[1], plain[1], target_dsn)
        return
    cfg = plan.config
    problems: list[str] = []
    source_dsn, target_dsn = dsn(source_spec.connection), dsn(sink_spec.connection)
    described = _describe(source_spec, source_dsn, open_source, types=True)
    source_types: Types = {}
    if isinstance(described, str):
        problems.append(f"the source cannot be read: {described}")
        moved: tuple[str, ...] = ()
    else:
        moved, source_types = described
    chunk_column = cfg.backfill.chunk.column if cfg.backfill is not None else None
    if moved and chunk_column is not None and not _has(moved, chunk_column, source_dsn):
        probe = SourceSpec(
            source_spec.connection, source_spec.table, source_spec.query, (chunk_column,)
        )
        found = _columns(probe, source_dsn, open_source)
        if isinstance(found, str):
            problems.append(f"the source has no chunk column {chunk_column!r}: {found}")
    target_spec = SourceSpec(sink_spec.connection, table=sink_spec.table, role="target")
    target = _describe(target_spec, target_dsn, open_source, types=True)
    if isinstance(target, str):
        problems.append(f"target table {sink_spec.table.display()!r} cannot be read: {target}")
    else:
        wanted = [*moved]
        if chunk_column is not None and sink_spec.inner_mode == "replace":
            wanted.append(chunk_column)  # replace deletes the chunk's range by it
        missing = sorted({c for c in wanted if not _has(target[0], c, target_dsn)})
        if missing:
            problems.append(
                f"target table {sink_spec.table.display()!r} has no column(s) "
                f"{', '.join(repr(c) for c in missing)}"
            )
    if problems:
        raise DponeError(
            errors.PREFLIGHT_FAILED,
            f"process {plan.name!r}: {'; '.join(problems)}; no chunk was started",
            cfg.location,
        )
    assert not isinstance(target, str)
    check_types(plan, source_types, target[1], target_dsn)
    check_chunk_order(plan, ((source_types, source_dsn), (target[1], target_dsn)))


def check_chunk_order(plan: ProcessPlan, sides: tuple[tuple[Types, str], ...]) -> None:
    """DPONE_PREFLIGHT_FAILED for a timestamp chunk over a DATE column where the database
    compares them so that a chunk takes other days' rows, on both sides alike, which no
    read-back sees: SQLite compares the column's text with the bound's ('2024-01-01' <
    '2024-01-01 00:00:00'); Postgres reads a bound as a date, dropping its time of day, which
    matters once an edge is not at midnight."""
    cfg = plan.config
    chunk = cfg.backfill.chunk if cfg.backfill is not None else None
    if chunk is None or chunk.type != "timestamp":
        return
    for types, dsn in sides:
        kind = {_key(n, dsn): t for n, t in types.items()}.get(_key(chunk.column, dsn))
        if kind is None or kind.family != "date":
            continue
        if dsn_kind(dsn) == "postgres" and not _midnight_edges(plan):
            raise DponeError(
                errors.PREFLIGHT_FAILED,
                f"process {plan.name!r}: the timestamp chunk column {chunk.column!r} is "
                f"{kind.declared} in Postgres, which reads each bound as a date, dropping its "
                "time of day (2024-03-10T23:00:00Z as 2024-03-10): a chunk whose edge is not at "
                "midnight would take another day's rows; chunk it with type: date; nothing was "
                "moved",
                cfg.location,
            )
        if dsn_kind(dsn) == "sqlite":
            raise DponeError(
                errors.PREFLIGHT_FAILED,
                f"process {plan.name!r}: the timestamp chunk column {chunk.column!r} is "
                f"{kind.declared} in SQLite, which compares its text with each bound's "
                "('2024-01-01' < '2024-01-01 00:00:00'): every day's rows would fall into the "
                "chunk before theirs; chunk it with type: date; nothing was moved",
                cfg.location,
            )


def _midnight_edges(plan: ProcessPlan) -> bool:
    """Every chunk edge of the plan falls on a day's start (a timestamp chunk of whole days)."""
    return all(
        parse_timestamp(edge).time() == dt.time(0)
        for chunk in plan.chunks
        for edge in (chunk.start, chunk.end)
    )


def check_types(plan: ProcessPlan, source: Types, target: Types, target_dsn: str) -> None:
    """DPONE_PREFLIGHT_FAILED when a moved column's target type can change a value of its
    source type (dpone.connectors.column_types.narrowing) and sink.accept_narrowing does not
    name it, or when sink.accept_narrowing names a column that is not moved. Located at the
    accept_narrowing entry, else at the sink's table in the manifest."""
    cfg = plan.config
    sink = cfg.sink
    moved = tuple(source)
    for i, column in enumerate(sink.accept_narrowing):
        where = sink.narrowing_locations[i] if i < len(sink.narrowing_locations) else cfg.location
        if not _has(moved, column, target_dsn):
            raise DponeError(
                errors.PREFLIGHT_FAILED,
                f"process {plan.name!r}: sink.accept_narrowing names {column!r}, which the "
                f"source does not move (moved: {', '.join(moved)}); no chunk was started",
                where,
            )
    accepted = {_key(c, target_dsn) for c in sink.accept_narrowing}
    by_name = {_key(name, target_dsn): kind for name, kind in target.items()}
    problems: list[str] = []
    for name, source_type in source.items():
        target_type = by_name.get(_key(name, target_dsn))
        if source_type is None or target_type is None or _key(name, target_dsn) in accepted:
            continue
        reason = narrowing(source_type, target_type) or _unseen(source_type, target_type, sink)
        if reason is not None:
            problems.append(
                f"column {name!r}: source type {source_type.declared} -> target type "
                f"{target_type.declared}: {reason}"
            )
    if problems:
        raise DponeError(
            errors.PREFLIGHT_FAILED,
            f"process {plan.name!r}: the target can change moved values: {'; '.join(problems)}; "
            f"nothing was moved: {_WAY_OUT}",
            sink.table_location or cfg.location,
        )
    chunk = cfg.backfill.chunk if cfg.backfill is not None else None
    if chunk is not None and chunk.type == "integer":
        target_type = by_name.get(_key(chunk.column, target_dsn))
        if target_type is not None and target_type.family not in _NUMBERS:
            # not acceptable by accept_narrowing: no value changes, the ranges do
            raise DponeError(
                errors.PREFLIGHT_FAILED,
                f"process {plan.name!r}: the integer chunk column {chunk.column!r} is "
                f"{target_type.declared} in the target, which orders its values as "
                f"{target_type.family} ('19' < '2'), so a chunk's range there holds other "
                "chunks' rows (replace would delete them, the read-back would miss them); "
                "store it in an integer column; nothing was moved",
                sink.table_location or cfg.location,
            )


def _unseen(source: ColumnType, target: ColumnType, sink: SinkConfig) -> str | None:
    """A source column of unknown kind (a SQLite query's result, an untyped SQLite column) is let
    through by narrowing() because the read-back gate sees its values; at a level that does not
    compare values, nothing would see a target that rounds them (1.239 into numeric(10,2))."""
    if source.family != "any" or target.family == "any" or sink.read_back == "checksum":
        return None
    return (
        f"the source's type is unknown (no declared type), so only the read-back gate could "
        f"see the target change a value, and sink.read_back {sink.read_back!r} does not compare "
        "values (keep read_back checksum, or move a table column of declared type)"
    )


#: the target families that order an integer chunk column's values as numbers
_NUMBERS = frozenset({"integer", "decimal", "float", "any"})


def _key(name: str, dsn: str) -> str:
    return name if dsn_kind(dsn) == "postgres" else name.casefold()


def _has(columns: tuple[str, ...], name: str, dsn: str) -> bool:
    """Postgres compares quoted names exactly; SQLite and SQL Server ignore case by default."""
    if dsn_kind(dsn) == "postgres":
        return name in columns
    return name.casefold() in {c.casefold() for c in columns}
