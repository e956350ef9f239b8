"""Restating a range for real: the `dpone` executable, mapped items passed the way the generated
DAG passes them, a real Postgres source, sink and ledger, real processes racing.

- verify finds chunks whose source was corrected after they moved; `ledger restate` marks them;
  `ledger status` names them and the Airflow command; their items run again; verify matches, and
  only the restated chunks moved (every other target row is the same row version);
- a pod holding a chunk's lease (a real process, stopped right after its lease) makes a
  restatement of that chunk refused; resumed, it commits once; restated after, it moves once more;
- append is refused; a dry run changes nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone.packing.pack import ProcessPlan, load_and_compile
from dpone.packing.verify import expected_identity

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders_history:
    manifest: orders.yaml
    airflow:
      image: registry.example.com/dpone-runtime:0.1.0
      mapping: {{mode: {mode}, max_items: {items}, max_active: 2, pool: dpone_backfill}}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: warehouse, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: warehouse
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2024-01-01, end: 2024-01-13}}
      inner_mode: {inner}
      lease_seconds: 600
    state: {{backend: audit_schema, connection: warehouse, schema: {s}_audit, require_distributed_lock: true}}
"""
LEDGER = ("--catalog", "workloads.yaml", "--workload", "orders_history")


class Project:
    def __init__(self, root: Path, dsn: str, schema: str) -> None:
        self.root, self.dsn, self.schema = root, dsn, schema

    def write(self, mode: str = "summary", inner: str = "replace") -> ProcessPlan:
        catalog = CATALOG.format(mode=mode, items=12 if mode == "visible" else 4)
        (self.root / "workloads.yaml").write_text(catalog, encoding="utf-8")
        manifest = MANIFEST.format(s=self.schema, inner=inner)
        (self.root / "orders.yaml").write_text(manifest, encoding="utf-8")
        _, packs, problems = load_and_compile(str(self.root / "workloads.yaml"))
        assert not problems, problems
        self.identity = expected_identity(packs[0], "orders").env_value()
        return packs[0].processes[0]

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
        env.update(DPONE_CONN_WAREHOUSE=self.dsn, DPONE_XCOM_PATH=str(self.root / "xcom.json"))
        env.update(extra or {})
        return env

    def dpone(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(DPONE), *args],
            cwd=self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    def item_command(self, plan: ProcessPlan, index: int) -> tuple[list[str], dict[str, str]]:
        assert plan.mapping_plan is not None
        item = plan.mapping_plan.item_env_value(plan.mapping_plan.items[index])
        command = [str(DPONE), "run", *LEDGER, "--process", "orders", "--no-progress"]
        extra = {"DPONE_AIRFLOW_MAPPING_ITEM": item, "DPONE_AIRFLOW_RUN_IDENTITY": self.identity}
        return command, self.env(extra)

    def run_item(self, plan: ProcessPlan, index: int) -> subprocess.CompletedProcess[str]:
        command, env = self.item_command(plan, index)
        return subprocess.run(
            command,
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return list(conn.execute(sql).fetchall())

    def transitions(self, chunk: int) -> list[tuple[Any, ...]]:
        return self.query(
            f"SELECT transition, state, attempt, lease_owner FROM {self.schema}_audit."
            f"chunk_transition WHERE chunk_index = {chunk} ORDER BY transition"
        )


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[Project]:
    schema = "rs_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, "
                f"order_date date NOT NULL, amount integer NOT NULL)"
            )
        conn.execute(f"CREATE INDEX ON {schema}.orders (order_date)")
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2024-01-01' + (g % 12), g % 100 "
            f"FROM generate_series(1, 1200) g"
        )
    yield Project(tmp_path, pg_dsn, schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def test_verify_restate_run_verify(project: Project) -> None:
    s = project.schema
    plan = project.write("summary")
    assert plan.mapping_plan is not None and plan.mapping_plan.items_total == 4  # 3 chunks each
    for index in range(4):
        assert project.run_item(plan, index).returncode == 0
    assert project.dpone("verify", *LEDGER).returncode == 0
    before = dict(project.query(f"SELECT order_id, xmin::text FROM {s}.orders"))
    ledger_before = project.query(f"SELECT * FROM {s}_audit.chunk_transition ORDER BY seq")

    # The source is corrected after the move: chunks 4 (2024-01-04) and 5 (2024-01-05).
    with psycopg.connect(project.dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {s}.raw_orders SET amount = amount + 1 WHERE order_date IN "
            "('2024-01-04', '2024-01-05')"
        )
        conn.execute(f"DELETE FROM {s}.raw_orders WHERE order_id = 4")  # 2024-01-05
    found = project.dpone("verify", *LEDGER)
    assert found.returncode == 1
    assert "chunk 4 [2024-01-04" in found.stdout and "chunk 5 [2024-01-05" in found.stdout
    hint = found.stdout.strip().splitlines()[-1].strip()
    assert hint == (
        "dpone ledger restate --catalog workloads.yaml --workload orders_history --process "
        "orders --chunks 4-5 --reason 'verify: source and target differ'"
    )
    report = json.loads(project.dpone("verify", *LEDGER, "--format", "json").stdout)
    assert report["restate"] == {"chunks": "4-5", "command": hint}

    dry = project.dpone(
        "ledger", "restate", *LEDGER, "--chunks", "4-5", "--reason", "x", "--dry-run"
    )
    assert dry.returncode == 0, dry.stderr
    assert "would restate 2 chunk(s)" in dry.stdout
    assert project.query(f"SELECT * FROM {s}_audit.chunk_transition ORDER BY seq") == ledger_before

    by_time = project.dpone(
        "ledger", "restate", *LEDGER, "--from", "2024-01-04", "--to", "2024-01-06",
        "--reason", "x", "--dry-run", "--format", "json",
    )  # fmt: skip
    assert json.loads(by_time.stdout)["restated"] == [4, 5], "the same chunks by the column"
    # The runbook's second command is the one verify printed, as it is.
    done = project.dpone(*shlex.split(hint)[1:], "--by", "ana", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["restated"] == [4, 5] and report["requested_by"] == "ana"

    status = json.loads(project.dpone("ledger", "status", *LEDGER, "--format", "json").stdout)
    assert status["counts"]["committed"] == 10 and status["counts"]["pending"] == 2
    assert [(r["chunk_index"], r["moved_again"]) for r in status["restated"]] == [
        (4, False),
        (5, False),
    ]
    assert status["restated"][0]["reason"] == "verify: source and target differ"
    clear = status["airflow_clear"]
    assert clear["restated_map_indexes"] == [1]  # item 1 holds chunks 4-6
    assert "--only-failed" not in clear["command"]
    text = project.dpone("ledger", "status", *LEDGER).stdout
    assert "restated: chunk 4" in text and "to move again" in text
    assert "map indexes holding restated chunks 1" in text and clear["command"] in text

    # Airflow clears the task; every item runs again, only the restated chunks move.
    runs = [project.run_item(plan, index) for index in range(4)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert project.dpone("verify", *LEDGER).returncode == 0
    source = project.query(f"SELECT * FROM {s}.raw_orders ORDER BY order_id")
    assert project.query(f"SELECT * FROM {s}.orders ORDER BY order_id") == source
    after = dict(project.query(f"SELECT order_id, xmin::text FROM {s}.orders"))
    untouched = {k: v for k, v in before.items() if k % 12 not in (3, 4)}  # days 4 and 5
    assert {k: after[k] for k in untouched} == untouched
    moved = project.query(
        f"SELECT DISTINCT chunk_index FROM {s}_audit.chunk_transition WHERE seq > "
        f"{max(row[0] for row in ledger_before)}"
    )
    assert sorted(row[0] for row in moved) == [4, 5]
    assert [t[1] for t in project.transitions(4)] == [
        "running", "committed", "pending", "running", "committed",
    ]  # fmt: skip
    status = json.loads(project.dpone("ledger", "status", *LEDGER, "--format", "json").stdout)
    assert status["airflow_clear"] is None and status["restated"][0]["moved_again"] is True


def _wait_for_lease(project: Project, chunk: int, deadline_s: float = 60.0) -> None:
    """A committed RUNNING record, or (ledger in the sink's database, ADR 0021) the chunk's
    lock held by the one-commit transaction that moves it."""
    from dpone.ledger.postgres import PostgresLedger

    store = PostgresLedger(project.dsn, f"{project.schema}_audit", create=False)
    try:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            states = [t[1] for t in project.transitions(chunk)]
            if states and states[-1] == "running":
                return
            if any(chunk in store.chunk_lock_holders(k) for k in store.list_campaigns()):
                return
            time.sleep(0.1)
    finally:
        store.close()
    raise AssertionError(f"chunk {chunk} was never leased")


def test_restate_races_a_live_pod_on_the_same_chunk(project: Project) -> None:
    """A real pod process, stopped right after its lease of chunk 3 (the moment it starts
    moving data, inside the chunk's one transaction: the chunk lock is held): a dry run lists
    chunk 3 as leased now, and restating it is refused at once (it used to wait for the pod's
    transaction), nothing written; the pod resumes and commits once; restated then, the chunk
    moves exactly once more."""
    s = project.schema
    plan = project.write("visible")  # one chunk per item: item 2 is chunk 3
    for index in range(12):
        if index != 2:
            assert project.run_item(plan, index).returncode == 0
    command, env = project.item_command(plan, 2)
    env["DPONE_TEST_FAULT"] = "chunk_leased:1:stop"
    pod = subprocess.Popen(command, cwd=project.root, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_lease(project, 3)
        time.sleep(0.3)  # the pod stops itself right after the lease committed
        dry = project.dpone(
            "ledger",
            "restate",
            *LEDGER,
            "--chunks",
            "2-4",
            "--reason",
            "r",
            "--dry-run",
            "--format",
            "json",
        )
        assert dry.returncode == 0, dry.stderr
        would = json.loads(dry.stdout)
        assert (would["restated"], would["leased_now"]) == ([2, 4], [3])
        started = time.monotonic()
        refused = project.dpone("ledger", "restate", *LEDGER, "--chunks", "2-4", "--reason", "r")
        assert time.monotonic() - started < 5, "refused at once, not after a lock wait"
        assert refused.returncode == 4, refused.stderr
        error = json.loads(refused.stderr.strip().splitlines()[-1])
        assert error["code"] == "DPONE_BACKFILL_CHUNK_BUSY" and "chunk 3" in error["message"]
        assert project.query(f"SELECT count(*) FROM {s}_audit.chunk_restatement") == [(0,)]
        assert [t[1] for t in project.transitions(2)] == ["running", "committed"]
    finally:
        os.kill(pod.pid, signal.SIGCONT)
        _, stderr = pod.communicate(timeout=120)
    assert pod.returncode == 0, stderr
    assert [t[1] for t in project.transitions(3)] == ["running", "committed"], "committed once"

    done = project.dpone("ledger", "restate", *LEDGER, "--chunks", "3", "--reason", "again")
    assert done.returncode == 0, done.stderr
    # Two pods of the cleared item start at once: one moves the chunk, the other finds it
    # leased or committed; never two commits of one restatement.
    first, second = (project.item_command(plan, 2) for _ in range(2))
    pods = [
        subprocess.Popen(c, cwd=project.root, env=e, stderr=subprocess.PIPE, text=True)
        for c, e in (first, second)
    ]
    codes = [p.wait(timeout=120) for p in pods]
    assert 0 in codes and set(codes) <= {0, 4}, codes
    states = [t[1] for t in project.transitions(3)]
    assert states[:3] == ["running", "committed", "pending"]
    assert states[3:].count("committed") == 1 and states[-1] == "committed"
    numbers = [t[0] for t in project.transitions(3)]
    assert numbers == list(range(1, len(numbers) + 1)), "the fence: no gap, no duplicate"
    source = project.query(f"SELECT * FROM {s}.raw_orders ORDER BY order_id")
    assert project.query(f"SELECT * FROM {s}.orders ORDER BY order_id") == source
    assert project.dpone("verify", *LEDGER).returncode == 0


def test_a_chunk_restated_while_its_item_runs_is_moved_not_reported_committed(
    project: Project,
) -> None:
    """Regression: a run took "already committed" from its first ledger read, so a chunk
    restated while the run moved another was reported committed, the run said passed and the
    chunk stayed pending. The item now reads its chunks again before it ends and moves it."""
    s = project.schema
    plan = project.write("summary")  # item 0: chunks 1-3
    for index in range(4):
        assert project.run_item(plan, index).returncode == 0
    first = project.dpone("ledger", "restate", *LEDGER, "--chunks", "1", "--reason", "fix 1")
    assert first.returncode == 0, first.stderr
    command, env = project.item_command(plan, 0)
    env["DPONE_TEST_FAULT"] = "chunk_leased:1:stop"  # holds chunk 1, has skipped chunks 2 and 3
    pod = subprocess.Popen(command, cwd=project.root, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_lease(project, 1)
        time.sleep(0.3)
        meanwhile = project.dpone("ledger", "restate", *LEDGER, "--chunks", "3", "--reason", "x")
        assert meanwhile.returncode == 0, meanwhile.stderr
    finally:
        deadline = time.monotonic() + 120
        while pod.poll() is None and time.monotonic() < deadline:
            os.kill(pod.pid, signal.SIGCONT)  # the fault stops the pod at each of its leases
            time.sleep(0.2)
        _, stderr = pod.communicate(timeout=10)
    assert pod.returncode == 0, stderr
    assert "passed — 2 committed, 1 already committed" in stderr
    result = json.loads((project.root / "xcom.json").read_text(encoding="utf-8"))
    counts = result["backfill"]
    assert (counts["chunks_committed"], counts["chunks_skipped_resume"]) == (2, 1)
    assert [t[1] for t in project.transitions(3)] == [
        "running", "committed", "pending", "running", "committed"
    ]  # fmt: skip
    status = json.loads(project.dpone("ledger", "status", *LEDGER, "--format", "json").stdout)
    assert status["counts"]["committed"] == 12
    source = project.query(f"SELECT * FROM {s}.raw_orders ORDER BY order_id")
    assert project.query(f"SELECT * FROM {s}.orders ORDER BY order_id") == source


def test_restate_refuses_append_and_unknown_campaigns(project: Project) -> None:
    project.write("summary", inner="append")
    refused = project.dpone("ledger", "restate", *LEDGER, "--chunks", "1", "--reason", "r")
    assert refused.returncode == 3
    error = json.loads(refused.stderr.strip().splitlines()[-1])
    assert error["code"] == "DPONE_LEDGER_RESTATE_REFUSED" and "duplicate" in error["message"]

    project.write("summary")
    never = project.dpone("ledger", "restate", *LEDGER, "--chunks", "1", "--reason", "r")
    assert never.returncode == 2 and "nothing ran" in never.stderr
    both = project.dpone(
        "ledger", "restate", *LEDGER, "--chunks", "1", "--from", "2024-01-01", "--reason", "r"
    )
    assert both.returncode == 2
    outside = project.dpone(
        "ledger", "restate", *LEDGER, "--from", "2025-01-01", "--to", "2025-02-01", "--reason", "r"
    )
    assert outside.returncode == 2 and "no chunk" in outside.stderr


def test_a_secret_typed_into_the_reason_is_printed_redacted(project: Project) -> None:
    """The reason and --by are stored redacted; what restate prints is what was stored."""
    s = project.schema
    password = "Pw/" + uuid.uuid4().hex[:8] + "@x:y%"
    encoded = password.replace("%", "%25").replace("/", "%2F").replace("@", "%40")
    host = project.dsn.split("://", 1)[1].split("@", 1)[1]  # trust auth ignores the password
    project.dsn = f"postgresql://postgres:{encoded}@{host}"
    plan = project.write("internal")
    assert plan.run_key is not None
    assert project.dpone("run", *LEDGER, "--no-progress").returncode == 0
    reason = f"see {project.dsn} and {encoded}"
    for extra in (["--dry-run"], ["--dry-run", "--format", "json"], ["--format", "json"], []):
        done = project.dpone(
            "ledger", "restate", *LEDGER, "--chunks", "2", "--reason", reason, "--by", password,
            *extra,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        for secret in (password, encoded, project.dsn):
            assert secret not in done.stdout + done.stderr, extra
        if "json" in extra:
            report = json.loads(done.stdout)
            assert report["reason"] == "see *** and ***" and report["requested_by"] == "***"
        else:
            assert "reason: see *** and *** (by ***)" in done.stdout
    stored = project.query(f"SELECT reason, requested_by FROM {s}_audit.chunk_restatement")
    assert stored and all(row == ("see *** and ***", "***") for row in stored)


@pytest.mark.parametrize("ledger", ["sink_database", "local_file"])
def test_a_row_the_source_moved_to_an_earlier_chunk_is_repaired_by_one_run(
    project: Project, ledger: str
) -> None:
    """Regression: the runbook's repair (verify, restate, run, verify) failed its run when the
    source moved a row to an earlier chunk: that chunk's insert met the row's key, still held by
    the later chunk's old rows (UniqueViolation), until a second run. A chunk whose write meets
    a key the target holds is moved again after the run's other chunks, in the same run; its
    first attempt stays in the history as failed. Both placements: one transaction a chunk
    (ledger in the sink's database) and the fenced write (a local-file ledger)."""
    s = project.schema
    project.write("internal")
    if ledger == "local_file":
        manifest = project.root / "orders.yaml"
        text = manifest.read_text(encoding="utf-8")
        start = text.index("    state:")
        manifest.write_text(
            text[:start] + "    state: {backend: local_file, path: ledger.json}\n",
            encoding="utf-8",
        )
    run = project.dpone("run", *LEDGER, "--no-progress")
    assert run.returncode == 0, run.stderr
    # order 11 moves from 2024-01-12 (chunk 12) to 2024-01-03 (chunk 3)
    with psycopg.connect(project.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {s}.raw_orders SET order_date = '2024-01-03' WHERE order_id = 11")
    found = project.dpone("verify", *LEDGER, "--no-progress")
    assert found.returncode == 1 and "--chunks 3,12 " in found.stdout, found.stdout
    hint = found.stdout.strip().splitlines()[-1].strip()
    restated = project.dpone(*shlex.split(hint)[1:])
    assert restated.returncode == 0, restated.stderr
    repaired = project.dpone("run", *LEDGER, "--no-progress")
    assert repaired.returncode == 0, repaired.stderr
    assert "passed — 2 committed, 10 already committed, 0 failed" in repaired.stderr
    assert project.dpone("verify", *LEDGER, "--no-progress").returncode == 0
    source = project.query(f"SELECT * FROM {s}.raw_orders ORDER BY order_id")
    assert project.query(f"SELECT * FROM {s}.orders ORDER BY order_id") == source
    if ledger == "sink_database":  # the deferred attempt is history: failed, then committed
        states = [t[1] for t in project.transitions(3)]
        assert states[-4:] == ["running", "failed", "running", "committed"], states


def test_a_key_no_other_chunk_gives_back_fails_its_chunk_after_one_more_attempt(
    project: Project,
) -> None:
    """A target row outside the window holds a key the chunk inserts: the chunk is moved again
    once after the others, fails again, and the run reports it failed (exit 1, the sink's
    error), with both attempts in its history; every other chunk commits."""
    s = project.schema
    project.write("internal")
    with psycopg.connect(project.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {s}.orders VALUES (11, '2023-12-31', 0)")  # order 11: chunk 12
    run = project.dpone("run", *LEDGER, "--no-progress")
    assert run.returncode == 1, run.stderr
    assert "11 committed, 0 already committed, 1 failed" in run.stderr, run.stderr
    last = json.loads(run.stderr.strip().splitlines()[-1])
    assert last["code"] == "DPONE_SINK_FAILED" and "UniqueViolation" in last["message"], last
    states = [t[1] for t in project.transitions(12)]
    assert states == ["running", "failed", "running", "failed"], states


def test_a_mapped_item_moves_a_key_conflict_again_after_its_other_chunks(
    project: Project,
) -> None:
    """The same repair within one mapped item (chunks 4-6): the row moves from chunk 6 to chunk
    4, whose write meets the key chunk 6 still holds. The item does not stop there: it moves
    chunk 6, then chunk 4 again, and passes."""
    s = project.schema
    plan = project.write("summary")
    assert all(project.run_item(plan, index).returncode == 0 for index in range(4))
    # order 5 moves from 2024-01-06 (chunk 6) to 2024-01-04 (chunk 4): both in item 1
    with psycopg.connect(project.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {s}.raw_orders SET order_date = '2024-01-04' WHERE order_id = 5")
    restated = project.dpone(
        "ledger", "restate", *LEDGER, "--chunks", "4,6", "--reason", "order 5 moved"
    )
    assert restated.returncode == 0, restated.stderr
    item = project.run_item(plan, 1)
    assert item.returncode == 0, item.stderr
    assert "passed — 2 committed, 1 already committed, 0 failed" in item.stderr, item.stderr
    source = project.query(f"SELECT * FROM {s}.raw_orders ORDER BY order_id")
    assert project.query(f"SELECT * FROM {s}.orders ORDER BY order_id") == source
    states = [t[1] for t in project.transitions(4)]
    assert states[-4:] == ["running", "failed", "running", "committed"], states
