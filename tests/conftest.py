"""Shared test configuration: the Postgres DSN (tests that need it fail loudly without it)."""

from __future__ import annotations

import os

import pytest

DEFAULT_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_dsn() -> str:
    return os.environ.get("DPONE_TEST_POSTGRES_DSN", DEFAULT_TEST_DSN)


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The real test server's DSN; a connection failure is a test failure, never a skip."""
    import psycopg

    dsn = postgres_dsn()
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("select 1")
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"Postgres is required and not reachable at DPONE_TEST_POSTGRES_DSN={dsn}: {exc}. "
            f"Run scripts/ensure_postgres.sh (scripts/test.sh does it for you).",
            pytrace=False,
        )
    return dsn
