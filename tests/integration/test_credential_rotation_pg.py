"""A password kept apart from the DSN, against a real Postgres that checks it (SCRAM).

The shared test server trusts 127.0.0.1, so a wrong password would pass there; this module starts
its own throw-away cluster with scram-sha-256 authentication. It proves that a password file is
read again at connect time (rotated in place between two connects of one process, and between two
`dpone run`s, with no restart), that a separate password variable works, and that passwords with
/ @ : ? # % reach the server unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dpone.credentials import redaction
from dpone.credentials.connections import resolve_dsn
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/pg.py
from pg import scram_cluster, scram_cluster_available

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"
ADMIN_PW = "Admin-Boot-pw1"
FIRST = "first/@:?#%A1"
SECOND = "second#%/@:?B2"
THIRD = "third:@/?#%C3"

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow: {image: example/dpone:1}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: wh, table: {{schema: app, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: app, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-04}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: wh, schema: {audit}, require_distributed_lock: true}}
"""


@pytest.fixture(scope="module")
def scram_port() -> Iterator[int]:
    if not scram_cluster_available():
        pytest.skip("needs root, runuser and initdb to start a private SCRAM cluster")
    with scram_cluster(ADMIN_PW) as port:
        admin = f"postgresql://postgres:{ADMIN_PW}@127.0.0.1:{port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE app LOGIN PASSWORD {}").format(sql.Literal(FIRST)))
            conn.execute("CREATE SCHEMA app AUTHORIZATION app")
            conn.execute("GRANT CREATE ON DATABASE postgres TO app")
        yield port


def _rotate(port: int, password: str) -> None:
    admin = f"postgresql://postgres:{ADMIN_PW}@127.0.0.1:{port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE app PASSWORD {}").format(sql.Literal(password)))


def test_password_file_is_reread_at_connect_after_rotation(scram_port: int, tmp_path: Path) -> None:
    redaction.forget_registered_secrets()
    _rotate(scram_port, FIRST)
    secret = tmp_path / "password"
    secret.write_text(FIRST + "\n", encoding="utf-8")
    env = {
        "DPONE_CONN_WH": f"postgresql://app@127.0.0.1:{scram_port}/postgres",
        "DPONE_CONN_WH_PASSWORD_FILE": str(secret),
    }
    with psycopg.connect(resolve_dsn("wh", env)) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("app",)
    _rotate(scram_port, SECOND)
    with pytest.raises(psycopg.OperationalError):  # the stale password is really refused
        psycopg.connect(resolve_dsn("wh", env)).close()
    secret.write_text(SECOND + "\n", encoding="utf-8")  # the rotator rewrites the file
    with psycopg.connect(resolve_dsn("wh", env)) as conn:  # same process, no restart
        assert conn.execute("SELECT current_user").fetchone() == ("app",)


def _terminate_sessions(port: int) -> None:
    """What a failover or a rotation policy does mid-run: every session of ``app`` ends."""
    admin = f"postgresql://postgres:{ADMIN_PW}@127.0.0.1:{port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'app'")


