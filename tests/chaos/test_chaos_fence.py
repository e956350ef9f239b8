"""Fenced writes under faults, with real `dpone run` processes and a real Postgres (issue 9).

The ledger lives in another database than the sink (the "split" placement, unless a test says
otherwise), so the chunk's data and its completion are two transactions. Each scenario freezes
(SIGSTOP) or stops (SIGTERM) a process at a named point and proves from the databases that a
stale attempt never keeps rows in the target, and that a stopped one releases its chunk at once:

* stalled inside its open sink transaction past the lease (replace into a table without a unique
  key, where an unfenced retry duplicated every row; merge, where the stale snapshot overwrote the
  retry's newer values): the retry waits on the chunk's fence row, the stale commit is replaced;
* stalled after its lease but before its sink transaction: the fence refuses it, rolled back;
* SIGTERM in the middle of a chunk's COPY: exit 143 within seconds, the chunk rolled back, its
  lease released (a retry takes it at once, no CHUNK_BUSY), result file and summary written;
* committed transitions deleted from the ledger: DPONE_LEDGER_CORRUPT, nothing moved again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chaoskit
import psycopg
import pytest
from dpone.packing.pack import load_and_compile
from dpone.packing.verify import expected_identity

pytestmark = pytest.mark.postgres

CATALOG = """\
schema: dpone.workload-catalog.v1
defaults:
  airflow:
    flavour: subprocess
workloads:
  fence:
    manifest: fence.yaml
    airflow:
      mapping: {{mode: visible, max_items: 10, max_active: 4, pool: dpone_fence}}
"""

MANIFEST = """\
schema: dpone.pipeline.v1
name: fence
processes:
  - name: copy
    source:
      connection: chaos
      query: "SELECT s.id, s.d, s.amount, s.note FROM chaos.src AS s CROSS JOIN (SELECT pg_sleep(coalesce((SELECT seconds FROM chaos.slow), 0))) AS z"
    sink:
      connection: chaos
      table: {{schema: chaos, name: {table}}}
      keys: [id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: d, type: date, start: 2023-01-01, end: 2023-01-05, step: 1, unit: day}}
      inner_mode: {inner}
      parallel_workers: 1
      lease_seconds: 5
      backfill_id: fence-{inner}
    state:
      backend: audit_schema
      connection: {ledger}
      schema: fence_audit
      require_distributed_lock: true
