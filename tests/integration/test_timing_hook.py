"""DPONE_TIMING: `dpone run` reports per-phase times and round trips when asked, and is untouched
(the module is not even imported) when not. Real `dpone` processes, real Postgres: the hook wraps
functions process-wide, so it never runs inside the test interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.postgres

DPONE = Path(sys.executable).with_name("dpone")
CHUNKS = 5

MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: src, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-06}}
      inner_mode: replace{coalesce}
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit}}
"""


@pytest.fixture
def project(
    request: pytest.FixtureRequest, tmp_path: Path, pg_dsn: str
) -> Iterator[tuple[str, dict[str, str]]]:
    schema = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, order_date date,"
                f" amount integer)"
            )
        conn.execute(f"CREATE INDEX ON {schema}.orders (order_date)")
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % {CHUNKS}), g"
            f" FROM generate_series(1, 500) g"
        )
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\nworkloads:\n  orders: {manifest: orders.yaml}\n"
    )
    coalesce = getattr(request, "param", "")
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema, coalesce=coalesce))
    # The source's DSN differs in text from the sink's, so the chunk takes the COPY path.
    separator = "&" if "?" in pg_dsn else "?"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update(
        DPONE_CONN_WH=pg_dsn,
        DPONE_CONN_SRC=f"{pg_dsn}{separator}application_name=dpone_timing_src",
    )
    yield str(tmp_path / "workloads.yaml"), env
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def run(catalog: str, env: dict[str, str], *python_flags: str) -> subprocess.CompletedProcess[str]:
    args = ["run", "--catalog", catalog, "--workload", "orders", "--no-progress"]
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "dpone", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "project", ["\n      coalesce: false", ""], indirect=True, ids=["alone", "coalesced"]
)
def test_timing_reports_every_phase_of_every_chunk(
    project: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    catalog, env = project
    coalesced = "coalesce: false" not in Path(catalog).with_name("orders.yaml").read_text()
    report = tmp_path / "timing.jsonl"
    done = run(catalog, {**env, "DPONE_TIMING": str(report)})
    assert done.returncode == 0, done.stderr
    [line] = report.read_text().splitlines()
    phases = json.loads(line)["phases"]
    # one commit per chunk (ADR 0021): the lease, the data and the compare-and-set completion
    # are one transaction, so no separate lock-and-read step ("cas") is left
    assert "cas" not in phases
    # coalesced (ADR 0022), the five small chunks are two set-based groups (a worker's first
    # group is one chunk): one "group" phase each, holding its one commit; the group's leases,
    # its completions, the delete, the copy and the two checksums (the sink's read-back and the
    # source's) run once a group, while every chunk keeps its own gate
    outer = "group" if coalesced else "chunk"
    assert ("chunk" if coalesced else "group") not in phases
    assert phases[outer][0] == (2 if coalesced else CHUNKS), phases[outer]
    writes = 2 if coalesced else CHUNKS
    expected = {"lease": writes, "completion": writes, "delete": writes, "copy_in": writes}
    expected["checksum"] = 2 * writes
    for name in (outer, *expected):
        calls, own_ns, total_ns, trips = phases[name]
        if name != outer:
            assert calls == expected[name], (name, phases[name])
        assert 0 < own_ns <= total_ns, (name, phases[name])
        if name != outer:
            assert trips >= expected[name], (name, phases[name])  # each talks to the server
    assert phases["copy_out"][3] == writes  # the source's COPY TO, one per write
    # the gate, once per chunk (and once more for the set-based group's comparison of all)
    assert phases["read_back"][0] == CHUNKS + (1 if coalesced else 0)
    assert phases[outer][2] >= sum(phases[n][1] for n in ("lease", "completion"))


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_timing_file_that_cannot_be_written_is_one_warning_first_never_a_traceback(
    project: tuple[str, dict[str, str]], tmp_path: Path, kind: str
) -> None:
    # Regression: the exit-time report raised in an atexit callback, after the run's last line;
    # a FIFO with no reader blocked the run before its first chunk
    catalog, env = project
    target = tmp_path
    if kind == "fifo":
        target = tmp_path / "timing.fifo"
        os.mkfifo(target)
    done = run(catalog, {**env, "DPONE_TIMING": str(target), "DPONE_LOG_FORMAT": "text"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("dpone: warning: DPONE_TIMING=") and "cannot be written" in lines[0]
    assert "passed" in lines[-1]
