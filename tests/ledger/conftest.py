"""Fixtures of the ledger tests: one parametrized ``backend`` over the three stores."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent):  # ledger_* helpers and tests/pg.py, also for spawned workers
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from ledger_backends import (  # noqa: E402
    Backend,
    LocalFileBackend,
    MssqlDoubleBackend,
    PostgresBackend,
)
from pg import drop_schema, fresh_schema_name, require_postgres  # noqa: E402

BACKENDS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mssql_double"),
    pytest.param("local_file"),
]


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The test server's DSN; fails (never skips) when Postgres is unreachable."""
    return require_postgres()


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    schema = fresh_schema_name()
    yield schema
    drop_schema(pg_dsn, schema)


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if name == "postgres":
        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")
        return PostgresBackend(dsn, schema)
    if name == "mssql_double":
        return MssqlDoubleBackend(tmp_path)
    return LocalFileBackend(tmp_path)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = make_backend(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture(params=BACKENDS[:2])
def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = make_backend(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """Every statement a psycopg connection executes from here on, and whether it went out in a
    pipeline (queued with the others, their results read after one sync)."""
    import psycopg

    recorded: list[tuple[str, bool]] = []
    execute = psycopg.Connection.execute

    def recording(self: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        piped = self.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF
        recorded.append((str(query), piped))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", recording)
    yield recorded
