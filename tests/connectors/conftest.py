"""Fixtures for the connector tests: throwaway Postgres schemas, a second database, SQLite files.

Postgres is required: ``pg_dsn`` (tests/conftest.py) fails the test when the server is down.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from .support import OTHER_DATABASE, Pg, other_database_dsn


@pytest.fixture
def pg(pg_dsn: str) -> Iterator[Pg]:
    helper = Pg(pg_dsn)
    try:
        yield helper
    finally:
        helper.close()


@pytest.fixture(scope="session")
def pg_other_dsn(pg_dsn: str) -> str:
    """A second database on the same server (created once; concurrent creators are fine)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (OTHER_DATABASE,)
        ).fetchone()
        if not exists:
            with contextlib.suppress(
                psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation
            ):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(OTHER_DATABASE)))
    return other_database_dsn(pg_dsn)


@pytest.fixture
def pg_other(pg_other_dsn: str) -> Iterator[Pg]:
    helper = Pg(pg_other_dsn)
    try:
        yield helper
    finally:
        helper.close()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Callable[[str], tuple[str, sqlite3.Connection]]]:
    """Create a SQLite file; returns its DSN and an autocommit connection to set it up."""
    opened: list[sqlite3.Connection] = []

    def make(name: str) -> tuple[str, sqlite3.Connection]:
        path = tmp_path / f"{name}.db"
        conn = sqlite3.connect(path, isolation_level=None)
        opened.append(conn)
        return f"sqlite:///{path}", conn

    yield make
    for conn in opened:
        conn.close()
