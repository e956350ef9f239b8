"""Open a source or sink by the DSN's kind; the only place that imports the dialect modules.

Drivers are optional extras of dpone-runtime, so a missing one becomes DPONE_DRIVER_MISSING with
the extra to install, never a bare ImportError.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from types import ModuleType

from dpone import errors
from dpone.connectors import base
from dpone.credentials.connections import dsn_kind
from dpone.errors import DponeError

#: kind -> (dialect module, its Source class, its Sink class, the extra installing its driver).
#: Registering a connector is one line here (see docs/contributing/connectors.md).
DIALECTS: dict[str, tuple[str, str, str, str]] = {
    "postgres": ("dpone.connectors.postgres", "PostgresSource", "PostgresSink", "postgres"),
    "mssql": ("dpone.connectors.mssql", "MssqlSource", "MssqlSink", "mssql"),
    "mysql": ("dpone.connectors.mysql", "MysqlSource", "MysqlSink", "mysql"),
    "sqlite": ("dpone.connectors.sqlite", "SqliteSource", "SqliteSink", ""),
}
_DRIVERS = {"psycopg", "psycopg_binary", "psycopg_c", "pyodbc", "pymysql"}
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def _module(kind: str) -> ModuleType:
    name, _, _, extra = DIALECTS[kind]
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in _DRIVERS:
            raise
        raise DponeError(
            errors.DRIVER_MISSING,
            f"the {kind} connector needs its driver: install the dpone-runtime "
            f"wheel with its [{extra}] extra, by path (docs/deploy-kubernetes.md)",
        ) from None


def _source_type(kind: str) -> type[base.Source]:
    found: type[base.Source] = getattr(_module(kind), DIALECTS[kind][1])
    return found


def open_source(spec: base.SourceSpec, dsn: str) -> base.Source:
    """A Source for ``spec`` on the database ``dsn`` points at (connections open lazily)."""
    return _source_type(dsn_kind(dsn))(spec, dsn)


def open_sink(spec: base.SinkSpec, dsn: str, options: base.SinkOptions | None = None) -> base.Sink:
    """A Sink for ``spec`` on the database ``dsn`` points at (connections open lazily)."""
    kind = dsn_kind(dsn)
    sink: type[base.Sink] = getattr(_module(kind), DIALECTS[kind][2])
    return sink(spec, dsn, options or base.SinkOptions())


def window_for(column: str, lower: base.Bound, upper: base.Bound) -> base.ChunkWindow:
    """A ChunkWindow whose type is read off the bounds (int, canonical timestamp, else date)."""
    if isinstance(lower, int) and not isinstance(lower, bool):
        return base.ChunkWindow(column, "integer", lower, upper)
    kind = "timestamp" if isinstance(lower, str) and _TIMESTAMP.match(lower) else "date"
    return base.ChunkWindow(column, kind, lower, upper)


def _scope(
    column: str | None, lower: base.Bound | None, upper: base.Bound | None, what: str
) -> base.Scope:
    if column is None and lower is None and upper is None:
        return None
    if column is None or lower is None or upper is None:
        raise DponeError(
            errors.CONNECTOR_INVALID,
            f"{what} needs column, lower and upper together (or none: every row)",
        )
    return window_for(column, lower, upper)


def table_checksum(
    dsn: str,
    table: base.TableRef,
    column: str | None = None,
    lower: base.Bound | None = None,
    upper: base.Bound | None = None,
    columns: Sequence[str] | None = None,
) -> str:
    """The checksum of ``table``'s rows with ``lower <= column < upper`` in the portable form
    (canonical text, the same value in every dialect); of every row when ``column``, ``lower``
    and ``upper`` are all None (a full refresh's target).

    ``columns`` limits the hashed columns (e.g. to leave out a target-only ``loaded_at``).
    """
    window = _scope(column, lower, upper, "table_checksum")
    return _source_type(dsn_kind(dsn)).table_checksum(dsn, table, window, columns)


def pair_checksums(
    source: tuple[str, base.TableRef],
    target: tuple[str, base.TableRef],
    column: str | None = None,
    lower: base.Bound | None = None,
    upper: base.Bound | None = None,
    columns: Sequence[str] | None = None,
) -> tuple[str, str]:
    """The checksums of the same rows on two sides, each a ``(dsn, table)``, in the form both
    agree on: what the read-back gate and ``dpone verify`` compare, and what the ledger records
    (chained between two Postgres databases, ADR 0027; the joined canonical text otherwise).
    Arguments as :func:`table_checksum`."""
    window = _scope(column, lower, upper, "pair_checksums")
    picked = tuple(columns) if columns else None
    sides = [
        open_source(base.SourceSpec("checksum", table=table, columns=picked), dsn)
        for dsn, table in (source, target)
    ]
    with sides[0] as one, sides[1] as other:
        base.Source.agree_both(one, other)
        return one.checksum(window), other.checksum(window)
