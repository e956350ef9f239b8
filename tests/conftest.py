"""Shared test configuration: the Postgres DSN (tests that need it fail loudly without it)."""

from __future__ import annotations

import os

import pytest

DEFAULT_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(autouse=True)
def _fresh_secret_registry() -> None:
    """Each test starts with no registered secret: a short password one test registered (``p``)
    must not mask another test's output, as a separate `dpone` process would not."""
    from dpone.credentials.redaction import forget_registered_secrets

    forget_registered_secrets()


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


DEFAULT_TEST_MYSQL_DSN = "mysql://root@127.0.0.1:3306/"


def mysql_server_dsn() -> str:
    """The test MySQL/MariaDB server (no database in the path: tests create their own)."""
    return os.environ.get("DPONE_TEST_MYSQL_DSN", DEFAULT_TEST_MYSQL_DSN)


@pytest.fixture(scope="session")
def mysql_dsn() -> str:
    """The real MariaDB/MySQL server's DSN; unreachable is a test failure, never a skip."""
    import pymysql
    from dpone.connectors.mysql import parse_dsn

    dsn = mysql_server_dsn()
    try:
        conn = pymysql.connect(**parse_dsn(dsn).connect_args())
        conn.close()
    except pymysql.err.Error as exc:
        pytest.fail(
            f"MariaDB/MySQL is required and not reachable at DPONE_TEST_MYSQL_DSN={dsn}: {exc}. "
            f"Run scripts/ensure_mariadb.sh (scripts/test.sh does it for you).",
            pytrace=False,
        )
    return dsn