"""
DAY_ONE = "2023-01-01"


class FenceProject:
    """A visible campaign of 4 daily chunks (item i = chunk i + 1) over chaos.src."""

    def __init__(self, root: Path, data_dsn: str, ledger_dsn: str) -> None:
        self.root, self.data_dsn, self.ledger_dsn = root, data_dsn, ledger_dsn
        self.launches = 0

    def write(self, inner: str, table: str, ledger: str = "chaos_ledger") -> None:
        (self.root / "workloads.yaml").write_text(CATALOG.format(), encoding="utf-8")
        manifest = MANIFEST.format(inner=inner, table=table, ledger=ledger)
        (self.root / "fence.yaml").write_text(manifest, encoding="utf-8")
        _, packs, problems = load_and_compile(str(self.root / "workloads.yaml"))
        assert not problems, problems
        pack = packs[0]
        plan = pack.processes[0]
        assert plan.mapping_plan is not None
        self.items = [plan.mapping_plan.item_env_value(i) for i in plan.mapping_plan.items]
        self.identity = expected_identity(pack, plan.name).env_value()
        self.table = table
        self.audit_dsn = self.data_dsn if ledger == "chaos" else self.ledger_dsn

    def launch(
        self, item: int | None, prefix: tuple[str, ...] = (), **extra: str
    ) -> tuple[subprocess.Popen[bytes], Path]:
        self.launches += 1
        tag = f"run{self.launches}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
        env.update(
            DPONE_CONN_CHAOS=chaoskit.as_url(self.data_dsn),
            DPONE_CONN_CHAOS_LEDGER=chaoskit.as_url(self.ledger_dsn),
            DPONE_XCOM_PATH=str(self.root / f"{tag}.json"),
            PYTHONUNBUFFERED="1",
            **extra,
        )
        if item is not None:
            env["DPONE_AIRFLOW_MAPPING_ITEM"] = self.items[item]
            env["DPONE_AIRFLOW_RUN_IDENTITY"] = self.identity
        argv = [str(chaoskit.DPONE), "run", "--catalog", str(self.root / "workloads.yaml")]
        argv = [*prefix, *argv, "--workload", "fence", "--process", "copy", "--no-progress"]
        err = self.root / f"{tag}.err"
        with err.open("wb") as handle:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=handle)
        return proc, err

    def result(self, err: Path) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(err.with_suffix(".json").read_text())
        return doc

    def sql(self, dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def transitions(self, chunk: int) -> list[tuple[Any, ...]]:
        exists = self.sql(self.audit_dsn, "SELECT to_regclass('fence_audit.chunk_transition')")
        if exists[0][0] is None:
            return []
        return self.sql(
            self.audit_dsn,
            "SELECT transition, state, attempt, error_code FROM fence_audit.chunk_transition "
            "WHERE chunk_index = %s ORDER BY transition",
            (chunk,),
        )

    def leased(self, chunk: int) -> bool:
        """A committed RUNNING record (split placement), or the chunk's lock held by the
        one-commit transaction that moves it (ledger in the sink's database, ADR 0021)."""
        if any(t[1] == "running" for t in self.transitions(chunk)):
            return True
        if not self.transitions(chunk) and not self.sql(
            self.audit_dsn, "SELECT 1 FROM pg_namespace WHERE nspname = 'fence_audit'"
        ):
            return False
        from dpone.ledger.postgres import PostgresLedger

        store = PostgresLedger(self.audit_dsn, "fence_audit", create=False)
        try:
            return any(chunk in store.chunk_lock_holders(k) for k in store.list_campaigns())
        finally:
            store.close()

    def day(self, table: str, day: str = DAY_ONE) -> tuple[int, int, Any]:
        """(rows, distinct ids, sum of amounts) of one day of a table."""
        rows = self.sql(
            self.data_dsn,
            f"SELECT count(*), count(DISTINCT id), sum(amount) FROM chaos.{table} WHERE d = %s",
            (day,),
        )
        return int(rows[0][0]), int(rows[0][1]), rows[0][2]


@pytest.fixture
def fence(tmp_path: Path, pg_dsn: str) -> Iterator[FenceProject]:
    with (
        chaoskit.private_database(pg_dsn, "dpone_fence") as data_dsn,
        chaoskit.private_database(pg_dsn, "dpone_fence_ledger") as ledger_dsn,
    ):
        chaoskit.seed(data_dsn, rows_per_day=40, days=4)
        with psycopg.connect(data_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE chaos.slow (seconds float8 NOT NULL)")
            conn.execute("INSERT INTO chaos.slow VALUES (0)")
            conn.execute(
                "CREATE TABLE chaos.dst_merge (id bigint PRIMARY KEY, d date NOT NULL, "
                "amount numeric(12,2) NOT NULL, note text)"
            )
        yield FenceProject(tmp_path, data_dsn, ledger_dsn)


def wait_until(what: str, predicate: Any, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def last_error(err: Path) -> dict[str, Any]:
    for line in reversed(err.read_text().splitlines()):
        if line.startswith("{"):
            record: dict[str, Any] = json.loads(line)
            return record
    raise AssertionError(f"no dpone.error.v1 line in {err.read_text()[-600:]}")


@pytest.mark.parametrize(
    ("inner", "table"), [("replace", "dst_same"), ("merge", "dst_merge")], ids=["replace", "merge"]
)
def test_a_stall_inside_the_sink_transaction_never_keeps_stale_rows(
    fence: FenceProject, inner: str, table: str
) -> None:
    fence.write(inner, table)
    # A long idle timeout keeps the stalled session alive: what saves the chunk is the fence.
    stale, stale_err = fence.launch(
        0, DPONE_TEST_FAULT="sink_written:1:stop", DPONE_DB_IDLE_TIMEOUT="600"
    )
    try:
        wait_until(
            "the first attempt to stall in its sink transaction", lambda: chaoskit.stopped(stale)
        )
        time.sleep(5.5)  # past its 5 s lease
        # The source changes: a stale snapshot must not win over the retry's newer values.
        fence.sql(
            fence.data_dsn, "UPDATE chaos.src SET amount = amount + 1000 WHERE d = %s", (DAY_ONE,)
        )
        retry, retry_err = fence.launch(0, DPONE_FENCE_LOCK_TIMEOUT="120")
        wait_until(
            "the retry to take the lease as attempt 2",
            lambda: any(t[1] == "running" and t[2] == 2 for t in fence.transitions(1)),
        )
        time.sleep(1.5)
        assert retry.poll() is None, "the retry must wait on the chunk's fence row"
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    assert stale.wait(60) == 4
    refused = last_error(stale_err)
    assert refused["code"] == "DPONE_BACKFILL_CHUNK_LEASE_LOST"
    assert "the sink had committed this attempt's" in refused["message"]
    assert "nothing was written" not in refused["message"]
    assert retry.wait(60) == 0, retry_err.read_text()
    source, target = fence.day("src"), fence.day(table)
    assert (
        target == source
    )  # rows, distinct ids and the newer amounts: no duplicate, no stale value
    assert [t[1:3] for t in fence.transitions(1) if t[1] == "committed"] == [("committed", 2)]


def test_a_stall_before_the_sink_transaction_is_refused_by_the_fence(fence: FenceProject) -> None:
    fence.write("replace", "dst_same")
    stale, stale_err = fence.launch(0, DPONE_TEST_FAULT="chunk_leased:1:stop")
    try:
        wait_until("the first attempt to stall after its lease", lambda: chaoskit.stopped(stale))
        time.sleep(5.5)
        retry, retry_err = fence.launch(0)
        assert retry.wait(60) == 0, retry_err.read_text()
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    assert stale.wait(60) == 4
    refused = last_error(stale_err)
    assert refused["code"] == "DPONE_BACKFILL_CHUNK_LEASE_LOST"
    assert "superseded by attempt 2" in refused["message"]
    assert "rolled back" in refused["message"]
    assert fence.day("dst_same") == fence.day("src")
    result = fence.result(stale_err)["backfill"]
    counters = [k for k in result if k.startswith("chunks_") and k != "chunks_selected"]
    assert result["chunks_selected"] == sum(result[k] for k in counters)


@pytest.mark.parametrize("ledger", ["chaos_ledger", "chaos"], ids=["split", "same_database"])
def test_sigterm_mid_copy_rolls_back_and_releases_the_chunk_at_once(
    fence: FenceProject, ledger: str
) -> None:
    fence.write("replace", "dst_same", ledger=ledger)
    fence.sql(fence.data_dsn, "UPDATE chaos.slow SET seconds = 60")
    run, err = fence.launch(0)
    wait_until("the chunk to be leased and moving", lambda: fence.leased(1))
    time.sleep(1.0)  # inside the source COPY (pg_sleep) with the sink transaction open
    signalled = time.monotonic()
    run.send_signal(signal.SIGTERM)
    code = run.wait(30)
    stop_s = time.monotonic() - signalled
    assert code == 143, err.read_text()
    assert stop_s < 5.0, f"stopped {stop_s:.1f}s after SIGTERM"
    text = err.read_text()
    assert "interrupted" in text and "Traceback" not in text
    assert last_error(err)["code"] == "DPONE_RUN_INTERRUPTED"
    result = fence.result(err)["backfill"]
    assert result["chunks_interrupted"] == 1 and result["chunks_committed"] == 0
    latest = fence.transitions(1)[-1]
    assert latest[1] == "failed" and latest[3] == "DPONE_RUN_INTERRUPTED"  # released
    assert fence.day("dst_same")[0] == 0  # rolled back
    fence.sql(fence.data_dsn, "UPDATE chaos.slow SET seconds = 0")
    started = time.monotonic()
    retry, retry_err = fence.launch(0)
    assert retry.wait(60) == 0, retry_err.read_text()
    # Taken at once: a retry that found the lease still held would have exited 4 (CHUNK_BUSY)
    # instead of waiting, and the released chunk's latest record is the interrupted attempt's.
    assert "DPONE_BACKFILL_CHUNK_BUSY" not in retry_err.read_text()
    assert time.monotonic() - started < 30.0
    assert fence.day("dst_same") == fence.day("src")
    print(f"\nSIGTERM ({ledger}): exit 143 after {stop_s:.2f}s; retry took the chunk at once")


def test_sigterm_reaches_dpone_as_pid_1_of_its_namespace(fence: FenceProject) -> None:
    """PID 1 (a container's entrypoint) gets only the signals it has a handler for: dpone
    installs SIGTERM and SIGINT handlers itself, so a pod deletion stops it the same way."""
    fence.write("replace", "dst_same")
    fence.sql(fence.data_dsn, "UPDATE chaos.slow SET seconds = 60")
    run, err = fence.launch(0, prefix=("unshare", "--pid", "--fork", "--mount-proc"))
    children = Path(f"/proc/{run.pid}/task/{run.pid}/children")
    wait_until("dpone to start as PID 1", lambda: children.read_text().strip() != "")
    pid1 = int(children.read_text().split()[0])
    assert Path(f"/proc/{pid1}/status").read_text().count("NSpid") == 1
    nspid = [
        line
        for line in Path(f"/proc/{pid1}/status").read_text().splitlines()
        if line.startswith("NSpid")
    ]
    assert nspid and nspid[0].split()[-1] == "1"  # PID 1 inside its own PID namespace
    wait_until(
        "the chunk to be leased and moving",
        lambda: any(t[1] == "running" for t in fence.transitions(1)),
    )
    time.sleep(1.0)
    signalled = time.monotonic()
    os.kill(pid1, signal.SIGTERM)
    assert run.wait(30) == 143, err.read_text()
    assert time.monotonic() - signalled < 5.0
    assert last_error(err)["code"] == "DPONE_RUN_INTERRUPTED"
    assert fence.transitions(1)[-1][1] == "failed"


def test_lost_committed_transitions_are_reported_not_moved_again(fence: FenceProject) -> None:
    fence.write("replace", "dst_same")
    for item in range(4):
        proc, err = fence.launch(item)
        assert proc.wait(60) == 0, err.read_text()
    fence.sql(fence.ledger_dsn, "DELETE FROM fence_audit.chunk_transition WHERE chunk_index = 2")
    before = fence.day("dst_same", "2023-01-02")
    proc, err = fence.launch(1)
    assert proc.wait(60) == 3
    record = last_error(err)
    assert record["code"] == "DPONE_LEDGER_CORRUPT"
    assert "lost their committed transitions" in record["message"]
    internal, internal_err = fence.launch(None)
    assert internal.wait(60) == 3
    assert last_error(internal_err)["code"] == "DPONE_LEDGER_CORRUPT"
    assert fence.day("dst_same", "2023-01-02") == before
    assert fence.transitions(2) == []
