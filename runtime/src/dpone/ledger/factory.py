"""Open the ledger a process's ``state:`` declares, without importing drivers it does not use.

Drivers are optional extras of dpone-runtime; a missing one is a DPONE_LEDGER_UNAVAILABLE error
that names the extra to install, never an ImportError from deep inside an adapter.
"""

from __future__ import annotations

import importlib
from typing import Any

from dpone import errors
from dpone.credentials.connections import dsn_kind
from dpone.errors import DponeError
from dpone.ledger.port import LedgerStore
from dpone.ledger.sql import DEFAULT_SCHEMA

EXTRA_BY_KIND = {"postgres": "postgres", "mssql": "mssql"}


def _adapter(module: str, kind: str) -> Any:
    """Import an adapter module; a missing driver becomes DPONE_LEDGER_UNAVAILABLE."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DponeError(
            errors.LEDGER_UNAVAILABLE,
            f"the {kind} ledger needs its driver ({exc}): install the dpone-runtime wheel "
            f"with its [{EXTRA_BY_KIND[kind]}] extra, by path (docs/deploy-kubernetes.md)",
        ) from exc


def open_store(
    backend: str,
    dsn: str | None,
    schema: str | None,
    path: str | None,
    *,
    lease_seconds: float = 300.0,
    **options: Any,
) -> LedgerStore:
    """The LedgerStore for a state backend: audit_schema (Postgres or MSSQL by the DSN's scheme),
    local_file, or clickhouse (refused in this release)."""
    if backend == "audit_schema":
        if not dsn:
            raise DponeError(
                errors.CONFIG_INVALID, "state.backend audit_schema needs a connection (its DSN)"
            )
        kind = dsn_kind(dsn)
        if kind == "postgres":
            postgres = _adapter("dpone.ledger.postgres", kind)
            store: LedgerStore = postgres.PostgresLedger(
                dsn, schema or DEFAULT_SCHEMA, lease_seconds, **options
            )
            return store
        if kind == "mssql":
            mssql = _adapter("dpone.ledger.mssql", kind)
            store = mssql.MssqlLedger(dsn, schema or DEFAULT_SCHEMA, lease_seconds, **options)
            return store
        raise DponeError(
            errors.LEDGER_UNAVAILABLE,
            f"state.backend audit_schema runs on Postgres or MSSQL, not on a {kind} connection",
        )
    if backend == "local_file":
        if not path:
            raise DponeError(errors.CONFIG_INVALID, "state.backend local_file needs a path")
        from dpone.ledger.localfile import LocalFileLedger

        try:
            return LocalFileLedger(path, lease_seconds, **options)
        except OSError as exc:
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"state.path {path!r}: the local_file ledger cannot create its files there "
                f"({exc.strerror or type(exc).__name__})",
            ) from None
    if backend == "clickhouse":
        raise DponeError(
            errors.LEDGER_UNAVAILABLE,
            "state.backend clickhouse is not supported in this release: use audit_schema "
            "(Postgres or MSSQL) or local_file",
        )
    raise DponeError(
        errors.CONFIG_INVALID,
        f"unknown state.backend {backend!r}: expected audit_schema, local_file or clickhouse",
    )
