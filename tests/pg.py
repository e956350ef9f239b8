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


def campaign_advisory_locks(dsn: str, schema: str, run_key: str) -> int:
    """Advisory locks held on the server for one campaign (its campaign lock and its chunks'
    locks), whoever holds them: tests running beside this one hold their own campaigns' locks."""
    import psycopg
    from dpone.ledger.sql import campaign_lock_key, chunk_lock_class

    campaign = campaign_lock_key(schema, run_key) & 0xFFFFFFFFFFFFFFFF
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND ("
            "(objsubid = 2 AND classid::bigint = %s) OR "
            "(objsubid = 1 AND classid::bigint = %s AND objid::bigint = %s))",
            (
                chunk_lock_class(schema, run_key) & 0xFFFFFFFF,
                campaign >> 32,
                campaign & 0xFFFFFFFF,
            ),
        ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def fresh_schema(dsn: str | None = None, prefix: str = "dpone_t") -> Iterator[str]:
    """A schema name no other test uses; the schema (if created) is dropped on exit."""
    dsn = require_postgres(dsn)
    schema = fresh_schema_name(prefix)
    try:
        yield schema
    finally:
        drop_schema(dsn, schema)


def _as_postgres(*argv: str) -> None:
    import subprocess

    subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True)


def scram_cluster_available() -> bool:
    """A private SCRAM cluster needs root (to run initdb as the postgres user), runuser, initdb."""
    import shutil

    return os.geteuid() == 0 and bool(shutil.which("initdb")) and bool(shutil.which("runuser"))


@contextmanager
def scram_cluster(admin_password: str) -> Iterator[int]:
    """A throw-away Postgres cluster on 127.0.0.1 whose every connection is checked with
    scram-sha-256 (the shared test server trusts local connections, so it accepts any password).
    Yields its port; the superuser is ``postgres`` with ``admin_password``."""
    import pwd
    import shutil
    import socket
    import tempfile
    from pathlib import Path

    owner = pwd.getpwnam("postgres")
    base = Path(tempfile.mkdtemp(prefix="dpone-scram-", dir="/tmp"))
    os.chmod(base, 0o755)
    (base / "pw").write_text(admin_password + "\n", encoding="utf-8")
    for path in (base, base / "pw"):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    data = str(base / "data")
    _as_postgres(
        "initdb", "-D", data, "-U", "postgres", "-A", "scram-sha-256", f"--pwfile={base / 'pw'}"
    )
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1"
    _as_postgres("pg_ctl", "-D", data, "-l", str(base / "log"), "-w", "-o", options, "start")
    try:
        yield port
    finally:
        _as_postgres("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)
