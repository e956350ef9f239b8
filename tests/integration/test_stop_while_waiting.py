"""SIGTERM is acted on while a run waits, not only while a chunk moves; and a chunk's wait for a
row another session locked ends at DPONE_FENCE_LOCK_TIMEOUT as a busy (retryable) chunk.

A run that waits for the campaign lock (another process holds it), for a table another session
has locked (the preflight's catalog read), or for the local ledger's file lock exits 143 within
seconds with its result written, instead of when the wait's own timeout ends (the kubelet's
SIGKILL would come first). A stop that keeps a later process of the workload from starting
says so in the result file as well as in the exit code. The real `dpone` executable, the real
Postgres.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone import errors

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"
#: how soon a stopped run must be gone: well inside Kubernetes' 30 s grace period
STOP_BOUND_S = 5.0

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
"""
PROCESS = """\
  - name: {name}
    source: {{connection: wh, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: {target}}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2024-01-01, end: 2024-01-04}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit}}
"""


@pytest.fixture
def project(pg_dsn: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    schema = "sw_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("raw_orders", "orders", "orders2"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, "
                "order_date date NOT NULL, note text NOT NULL)"
            )
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2024-01-01' + (g % 3), 'n' || g "
            "FROM generate_series(1, 30) g"
        )
    processes = [PROCESS.format(name="orders", s=schema, target="orders")]
    processes.append(PROCESS.format(name="orders2", s=schema, target="orders2"))
    (tmp_path / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    manifest = "schema: dpone.pipeline.v1\nprocesses:\n" + "".join(processes)
    (tmp_path / "orders.yaml").write_text(manifest, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OPENLINEAGE"))}
    env.update(DPONE_CONN_WH=pg_dsn, DPONE_XCOM_PATH=str(tmp_path / "result.json"))
    yield {"root": tmp_path, "schema": schema, "env": env}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def _start(root: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    argv = [str(DPONE), "run", "--no-progress", "--catalog", "workloads.yaml"]
    return subprocess.Popen(
        [*argv, "--workload", "orders", *extra],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stopped_within_bound(
    run: subprocess.Popen[str], root: Path, signalled: bool = False
) -> dict[str, Any]:
    """SIGTERM ``run`` (``signalled``: it has been already; a second signal would end it at once,
    before its result); it must exit 143 within the bound, its result saying it was stopped."""
    asked = time.monotonic()
    if not signalled:
        run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    took = time.monotonic() - asked
    assert run.returncode == 128 + signal.SIGTERM, err
    assert took < STOP_BOUND_S, f"exited {took:.1f} s after SIGTERM: {err}"
    result: dict[str, Any] = json.loads((root / "result.json").read_text(encoding="utf-8"))
    assert result["status"] == "failed", result
    assert result["error"]["code"] == errors.RUN_INTERRUPTED, result
    assert result["error"]["retryable"] is True
    return result


def _waiting(pg_dsn: str, query: str) -> None:
    """Until a session of the run waits on a lock in ``query``'s form."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s",
                (query,),
            ).fetchone()
        if found and found[0]:
            return
        time.sleep(0.1)
    raise AssertionError(f"no session waits on {query!r}")


def test_a_stop_while_waiting_for_the_campaign_lock(project: dict[str, Any], pg_dsn: str) -> None:
    root, env = project["root"], project["env"]
    holder = _start(root, {**env, "DPONE_TEST_FAULT": "campaign_locked:1:stop"})
    try:
        _waiting_for_stop(holder)
        waiter = _start(root, env, "--process", "orders", "--lock-timeout", "40")
        time.sleep(1.5)
        assert waiter.poll() is None, waiter.communicate()
        _stopped_within_bound(waiter, root)
    finally:
        holder.kill()
        holder.communicate(timeout=30)


def _waiting_for_stop(run: subprocess.Popen[str]) -> None:
    """Until ``run`` stopped itself (SIGSTOP at its fault point)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = Path(f"/proc/{run.pid}/stat").read_text().split(")")[-1].split()[0]
        if state == "T":
            return
        time.sleep(0.05)
    raise AssertionError("the lock holder never stopped at its fault point")


def test_a_stop_while_the_preflight_waits_for_a_locked_table(
    project: dict[str, Any], pg_dsn: str
) -> None:
    root, env, schema = project["root"], project["env"], project["schema"]
    with psycopg.connect(pg_dsn) as locker:  # another session holds the target's lock
        locker.execute(f"LOCK TABLE {schema}.orders IN ACCESS EXCLUSIVE MODE")
        run = _start(root, env, "--process", "orders")
        _waiting(pg_dsn, f"%{schema}%orders%")
        _stopped_within_bound(run, root)
        locker.rollback()


def test_a_stop_while_waiting_for_the_local_ledger_lock(tmp_path: Path) -> None:
    golden = ROOT / "golden" / "internal_default"
    for name in ("workloads.yaml", "orders_history.yaml"):
        shutil.copy(golden / name, tmp_path / name)
    seed = [sys.executable, str(ROOT / "scripts" / "demo_seed.py"), ".dpone-demo/demo.db"]
    subprocess.run(seed, cwd=tmp_path, check=True, capture_output=True, timeout=60)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OPENLINEAGE"))}
    env.update(
        DPONE_CONN_DEMO="sqlite:///.dpone-demo/demo.db",
        DPONE_XCOM_PATH=str(tmp_path / "result.json"),
    )
    lock = tmp_path / ".dpone-demo" / "ledger.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process's read-decide-append, frozen
        argv = [str(DPONE), "run", "--no-progress", "--catalog", "workloads.yaml"]
        run = subprocess.Popen(
            [*argv, "--workload", "orders_history", "--lock-timeout", "40"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)
        assert run.poll() is None, run.communicate()
        _stopped_within_bound(run, tmp_path)


def test_a_stop_that_keeps_the_next_process_from_starting_is_in_the_result(
    project: dict[str, Any],
) -> None:
    """The first process passes and its result is written; the stop comes before the second
    process starts (the run is held there, frozen, by a test fault): the second process never
    starts, and the result file says the run was interrupted, as its exit code does (not the
    first process's 'passed')."""
    root, env = project["root"], project["env"]
    run = _start(root, {**env, "DPONE_TEST_FAULT": "result_written:1:stop"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the run has frozen itself after the first result
        with open(f"/proc/{run.pid}/stat", encoding="ascii") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                break
        time.sleep(0.05)
    else:
        raise AssertionError(run.communicate())
    first = json.loads((root / "result.json").read_text(encoding="utf-8"))
    assert (first["process"], first["status"]) == ("orders", "passed"), first
    run.send_signal(signal.SIGTERM)  # taken when the run goes on
    run.send_signal(signal.SIGCONT)
    stopped = _stopped_within_bound(run, root, signalled=True)
    assert stopped["process"] == "orders2", stopped
    assert "orders2 and any later process not started" in stopped["error"]["message"]


def test_a_stopped_full_refresh_counts_as_interrupted(project: dict[str, Any], pg_dsn: str) -> None:
    """A full refresh waiting for its table lock (another session's open insert) when the stop
    comes: rolled back, and its result counts it interrupted, not failed."""
    root, env, schema = project["root"], project["env"], project["schema"]
    manifest = (
        "schema: dpone.pipeline.v1\nprocesses:\n  - name: orders\n"
        f"    source: {{connection: wh, table: {{schema: {schema}, name: raw_orders}}}}\n"
        f"    sink: {{connection: wh, table: {{schema: {schema}, name: orders}}, "
        "strategy: {mode: full_refresh}}\n"
    )
    (root / "orders.yaml").write_text(manifest, encoding="utf-8")
    with psycopg.connect(pg_dsn) as writer:  # holds ROW EXCLUSIVE: the refresh's lock waits
        writer.execute(f"INSERT INTO {schema}.orders VALUES (99, '2024-01-01', 'open')")
        run = _start(root, env)
        _waiting(pg_dsn, f"LOCK TABLE%{schema}%orders%")
        result = _stopped_within_bound(run, root)
        writer.rollback()
    counts = result["backfill"]
    assert (counts["chunks_interrupted"], counts["chunks_failed"]) == (1, 0), counts


@pytest.mark.parametrize("placement", ["ledger-in-the-sink", "split"])
def test_a_row_lock_held_past_the_fence_timeout_leaves_the_chunk_busy_and_retryable(
    project: dict[str, Any], pg_dsn: str, placement: str
) -> None:
    """Another session holds a row of the first chunk's range: the chunk's delete waits at most
    DPONE_FENCE_LOCK_TIMEOUT, then the chunk is busy (retryable, not a failure Airflow gives up
    on), whichever transaction the write shares; once the lock is gone the chunk moves."""
    root, env, schema = project["root"], project["env"], project["schema"]
    if placement == "split":  # the ledger apart from the sink: the write claims the fence row
        manifest = (root / "orders.yaml").read_text(encoding="utf-8")
        manifest = manifest.replace(
            f"state: {{backend: audit_schema, connection: wh, schema: {schema}_audit}}",
            "state: {backend: local_file, path: ledger}",
        )
        (root / "orders.yaml").write_text(manifest, encoding="utf-8")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {schema}.orders VALUES (1000, '2024-01-01', 'stale')")
    with psycopg.connect(pg_dsn) as locker:
        locker.execute(f"SELECT 1 FROM {schema}.orders WHERE order_id = 1000 FOR UPDATE")
        started = time.monotonic()
        run = _start(root, {**env, "DPONE_FENCE_LOCK_TIMEOUT": "1"}, "--process", "orders")
        _, err = run.communicate(timeout=60)
        took = time.monotonic() - started
        locker.rollback()
    assert run.returncode == 4, err  # retryable: Airflow tries the task again
    assert took < 20, f"the lock wait took {took:.1f} s: {err}"
    result = json.loads((root / "result.json").read_text(encoding="utf-8"))
    assert result["error"]["code"] == errors.CHUNK_BUSY and result["error"]["retryable"], result
    assert "DPONE_FENCE_LOCK_TIMEOUT" in result["error"]["message"]
    assert result["backfill"]["chunks_busy"] >= 1 and result["backfill"]["chunks_failed"] == 0
    again = _start(root, env, "--process", "orders")
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {schema}.orders").fetchone() == (30,)


def test_a_deadlock_with_another_session_leaves_the_chunk_busy_and_retryable(
    project: dict[str, Any], pg_dsn: str
) -> None:
    """The chunk's delete holds one stale row of its range and waits for another that a
    session holds; that session then asks for the first: the server rolls the chunk back
    (its deadlock check runs first), and the chunk is busy (retryable), not failed for good."""
    root, env, schema = project["root"], project["env"], project["schema"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {schema}.orders VALUES (1001, '2024-01-01', 'first')")
        conn.execute(f"INSERT INTO {schema}.orders VALUES (1002, '2024-01-01', 'second')")
    with psycopg.connect(pg_dsn) as other:
        other.execute(f"SELECT 1 FROM {schema}.orders WHERE order_id = 1002 FOR UPDATE")
        run = _start(root, env, "--process", "orders")
        _waiting(pg_dsn, f"%DELETE%{schema}%")
        other.execute("SET LOCAL deadlock_timeout = '30s'")  # the chunk's session checks first
        other.execute(f"SELECT 1 FROM {schema}.orders WHERE order_id = 1001 FOR UPDATE")
        _, err = run.communicate(timeout=60)
        other.rollback()
    assert run.returncode == 4, err
    result = json.loads((root / "result.json").read_text(encoding="utf-8"))
    assert result["error"]["code"] == errors.CHUNK_BUSY and result["error"]["retryable"], result
    assert "deadlock" in result["error"]["message"]
