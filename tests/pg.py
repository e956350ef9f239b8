"""Real-Postgres helpers for tests: the DSN, a loud reachability check and throwaway schemas.

Tests that need Postgres FAIL when it is unreachable (never skip): a skipped ledger test is a test
that did not run. Every test gets its own schema name and drops it afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_dsn() -> str:
    return os.environ.get("DPONE_TEST_POSTGRES_DSN", DEFAULT_DSN)


def require_postgres(dsn: str | None = None) -> str:
    """The DSN, after proving the server answers; raises with a clear message otherwise."""
    import psycopg

    dsn = dsn or postgres_dsn()
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise RuntimeError(
            f"Postgres is required for these tests and is unreachable at {dsn!r} "
            f"(set DPONE_TEST_POSTGRES_DSN): {exc}"
        ) from exc
    return dsn


def fresh_schema_name(prefix: str = "dpone_t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def fresh_schema(dsn: str | None = None, prefix: str = "dpone_t") -> Iterator[str]:
    """A schema name no other test uses; the schema (if created) is dropped on exit."""
    dsn = require_postgres(dsn)
    schema = fresh_schema_name(prefix)
    try:
        yield schema
    finally:
        drop_schema(dsn, schema)
