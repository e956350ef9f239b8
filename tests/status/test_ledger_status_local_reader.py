"""`dpone ledger status` and `dpone ledger list --path` only read a local_file ledger.

Regressions: on a read-only ledger folder both exited 3 ("cannot create its files there"), and
while another process held the ledger's lock file both waited forever.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from dpone import errors
from dpone.ledger.localfile import LocalFileLedger
from dpone.ledger.port import CampaignShape, ChunkResult
from dpone.packing.pack import load_and_compile

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  payments_daily:
    manifest: payments.yaml
    airflow: {image: registry.example.com/dpone-runtime:0.1.0}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: payments
    source: {connection: warehouse, table: {schema: raw, name: payments}}
    sink:
      connection: warehouse
      table: {schema: analytics, name: payments}
      keys: [id]
      strategy: {mode: backfill}
    backfill:
      chunk: {column: paid_on, type: date, start: 2024-06-01, end: 2024-06-11}
      inner_mode: merge
    state: {backend: local_file, path: state/ledger.json}
"""
TORN = b'{"seq":999,"kind":"transi'
STATUS = ("ledger", "status", "--catalog", "workloads.yaml", "--workload", "payments_daily")
LIST = ("ledger", "list", "--path", "state/ledger.json", "--format", "json")
HOLD = """\
import fcntl, sys, time
handle = open(sys.argv[1], "a")
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A catalog whose local_file ledger has 3 committed chunks and a torn last journal line."""
    (tmp_path / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    (tmp_path / "payments.yaml").write_text(MANIFEST, encoding="utf-8")
    _, packs, problems = load_and_compile(str(tmp_path / "workloads.yaml"))
    assert not problems, problems
    pack, plan = packs[0], packs[0].processes[0]
    assert plan.run_key and plan.backfill_plan_hash
    shape = CampaignShape(
        plan.run_key,
        pack.workload.name,
        plan.name,
        plan.backfill_plan_hash,
        plan.config_hash,
        plan.chunks,
    )
    store = LocalFileLedger(tmp_path / "state" / "ledger.json")
    store.initialize(shape, "test-init", 10)
    for chunk in plan.chunks[:3]:
        outcome = store.acquire_lease(shape, chunk, "pod-a:1:aaa", 600)
        assert outcome.lease is not None
        store.complete(outcome.lease, chunk, ChunkResult(True, rows=10))
    store.close()
    with open(tmp_path / "state" / "ledger.json.journal", "ab") as journal:
        journal.write(TORN)  # a writer died mid-append: readers ignore it and leave it
    return tmp_path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env["DPONE_CONN_WAREHOUSE"] = "postgresql://nobody@127.0.0.1:9/none"
    return env


def _read_only_namespace(folder: Path) -> list[str]:
    """argv prefix that runs a command with ``folder`` bind-mounted read-only in a private mount
    namespace (root: a chmod is no obstacle to root, a read-only mount is)."""
    if shutil.which("unshare") is None:
        pytest.skip("a read-only ledger folder needs unshare(1) for a private mount namespace")
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
    ns = ["unshare", "--mount", *user, "sh", "-c", script, str(folder)]
    probe = subprocess.run(
        [*ns, "sh", "-c", 'touch "$0/.probe"', str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode == 0 or "Read-only" not in probe.stderr:
        pytest.skip(f"cannot mount a folder read-only in a namespace here: {probe.stderr[-200:]}")
    return ns


def _dpone(cwd: Path, args: Sequence[str], prefix: Sequence[str] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, str(DPONE), *args],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _done(process: subprocess.Popen[str], limit_s: float = 60) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"{process.args!r} still running after {limit_s}s")
    return process.returncode, out, err


def _last_error(stderr: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])
    return record


def _state(project: Path) -> list[tuple[str, bytes]]:
    return sorted((p.name, p.read_bytes()) for p in (project / "state").iterdir())


def test_status_and_list_read_a_read_only_ledger_folder(project: Path) -> None:
    ns = _read_only_namespace(project / "state")
    before = _state(project)
    code, out, err = _done(_dpone(project, (*STATUS, "--format", "json"), ns))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["exists"] and doc["counts"]["committed"] == 3
    code, out, err = _done(_dpone(project, LIST, ns))
    assert code == 0, err
    [campaign] = json.loads(out)["campaigns"]
    assert campaign["counts"]["committed"] == 3
    assert _state(project) == before


def test_status_and_list_create_no_lock_file_and_cut_no_torn_line(project: Path) -> None:
    (project / "state" / "ledger.json.lock").unlink()
    before = _state(project)
    for args in ((*STATUS, "--format", "json"), LIST):
        code, _, err = _done(_dpone(project, args))
        assert code == 0, err
    assert _state(project) == before


def test_status_and_list_give_up_on_a_held_lock_as_busy(project: Path) -> None:
    """Another process holding the lock (a stuck run): a bounded wait, then exit 4, retryable."""
    lock = project / "state" / "ledger.json.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        waiting = [_dpone(project, STATUS), _dpone(project, LIST)]
        results = [_done(p) for p in waiting]
        elapsed = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    for code, _, err in results:
        assert code == 4, err
        record = _last_error(err)
        assert record["code"] == errors.MAPPING_CAMPAIGN_BUSY and record["retryable"], err
        assert "ledger.json.lock" in record["message"]
    assert elapsed < 30
