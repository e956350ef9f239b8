"""Helpers of the end-to-end suite: the project copy and its generated DAGs, the private Postgres
database with the source rows, the Airflow harness runner and the data/ledger checks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROJECT = HERE / "project"
HARNESS = HERE / "harness" / "airflow_e2e.py"
DPONE = Path(sys.executable).with_name("dpone")
DATABASE = "dpone_e2e"
ROWS_PER_DAY = 50
SUMMARY_DAG = "dpone_e2e_orders_summary"
INTERNAL_DAG = "dpone_e2e_orders_internal"
TASK = "run_orders"
AUDIT = "e2e_audit"
PATHS = ("--print-paths",)


# --- project ---------------------------------------------------------------------------------------


def copy_project(target: Path) -> Path:
    """The project with airflow.command = this venv's dpone and airflow.catalog_path = the copy's
    absolute path (what a worker needs to find both). Returns the catalog path."""
    target.mkdir(parents=True, exist_ok=True)
    for path in PROJECT.glob("*.yaml"):
        shutil.copy(path, target / path.name)
    catalog = target / "workloads.yaml"
    text = catalog.read_text(encoding="utf-8")
    text = text.replace("command: [dpone]", f"command: [{json.dumps(str(DPONE))}]")
    text = text.replace("catalog_path: workloads.yaml", f"catalog_path: {json.dumps(str(catalog))}")
    assert str(DPONE) in text and str(catalog) in text
    catalog.write_text(text, encoding="utf-8")
    return catalog


def dpone(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DPONE), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(env or {})},
    )


# --- Postgres --------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def private_database(base_dsn: str, prefix: str = DATABASE) -> Iterator[str]:
    """A database of this test process only (``<prefix>_<pid>``), dropped afterwards."""
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (prefix + "\\_%",)
        ).fetchall():
            suffix = name[len(prefix) + 1 :]
            if suffix.isdigit() and not _pid_alive(int(suffix)):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        name = f"{prefix}_{os.getpid()}"
        with contextlib.suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(base_dsn)
    info["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo(**info)
    finally:
        with psycopg.connect(base_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def as_url(dsn: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    password = f":{info['password']}" if info.get("password") else ""
    return (
        f"postgresql://{info.get('user', 'postgres')}{password}@{info.get('host', '127.0.0.1')}"
        f":{info.get('port', '5432')}/{info['dbname']}"
    )


def seed(dsn: str) -> None:
    """e2e.orders_src: 50 orders a day over 2023 (18,250 rows); the two targets, each with a
    CHECK (amount >= 0) a bad source row can break."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS e2e CASCADE")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(AUDIT)))
        conn.execute("CREATE SCHEMA e2e")
        conn.execute(
            "CREATE TABLE e2e.orders_src (order_id bigint PRIMARY KEY, order_date date NOT NULL, "
            "customer text NOT NULL, amount numeric(12,2) NOT NULL)"
        )
        conn.execute(
            "INSERT INTO e2e.orders_src SELECT g, date '2023-01-01' + ((g - 1) %% 365), "
            "'customer-' || (g %% 97), round(((g * 7919) %% 100000) / 100.0, 2) "
            "FROM generate_series(1, %s) AS g",
            (365 * ROWS_PER_DAY,),
        )
        for table in ("orders_summary", "orders_internal"):
            conn.execute(
                sql.SQL(
                    "CREATE TABLE e2e.{} (order_id bigint PRIMARY KEY, order_date date NOT NULL, "
                    "customer text NOT NULL, amount numeric(12,2) NOT NULL CHECK (amount >= 0))"
                ).format(sql.Identifier(table))
            )
            conn.execute(
                sql.SQL("CREATE INDEX ON e2e.{} (order_date)").format(sql.Identifier(table))
            )


def reset_summary(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE e2e.orders_summary")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(AUDIT)))


def break_row(dsn: str, day_offset: int) -> int:
    """Give one source row of 2023-01-01 + day_offset a negative amount (breaks the targets'
    CHECK); returns its order_id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "UPDATE e2e.orders_src SET amount = -73.19 WHERE order_id = (SELECT min(order_id) FROM "
            "e2e.orders_src WHERE order_date = date '2023-01-01' + %s) RETURNING order_id",
            (day_offset,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def repair_row(dsn: str, order_id: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE e2e.orders_src SET amount = 0 WHERE order_id = %s", (order_id,))


def fingerprint(dsn: str, table: str) -> tuple[int, int]:
    """Row count and an order-independent checksum (sum of 60-bit md5 prefixes of each row)."""
    query = sql.SQL(
        "SELECT count(*), coalesce(sum(('x' || substr(md5(concat_ws('|', order_id, order_date, "
        "customer, amount)), 1, 15))::bit(60)::bigint), 0) FROM e2e.{}"
    ).format(sql.Identifier(table))
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def transitions(dsn: str, run_key: str) -> dict[int, list[tuple[int, str, int]]]:
    """chunk index -> [(transition, state, attempt)] of one campaign."""
    out: dict[int, list[tuple[int, str, int]]] = {}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT chunk_index, transition, state, attempt FROM {}.chunk_transition "
                "WHERE run_key = %s ORDER BY chunk_index, transition"
            ).format(sql.Identifier(AUDIT)),
            (run_key,),
        ).fetchall()
    for index, transition, state, attempt in rows:
        out.setdefault(int(index), []).append((int(transition), str(state), int(attempt)))
    return out


# --- Airflow -------------------------------------------------------------------------------------


def airflow_python(version: str) -> str:
    """The cached venv's python for ``version`` (built by scripts/airflow_envs.py if missing)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "airflow_envs.py"), "--versions", version, *PATHS],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"no Airflow {version} venv:\n{result.stderr[-4000:]}")
    paths: dict[str, str] = json.loads(result.stdout)
    return paths[version]


def harness(python: str, env: dict[str, str], *args: str, timeout: int = 1800) -> dict[str, Any]:
    """Run the harness in the Airflow venv with ``env`` added (DPONE_CONN_E2E, evidence dir)."""
    with tempfile.TemporaryDirectory(prefix="dpone-e2e-facts-") as tmp:
        out = os.path.join(tmp, "facts.json")
        clean = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DPONE_"))
        }
        result = subprocess.run(
            [python, str(HARNESS), *args, "--out", out],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**clean, **env},
            cwd=tmp,
        )
        if result.returncode != 0 or not os.path.exists(out):
            raise AssertionError(
                f"harness {' '.join(args)} failed ({result.returncode}):\n"
                f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-6000:]}"
            )
        with open(out, encoding="utf-8") as fh:
            facts: dict[str, Any] = json.load(fh)
        facts["_log_tail"] = (result.stdout + result.stderr)[-3000:]
        return facts
