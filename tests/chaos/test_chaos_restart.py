"""A Postgres restart (pg_ctlcluster restart) in the middle of a campaign.

The running `dpone run` processes must fail with a structured, retryable DPONE_CONNECTION_FAILED
line (exit 4, no traceback); a re-run completes the campaign with every invariant intact. Half
the items stall (SIGSTOP at ``chunk_written``) with their chunks' rows written and not committed,
so the restart always lands inside open transactions however fast the others finish; they are
resumed once the server is back.

The restart hits a private cluster (``dpone_restart``, created on first use with
``pg_createcluster --auth=trust`` on port DPONE_TEST_RESTART_PORT, default 5439), so other test
suites sharing the main server are not disconnected. It is stopped again afterwards.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import chaoskit
import psycopg
import pytest
from chaoskit import SAME

CLUSTER = "dpone_restart"
PORT = int(os.environ.get("DPONE_TEST_RESTART_PORT", "5439"))


def _version() -> str:
    root = Path("/etc/postgresql")
    versions = (
        sorted((p.name for p in root.iterdir() if p.is_dir()), key=float) if root.is_dir() else []
    )
    if not versions or not shutil.which("pg_ctlcluster"):
        pytest.fail(
            "the Postgres restart test needs pg_ctlcluster/pg_createcluster (postgresql-common) "
            "and a local Postgres installation; none found",
            pytrace=False,
        )
    return versions[-1]


def _ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _wait_ready(dsn: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture(scope="module")
def restart_cluster() -> Iterator[tuple[str, str]]:
    version = _version()
    # One test run at a time owns the private cluster (concurrent runs would restart it under
    # each other).
    lock = open("/tmp/dpone-restart-cluster.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not Path(f"/etc/postgresql/{version}/{CLUSTER}").is_dir():
        created = subprocess.run(
            ["pg_createcluster", version, CLUSTER, "-p", str(PORT), "--", "--auth=trust"],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert created.returncode == 0, created.stderr
    started = _ctl(version, CLUSTER, "start")
    assert started.returncode == 0 or "already running" in started.stderr, started.stderr
    base = f"host=127.0.0.1 port={PORT} user=postgres dbname=postgres"
    _wait_ready(base)
    try:
        yield version, base
    finally:
        _ctl(version, CLUSTER, "stop", "-m", "fast")
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _launch(
    env: dict[str, str], item: str, stderr_path: Path, stall: bool = False
) -> subprocess.Popen[bytes]:
    plan = chaoskit.plan_of(SAME.workload)
    argv = [str(chaoskit.DPONE), "run", "--catalog", str(chaoskit.CATALOG)]
    argv += ["--workload", SAME.workload, "--process", plan.name, "--no-progress"]
    fault = {"DPONE_TEST_FAULT": "chunk_written:1:stop"} if stall else {}
    with stderr_path.open("wb") as err:
        return subprocess.Popen(
            argv,
            env={**env, **chaoskit.item_env(SAME.workload, item), **fault},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _committed(dsn: str) -> int:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT count(*) FROM chaos_audit_same.chunk_transition WHERE state = 'committed'"
            ).fetchone()
            return int(row[0]) if row else 0
    except psycopg.Error:
        return 0


def _restart_while_stalled(
    version: str,
    base: str,
    data: str,
    procs: list[subprocess.Popen[bytes]],
    stalling: set[int],
) -> int:
    """Once six chunks have committed and every ``stalling`` item sits stopped inside its
    transaction, restart the cluster and resume the stalled items until they end. Returns the
    chunks committed before the restart."""
    deadline = time.monotonic() + 120
    while _committed(data) < 6 or not all(chaoskit.stopped(procs[i]) for i in stalling):
        assert time.monotonic() < deadline, "no progress before the restart"
        for i in stalling:
            assert procs[i].poll() is None, f"item {i} ended before its stall"
        time.sleep(0.1)
    committed_before = _committed(data)
    restarted = _ctl(version, CLUSTER, "restart", "-m", "fast")
    assert restarted.returncode == 0, restarted.stderr
    _wait_ready(base)
    deadline = time.monotonic() + 120
    for i in stalling:  # a group's chunk_written fires once per chunk: resume until it ends
        while procs[i].poll() is None:
            assert time.monotonic() < deadline, f"item {i} did not end once resumed"
            if chaoskit.stopped(procs[i]):
                os.kill(procs[i].pid, signal.SIGCONT)
            time.sleep(0.05)
    return committed_before


@pytest.mark.postgres
def test_postgres_restart_mid_run_fails_structured_and_rerun_completes(
    restart_cluster: tuple[str, str], tmp_path: Path
) -> None:
    version, base = restart_cluster
    data = chaoskit.ensure_database(base, chaoskit.DATA_DB)  # the private cluster's own
    chaoskit.seed(data, rows_per_day=2_500)
    chaoskit.reset_campaign(data, data, SAME)
    plan = chaoskit.plan_of(SAME.workload)
    assert plan.mapping_plan is not None
    items = [plan.mapping_plan.item_env_value(i) for i in plan.mapping_plan.items]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DPONE_")},
        "DPONE_CONN_CHAOS": chaoskit.as_url(data),
    }
    stalling = set(range(0, len(items), 2))
    procs = [
        _launch(env, item, tmp_path / f"first-{i}.err", stall=i in stalling)
        for i, item in enumerate(items)
    ]
    try:
        committed_before = _restart_while_stalled(version, base, data, procs, stalling)
    except BaseException:  # a failure must not leave stopped processes behind
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        raise
    codes: dict[str, int] = {}
    for index, proc in enumerate(procs):
        code = proc.wait(timeout=180)
        text = (tmp_path / f"first-{index}.err").read_text(errors="backslashreplace")
        assert "Traceback" not in text, text[-2000:]
        if code == 0:
            assert index not in stalling, f"item {index} committed across the restart: {text}"
            codes["0"] = codes.get("0", 0) + 1
            continue
        assert code == 4, f"item {index}: exit {code}: {text[-1500:]}"
        record = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
        assert record["schema"] == "dpone.error.v1" and record["retryable"] is True, record
        codes[record["code"]] = codes.get(record["code"], 0) + 1
        if index in stalling:  # its open transaction was cut by the restart
            assert record["code"] == "DPONE_CONNECTION_FAILED", record
    assert codes.get("DPONE_CONNECTION_FAILED", 0) >= len(stalling), codes
    assert set(codes) <= {"0", "DPONE_CONNECTION_FAILED"}, codes
    _wait_ready(data)
    # Re-run every unfinished item until the campaign completes (the crashed attempts' leases
    # expire after lease_seconds; until then an item reports DPONE_BACKFILL_CHUNK_BUSY, exit 4).
    pending = set(range(len(items)))
    rerun_codes: dict[int, int] = {}
    deadline = time.monotonic() + 120
    round_ = 0
    while pending:
        assert time.monotonic() < deadline, f"re-run did not complete: pending {pending}"
        round_ += 1
        running = {
            i: _launch(env, items[i], tmp_path / f"rerun-{round_}-{i}.err") for i in sorted(pending)
        }
        for i, proc in running.items():
            code = proc.wait(timeout=180)
            rerun_codes[code] = rerun_codes.get(code, 0) + 1
            text = (tmp_path / f"rerun-{round_}-{i}.err").read_text(errors="backslashreplace")
            assert "Traceback" not in text and code in (0, 4), f"exit {code}: {text[-1500:]}"
            if code == 0:
                pending.discard(i)
        if pending:
            time.sleep(random.uniform(0.5, 1.0))
    chaoskit.check_invariants(base, data, data, SAME)
    print(
        json.dumps(
            {
                "committed_before_restart": committed_before,
                "first_run_outcomes": codes,
                "rerun_rounds": round_,
                "rerun_exit_codes": rerun_codes,
            }
        )
    )
