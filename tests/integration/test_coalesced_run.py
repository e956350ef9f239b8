"""Coalesced chunks (ADR 0022) against the real Postgres, the ledger in the sink's database.

A worker moves its consecutive chunks in one transaction, each chunk with its own lease
statement, RUNNING and COMMITTED records, checksum and read-back gate. What a group is shows in
the database: the rows one transaction inserted share one ``xmin``. A failure in the middle of
a group rolls the group back and its chunks are moved again one by one; a chunk whose lock
another session holds ends the group before it; SIGTERM mid-group rolls back and releases.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone import errors
from dpone.cli import main
from dpone.ledger.sql import chunk_lock_class
from pg import campaign_advisory_locks

pytestmark = pytest.mark.postgres

DAYS = 6
ROWS_PER_DAY = 10
RUN_KEY = "coalesce_test"
CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  events:
    manifest: events.yaml
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: events
    source: {{connection: wh, table: {{schema: {s}, name: {source}}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: dst}}
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: d, type: date, start: 2024-01-01, end: 2024-01-0{end}}}
      inner_mode: replace
      backfill_id: {run_key}{coalesce}
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit}}
"""


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    schema = "co_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.src (id int PRIMARY KEY, d date NOT NULL, n int)")
        conn.execute(
            f"CREATE TABLE {schema}.dst (id int PRIMARY KEY, d date NOT NULL, n int "
            "CHECK (n >= 0))"
        )
        conn.execute(
            f"INSERT INTO {schema}.src SELECT g, date '2024-01-01' + (g - 1) / {ROWS_PER_DAY}, g"
            f" FROM generate_series(1, {DAYS * ROWS_PER_DAY}) g"
        )
        # a source that sleeps on row 25 (chunk 3) while a flag row says so
        conn.execute(f"CREATE TABLE {schema}.slow_flag (on_ boolean)")
        conn.execute(
            f"CREATE FUNCTION {schema}.slow(id int) RETURNS boolean LANGUAGE plpgsql AS $$ "
            f"BEGIN IF id = 25 AND EXISTS (SELECT 1 FROM {schema}.slow_flag) THEN "
            "PERFORM pg_sleep(60); END IF; RETURN true; END $$"
        )
        conn.execute(
            f"CREATE VIEW {schema}.src_slow AS SELECT * FROM {schema}.src WHERE {schema}.slow(id)"
        )
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    monkeypatch.delenv("DPONE_AIRFLOW_MAPPING_ITEM", raising=False)
    monkeypatch.delenv("DPONE_AIRFLOW_RUN_IDENTITY", raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    monkeypatch.setenv("DPONE_EVIDENCE_DIR", str(tmp_path / "evidence"))

    class Project:
        dsn = pg_dsn
        tmp = tmp_path
        s = schema

        def write(self, coalesce: str = "", source: str = "src") -> str:
            (tmp_path / "workloads.yaml").write_text(CATALOG)
            line = f"\n      coalesce: {coalesce}" if coalesce else ""
            (tmp_path / "events.yaml").write_text(
                MANIFEST.format(
                    s=schema, source=source, end=DAYS + 1, run_key=RUN_KEY, coalesce=line
                )
            )
            return str(tmp_path / "workloads.yaml")

        def run(self, catalog: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
            code = main(["run", "--catalog", catalog, "--workload", "events", "--no-progress"])
            self.output = capsys.readouterr().err
            return code, json.loads((tmp_path / "xcom.json").read_text())

        def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                cur = conn.execute(query.format(s=schema), params or None)
                return cur.fetchall() if cur.description else []

        def history(self) -> dict[int, list[tuple[str, int, str | None]]]:
            out: dict[int, list[tuple[str, int, str | None]]] = {}
            rows = self.sql(
                "SELECT chunk_index, state, attempt, error_code FROM {s}_audit.chunk_transition "
                "WHERE run_key = %s ORDER BY chunk_index, transition",
                RUN_KEY,
            )
            for index, state, attempt, code in rows:
                out.setdefault(int(index), []).append((str(state), int(attempt), code))
            return out

        def commit_of_chunk(self) -> dict[int, int]:
            """chunk index -> the transaction (xmin) that committed its COMMITTED record; the
            chunk's target rows must carry the same one."""
            ledger = {
                int(i): int(x)
                for i, x in self.sql(
                    "SELECT chunk_index, xmin::text::bigint FROM {s}_audit.chunk_transition "
                    "WHERE run_key = %s AND state = 'committed'",
                    RUN_KEY,
                )
            }
            target = self.sql(
                "SELECT DISTINCT d - date '2024-01-01' + 1, xmin::text::bigint FROM {s}.dst"
            )
            assert {int(i): int(x) for i, x in target} == ledger  # data and record together
            return ledger

    yield Project()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def _groups(commits: dict[int, int]) -> list[list[int]]:
    by_tx: dict[int, list[int]] = {}
    for index in sorted(commits):
        by_tx.setdefault(commits[index], []).append(index)
    return sorted(by_tx.values())


def _committed_alone(history: dict[int, list[tuple[str, int, str | None]]]) -> None:
    for index, records in history.items():
        assert records == [("running", 1, None), ("committed", 1, None)], (index, records)


@pytest.mark.parametrize(
    ("coalesce", "groups"),
    [
        # a worker's first group is one chunk (it measures the rows a chunk holds), then:
        ("", [[1], [2, 3, 4, 5, 6]]),  # the default budget: every other chunk in one group
        ("{max_rows: 20}", [[1], [2, 3], [4, 5], [6]]),  # as many chunks as fit in 20 rows
        ("{max_chunks: 4}", [[1], [2, 3, 4, 5], [6]]),  # ... or in 4 chunk locks
        ("false", [[1], [2], [3], [4], [5], [6]]),  # off: one transaction per chunk
    ],
)
def test_a_group_commits_its_chunks_once_each_with_its_own_records(
    project: Any, capsys: pytest.CaptureFixture[str], coalesce: str, groups: list[list[int]]
) -> None:
    code, result = project.run(project.write(coalesce), capsys)
    assert code == 0 and result["status"] == "passed", project.output
    assert (
        result["backfill"]["chunks_committed"] == DAYS
        and result["backfill"]["rows_written"] == DAYS * ROWS_PER_DAY
    )
    assert _groups(project.commit_of_chunk()) == groups
    _committed_alone(project.history())
    checksums = dict(
        project.sql(
            "SELECT chunk_index, checksum FROM {s}_audit.chunk_transition "
            "WHERE run_key = %s AND state = 'committed'",
            RUN_KEY,
        )
    )
    assert len(set(checksums.values())) == DAYS  # each chunk's own checksum
    documents = [json.loads(p.read_text()) for p in (project.tmp / "evidence").rglob("*.json")]
    evidence = next(d for d in documents if d.get("schema") == "dpone.backfill-evidence.v1")
    chunks = evidence["chunks"]
    assert {c["index"]: c["checksum"] for c in chunks} == checksums


def test_a_bad_chunk_fails_alone_and_the_others_commit(
    project: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    project.sql("UPDATE {s}.src SET n = -1 WHERE id = 25")  # chunk 3 breaks the target's CHECK
    code, result = project.run(project.write(), capsys)
    assert code != 0 and result["status"] != "passed"
    assert (result["backfill"]["chunks_committed"], result["backfill"]["chunks_failed"]) == (
        DAYS - 1,
        1,
    )
    history = project.history()
    # chunk 1 committed alone (a worker's first group); the group 2-6 rolled back (nothing
    # recorded), then 2 to 6 moved alone: 3 failed with its own record and code
    failed = history.pop(3)
    assert [(state, attempt) for state, attempt, _ in failed] == [("running", 1), ("failed", 1)]
    assert failed[1][2] == errors.SINK_FAILED
    assert result["error"]["code"] == errors.SINK_FAILED  # the run's error is chunk 3's own
    assert result["error"]["message"].startswith("chunk 3 ")
    _committed_alone(history)
    assert _groups(project.commit_of_chunk()) == [[1], [2], [4], [5], [6]]
    # the next run moves the repaired chunk as attempt 2
    project.sql("UPDATE {s}.src SET n = 25 WHERE id = 25")
    code, result = project.run(project.write(), capsys)
    assert code == 0 and result["backfill"]["chunks_committed"] == 1
    assert project.history()[3][-2:] == [("running", 2, None), ("committed", 2, None)]


def test_a_chunk_held_by_another_session_ends_the_group_before_it(
    project: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = project.write()
    lock_class = chunk_lock_class(f"{project.s}_audit", RUN_KEY)
    seen: dict[str, Any] = {}
    holding = threading.Event()

    def hold() -> None:
        with psycopg.connect(project.dsn) as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s, 3)", (lock_class,))
            holding.set()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    done = project.history()
                except psycopg.Error:
                    done = {}
                if all(done.get(i, [("", 0, None)])[-1][0] == "committed" for i in (1, 2)):
                    seen["committed_while_held"] = sorted(done)
                    break
                time.sleep(0.05)
            conn.rollback()  # frees chunk 3

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    code, result = project.run(catalog, capsys)
    holder.join(60)
    assert code == 0 and result["backfill"]["chunks_committed"] == DAYS
    # 1 and 2 committed while chunk 3 was held (1 alone, a worker's first group; the group
    # 2-6 stopped before 3 and did not wait)
    assert seen["committed_while_held"] == [1, 2]
    assert _groups(project.commit_of_chunk()) == [[1], [2], [3, 4, 5, 6]]
    _committed_alone(project.history())


def test_sigterm_mid_group_rolls_back_and_releases_every_chunk(project: Any, pg_dsn: str) -> None:
    catalog = project.write(source="src_slow")
    project.sql("INSERT INTO {s}.slow_flag VALUES (true)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update(DPONE_CONN_WH=pg_dsn, DPONE_XCOM_PATH=str(project.tmp / "xcom.json"))
    args = ["run", "--catalog", catalog, "--workload", "events", "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpone", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not project.sql(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = "
            "current_database()"
        ):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(1.0)  # the group 2-6's copy waits for the sleeping read of chunk 3
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    result = json.loads((project.tmp / "xcom.json").read_text())
    history = project.history()
    # chunk 1 committed alone (the worker's first group); the group 2-6 committed nothing and
    # every chunk it leased is released: RUNNING, then FAILED with DPONE_RUN_INTERRUPTED
    assert project.sql("SELECT count(*) FROM {s}.dst") == [(ROWS_PER_DAY,)]
    assert history.pop(1) == [("running", 1, None), ("committed", 1, None)]
    assert set(history) == {2, 3, 4, 5, 6}
    for index, records in history.items():
        assert records == [
            ("running", 1, None),
            ("failed", 1, errors.RUN_INTERRUPTED),
        ], (index, records)
    assert result["backfill"]["chunks_interrupted"] == len(history)
    assert result["backfill"]["chunks_not_started"] == 0
    assert result["error"]["code"] == errors.RUN_INTERRUPTED
    assert campaign_advisory_locks(pg_dsn, f"{project.s}_audit", RUN_KEY) == 0
    # the next run moves the released ones as attempt 2 (2 alone, then 3-6 in one group)
    project.sql("DELETE FROM {s}.slow_flag")
    code = main(["run", "--catalog", catalog, "--workload", "events", "--no-progress"])
    assert code == 0
    assert _groups(project.commit_of_chunk()) == [[1], [2], [3, 4, 5, 6]]
    for index, records in project.history().items():
        attempt = 2 if index in history else 1
        assert records[-2:] == [("running", attempt, None), ("committed", attempt, None)]


@pytest.mark.parametrize("bad", ["{max_rows: 0}", "{max_seconds: 0}", "{rows: 5}", "often"])
def test_a_bad_budget_is_refused_before_anything_moves(
    project: Any, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    catalog = project.write(bad)
    code = main(["run", "--catalog", catalog, "--workload", "events", "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and errors.MANIFEST_INVALID in err and "events.yaml:" in err, err
    assert "coalesce" in err and "Traceback" not in err
    assert not project.sql("SELECT to_regnamespace('{s}_audit')")[0][0]  # no ledger created


def test_set_based_checksums_are_the_single_chunk_ones(project: Any) -> None:
    """The grouped checksum statements give each window exactly what the per-chunk gate
    computes for it alone, on the source and on the target (NULLs, empty windows included)."""
    from dpone.connectors.base import ChunkWindow, SinkOptions, SinkSpec, SourceSpec, TableRef
    from dpone.connectors.postgres import PostgresSink, PostgresSource

    project.sql("UPDATE {s}.src SET n = NULL WHERE id % 7 = 0")
    project.sql("DELETE FROM {s}.src WHERE d = date '2024-01-04'")  # an empty window
    days = [f"2024-01-0{day}" for day in range(1, DAYS + 2)]
    windows = [ChunkWindow("d", "date", days[i], days[i + 1]) for i in range(DAYS)]
    spec = SourceSpec(connection="wh", table=TableRef(project.s, "src"))
    with PostgresSource(spec, project.dsn) as source:
        source.chained_checksum = True  # the form a Postgres sink's gate agrees on (ADR 0027)
        alone = [source.checksum(window) for window in windows]
        assert source.window_checksums(windows) == alone
        assert source.window_checksums(windows[2:5]) == alone[2:5]
        assert source.window_checksums(windows[:1]) == alone[:1]
    sink_spec = SinkSpec("wh", TableRef(project.s, "dst"), "replace")
    with (
        PostgresSource(spec, project.dsn) as source,
        PostgresSink(sink_spec, project.dsn, SinkOptions()) as sink,
        psycopg.connect(project.dsn) as conn,
    ):
        conn.execute("SELECT 1")  # the caller's transaction is open
        writes = sink.write_group(source, windows, conn)
        assert [w.checksum for w in writes] == alone
        assert [w.source_checksum for w in writes] == alone
        assert [w.rows for w in writes] == [0 if i == 3 else ROWS_PER_DAY for i in range(DAYS)]
        one = [sink.write_chunk(source, w, connection=conn, isolated=False) for w in windows]
        assert [w.checksum for w in one] == alone
        conn.rollback()


def test_a_chunk_whose_target_differs_fails_alone_after_the_set_rolls_back(
    project: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # the target changes one value of chunk 4 as it is written: same count, other content
    project.sql(
        "CREATE FUNCTION {s}.bump() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.id = 35 THEN NEW.n := NEW.n + 1000; END IF; RETURN NEW; END $$"
    )
    project.sql(
        "CREATE TRIGGER bump BEFORE INSERT ON {s}.dst FOR EACH ROW EXECUTE FUNCTION {s}.bump()"
    )
    code, result = project.run(project.write(), capsys)
    assert code != 0 and result["status"] != "passed"
    assert (result["backfill"]["chunks_committed"], result["backfill"]["chunks_failed"]) == (
        DAYS - 1,
        1,
    )
    history = project.history()
    failed = history.pop(4)
    assert failed == [("running", 1, None), ("failed", 1, errors.READ_BACK_MISMATCH)]
    assert result["error"]["code"] == errors.READ_BACK_MISMATCH
    assert result["error"]["message"].startswith("chunk 4 ")
    _committed_alone(history)
    # 1 alone (the first group), the set 2-6 rolled back, then each moved alone
    assert _groups(project.commit_of_chunk()) == [[1], [2], [3], [5], [6]]
    assert project.sql("SELECT count(*) FROM {s}.dst WHERE d = date '2024-01-04'") == [(0,)]


HOURLY_MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: events
    source: {{connection: wh, table: {{schema: {s}, name: hsrc}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: hdst}}
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: ts, type: timestamp, start: "2024-01-01T00:00:00Z", end: "2024-01-11T00:00:00Z", unit: hour}}
      inner_mode: replace
      parallel_workers: 4
      backfill_id: hourly_set
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit}}
"""


def test_the_hourly_shape_with_four_workers_equals_the_source(
    project: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """240 hourly chunks, 4 workers, set-based groups: the target equals the source, compared
    outside dpone; every chunk has its own COMMITTED record and checksum; groups did form."""
    project.sql(
        "CREATE TABLE {s}.hsrc (id bigint PRIMARY KEY, ts timestamp NOT NULL, amount numeric, "
        "note text)"
    )
    project.sql(
        "CREATE TABLE {s}.hdst (id bigint PRIMARY KEY, ts timestamp NOT NULL, amount numeric, "
        "note text)"
    )
    project.sql(
        "INSERT INTO {s}.hsrc SELECT g, timestamp '2024-01-01' + g * interval '31 seconds', "
        "round((g * 1.37)::numeric, 2), CASE WHEN g % 11 = 0 THEN NULL ELSE 'n\"' || g END "
        "FROM generate_series(0, 27863) g"  # 240 hours of about 116 rows
    )
    (project.tmp / "workloads.yaml").write_text(CATALOG)
    (project.tmp / "events.yaml").write_text(HOURLY_MANIFEST.format(s=project.s))
    code, result = project.run(str(project.tmp / "workloads.yaml"), capsys)
    assert code == 0 and result["status"] == "passed", project.output
    assert result["backfill"]["chunks_committed"] == 240
    assert result["backfill"]["rows_written"] == 27864

    def digest(table: str) -> list[tuple[Any, ...]]:
        return project.sql(
            "SELECT count(*), md5(string_agg(concat_ws('|', id, ts, amount, note), ',' "
            f"ORDER BY id)) FROM {{s}}.{table}"
        )

    assert digest("hdst") == digest("hsrc")
    records = project.sql(
        "SELECT chunk_index, checksum, source_checksum, xmin::text FROM "
        "{s}_audit.chunk_transition WHERE run_key = 'hourly_set' AND state = 'committed'"
    )
    assert len(records) == 240 and all(c == sc for _, c, sc, _ in records)
    assert len({c for _, c, _, _ in records}) == 240
    assert len({x for _, _, _, x in records}) < 60  # chunks shared transactions
