"""Refuse a run whose tables cannot work before any chunk is leased.

A missing target table used to be a warning, then every chunk of the campaign was leased, failed
and recorded as failed. Here both sides are described read-only through the connectors (the
source as the process reads it, the target table whole): the source must be readable and hold
the chunk column, the target must exist and hold every column the source moves. A problem is
DPONE_PREFLIGHT_FAILED at the process's manifest location (exit 3); a database that cannot be
reached stays DPONE_CONNECTION_FAILED (exit 4, retry).
"""

from __future__ import annotations

from collections.abc import Callable

from dpone import errors
from dpone.connections import dsn_kind
from dpone.connectors.base import SinkSpec, Source, SourceSpec
from dpone.errors import DponeError
from dpone.pack import ProcessPlan

OpenSource = Callable[[SourceSpec, str], Source]
_UNREADABLE = (errors.SOURCE_FAILED, errors.SINK_FAILED)


def _open_source(spec: SourceSpec, dsn: str) -> Source:
    from dpone.connectors.factory import open_source

    return open_source(spec, dsn)


def _columns(spec: SourceSpec, dsn: str, open_source: OpenSource) -> tuple[str, ...] | str:
    """The described columns, or the reason they could not be read (a missing table or column);
    connection failures propagate."""
    try:
        with open_source(spec, dsn).read_only() as side:
            return side.columns()
    except DponeError as exc:
        if exc.code not in _UNREADABLE:
            raise
        return exc.message.removeprefix(f"{spec.display()}: ")


def require_tables(
    plan: ProcessPlan,
    source_spec: SourceSpec,
    sink_spec: SinkSpec,
    dsn: Callable[[str], str],
    open_source: OpenSource = _open_source,
) -> None:
    """DPONE_PREFLIGHT_FAILED unless the source, its chunk column and the target's columns are
    all there. ``dsn`` resolves a connection name; ``open_source`` is the connector factory."""
    cfg = plan.config
    problems: list[str] = []
    source_dsn, target_dsn = dsn(source_spec.connection), dsn(sink_spec.connection)
    moved = _columns(source_spec, source_dsn, open_source)
    if isinstance(moved, str):
        problems.append(f"the source cannot be read: {moved}")
        moved = ()
    chunk_column = cfg.backfill.chunk.column if cfg.backfill is not None else None
    if moved and chunk_column is not None and not _has(moved, chunk_column, source_dsn):
        probe = SourceSpec(
            source_spec.connection, source_spec.table, source_spec.query, (chunk_column,)
        )
        found = _columns(probe, source_dsn, open_source)
        if isinstance(found, str):
            problems.append(f"the source has no chunk column {chunk_column!r}: {found}")
    target = _columns(
        SourceSpec(sink_spec.connection, table=sink_spec.table, role="target"),
        target_dsn,
        open_source,
    )
    if isinstance(target, str):
        problems.append(f"target table {sink_spec.table.display()!r} cannot be read: {target}")
    else:
        wanted = [*moved]
        if chunk_column is not None and sink_spec.inner_mode == "replace":
            wanted.append(chunk_column)  # replace deletes the chunk's range by it
        missing = sorted({c for c in wanted if not _has(target, c, target_dsn)})
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


def _has(columns: tuple[str, ...], name: str, dsn: str) -> bool:
    """Postgres compares quoted names exactly; SQLite and SQL Server ignore case by default."""
    if dsn_kind(dsn) == "postgres":
        return name in columns
    return name.casefold() in {c.casefold() for c in columns}