def test_a_reconnect_mid_run_uses_the_rotated_password(scram_port: int, tmp_path: Path) -> None:
    """The connectors' and the ledger's connections, opened with the first password, are lost
    after the password was rotated and the file rewritten: their reconnects in the same process
    read the file again (docs/security.md: "never cached")."""
    from dpone import errors
    from dpone.connectors.postgres import PgConnection
    from dpone.errors import DponeError
    from dpone.ledger.postgres import PostgresLedger

    _rotate(scram_port, FIRST)
    secret = tmp_path / "password"
    secret.write_text(FIRST + "\n", encoding="utf-8")
    env = {
        "DPONE_CONN_WH": f"postgresql://app@127.0.0.1:{scram_port}/postgres",
        "DPONE_CONN_WH_PASSWORD_FILE": str(secret),
    }
    dsn = resolve_dsn("wh", env)  # what the run resolves once, when it opens its connectors
    table = PgConnection(dsn, "table app.orders")
    assert table.get().execute("SELECT current_user").fetchone() == ("app",)
    ledger = PostgresLedger(dsn, "audit_reconnect")
    try:
        assert ledger.list_campaigns() == []
        _rotate(scram_port, SECOND)
        secret.write_text(SECOND + "\n", encoding="utf-8")
        _terminate_sessions(scram_port)
        with pytest.raises(psycopg.OperationalError):
            table.get().execute("SELECT 1")
        table.forget_if_broken()
        assert table.get().execute("SELECT current_user").fetchone() == ("app",)
        with pytest.raises(DponeError) as lost:
            ledger.list_campaigns()
        assert lost.value.code == errors.CONNECTION_FAILED
        assert ledger.list_campaigns() == []  # reconnected with the rotated password
    finally:
        ledger.close()
        table.discard()


def _run(root: Path, audit: str, env: dict[str, str], ok: bool = True) -> dict[str, object]:
    (root / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    (root / "orders.yaml").write_text(MANIFEST.format(audit=audit), encoding="utf-8")
    xcom = root / f"{audit}.json"
    done = subprocess.run(
        [str(DPONE), "run", "--catalog", "workloads.yaml", "--workload", "orders"],
        cwd=root,
        env={**env, "DPONE_XCOM_PATH": str(xcom)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    for secret in (FIRST, SECOND, THIRD):
        assert secret not in done.stdout + done.stderr + xcom.read_text(encoding="utf-8")
    assert (done.returncode == 0) is ok, done.stderr[-3000:]
    result: dict[str, object] = json.loads(xcom.read_text(encoding="utf-8"))
    return result


def test_dpone_run_with_a_rotated_file_and_with_a_password_variable(
    scram_port: int, tmp_path: Path
) -> None:
    _rotate(scram_port, FIRST)
    setup = {
        "DPONE_CONN_X": f"postgresql://app@127.0.0.1:{scram_port}/postgres",
        "DPONE_CONN_X_PASSWORD": FIRST,
    }
    with psycopg.connect(
        resolve_dsn("x", setup),
        autocommit=True,
    ) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS app.raw_orders (order_id bigint PRIMARY KEY, "
            "order_date date NOT NULL, amount integer NOT NULL)"
        )
        conn.execute("CREATE TABLE IF NOT EXISTS app.orders (LIKE app.raw_orders)")
        conn.execute(
            "INSERT INTO app.raw_orders SELECT g, date '2023-01-01' + (g % 3), g "
            "FROM generate_series(1, 30) g ON CONFLICT DO NOTHING"
        )
    base = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    dsn = f"postgresql://app@127.0.0.1:{scram_port}/postgres"
    secret = tmp_path / "password"
    secret.write_text(FIRST + "\n", encoding="utf-8")
    by_file = {**base, "DPONE_CONN_WH": dsn, "DPONE_CONN_WH_PASSWORD_FILE": str(secret)}
    assert _run(tmp_path, "audit_file_1", by_file)["status"] == "passed"
    _rotate(scram_port, SECOND)
    secret.write_text(SECOND + "\n", encoding="utf-8")  # same variables, rotated file
    assert _run(tmp_path, "audit_file_2", by_file)["status"] == "passed"
    _rotate(scram_port, THIRD)
    by_variable = {**base, "DPONE_CONN_WH": dsn, "DPONE_CONN_WH_PASSWORD": THIRD}
    assert _run(tmp_path, "audit_variable", by_variable)["status"] == "passed"
    stale = {**base, "DPONE_CONN_WH": dsn, "DPONE_CONN_WH_PASSWORD": SECOND}
    refused = _run(tmp_path, "audit_stale", stale, ok=False)  # the server really checks
    assert refused["status"] == "failed"
    assert refused["error"]["code"] == "DPONE_CONNECTION_FAILED"  # type: ignore[index]
