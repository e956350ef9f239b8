"""Real MariaDB/MySQL helpers for tests: throwaway databases with unique names, dropped afterwards.

The server is the local one (DPONE_TEST_MYSQL_DSN, default root on 127.0.0.1:3306); tests that
need it fail when it is unreachable (the ``mysql_dsn`` fixture in tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

import pymysql
from dpone.connectors.mysql import parse_dsn


def database_dsn(server_dsn: str, database: str) -> str:
    """The server DSN with ``database`` as its path."""
    base = server_dsn.split("?", 1)[0].rstrip("/")
    return f"{base}/{database}"


class My:
    """Unique databases on the test server for one test; ``dsn(db)`` points at one of them."""

    def __init__(self, server_dsn: str) -> None:
        self.server_dsn = server_dsn
        self.conn = pymysql.connect(**parse_dsn(server_dsn).connect_args(), autocommit=True)
        self._databases: list[str] = []

    def database(self, prefix: str = "dpone_my") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self.run(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        self._databases.append(name)
        return name

    def dsn(self, database: str) -> str:
        return database_dsn(self.server_dsn, database)

    def run(self, query: str, params: Sequence[Any] | None = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute(query, params)

    def many(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(query, rows)

    def rows(self, query: str, params: Sequence[Any] | None = None) -> list[Any]:
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return list(cur.fetchall())

    def close(self) -> None:
        for name in self._databases:
            with contextlib.suppress(pymysql.err.Error):
                self.run(f"DROP DATABASE IF EXISTS `{name}`")
        self.conn.close()
