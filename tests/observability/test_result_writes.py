"""A result or evidence folder that stops being writable while a real `dpone run` moves chunks:
the committed data stands, the run ends DPONE_RESULT_WRITE_FAILED (exit 1), the XCom result is
still written where its own folder works and says so, and lineage still ends with FAIL and the
metrics are exported once more (within the export budget)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .receiver import receiver
from .runproject import DPONE

pytestmark = pytest.mark.postgres


@pytest.fixture
def passing(project: dict[str, Any]) -> dict[str, Any]:
    """The observability project with its bad day fixed: every chunk commits."""
    fix_the_bad_day(project)
    return project


def fix_the_bad_day(project: dict[str, Any]) -> None:
    with psycopg.connect(project["pg"], autocommit=True) as conn:
        conn.execute(f"UPDATE {project['schema']}.raw_orders SET amount = 1 WHERE amount < 0")


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP from the test fault point)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def run_breaking(project: dict[str, Any], env: dict[str, str], folder: Path) -> tuple[int, str]:
    """`dpone run` that stops itself at every lease (DPONE_TEST_FAULT); at the first stop, after
    the up-front check passed, ``folder`` is replaced by a file (so nothing can be written
    under it, whoever runs the test), then the run goes on to its end."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OTEL_"))}
    base.update(
        {
            "DPONE_CONN_WH": project["dsn"],
            "DPONE_TEST_FAULT": "chunk_leased:1:stop",
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",  # only the final export within the run
            **env,
        }
    )
    argv = [str(DPONE), "run", "--catalog", project["catalog"], "--workload", "orders"]
    broken = False
    with subprocess.Popen(
        [*argv, "--process", "orders", "--no-progress"],
        env=base,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            if _stopped(proc.pid):
                if not broken:
                    folder.rename(folder.with_name(folder.name + ".gone"))
                    folder.write_text("not a folder any more\n")
                    broken = True
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.01)
        if proc.poll() is None:
            proc.kill()
        _, stderr = proc.communicate(timeout=30)
    assert broken, stderr
    return proc.returncode, stderr


def last_record(stderr: str) -> dict[str, Any]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    record: dict[str, Any] = json.loads(lines[-1])
    assert record["schema"] == "dpone.error.v1", stderr
    return record


def rows(project: dict[str, Any]) -> int:
    with psycopg.connect(project["pg"]) as conn:
        row = conn.execute(f"SELECT count(*) FROM {project['schema']}.orders").fetchone()
    assert row is not None
    return int(row[0])


def test_an_unwritable_evidence_folder_at_completion_is_result_write_failed(
    passing: dict[str, Any], tmp_path: Path
) -> None:
    """The verification export of the completed campaign and the evidence file fail: not an
    internal error (exit 3) with no result, but exit 1 and a result saying why."""
    evidence, xcom = tmp_path / "evidence", tmp_path / "xcom.json"
    evidence.mkdir()
    env = {"DPONE_EVIDENCE_DIR": str(evidence), "DPONE_XCOM_PATH": str(xcom)}
    code, stderr = run_breaking(passing, env, evidence)
    assert code == 1, stderr
    assert last_record(stderr)["code"] == "DPONE_RESULT_WRITE_FAILED"
    assert "verification" in last_record(stderr)["message"]
    result = json.loads(xcom.read_text())
    assert result["status"] == "failed"
    assert result["error"]["code"] == "DPONE_RESULT_WRITE_FAILED"
    assert result["backfill"]["chunks_committed"] == 12
    assert result["backfill"]["campaign_complete"] is True
    assert rows(passing) == 1200  # the data outcome stands


@pytest.mark.parametrize("day", ["passing", "failing_chunk"])
def test_an_unwritable_result_still_ends_lineage_and_exports_metrics(
    project: dict[str, Any], tmp_path: Path, day: str
) -> None:
    """The result write fails after the chunks moved: lineage gets FAIL after START and the
    final metrics export still runs, before the process exits with the write failure."""
    if day == "passing":
        fix_the_bad_day(project)
    folder = tmp_path / "xcom"
    folder.mkdir()
    with receiver() as (url, got):
        env = {
            "DPONE_XCOM_PATH": str(folder / "xcom.json"),
            "OPENLINEAGE_URL": url,
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "DPONE_EXPORT_BUDGET_S": "10",
        }
        started = time.monotonic()
        code, stderr = run_breaking(project, env, folder)
        took = time.monotonic() - started
        events = [json.loads(body) for body in got.bodies("/api/v1/lineage")]
        metrics = got.bodies("/v1/metrics")
    assert code == 1, stderr
    record = last_record(stderr)
    assert record["code"] == "DPONE_RESULT_WRITE_FAILED", stderr
    assert [e["eventType"] for e in events] == ["START", "FAIL"], stderr
    assert "DPONE_RESULT_WRITE_FAILED" in json.dumps(events[-1])
    assert metrics, stderr  # the final export, sent before the exit
    assert took < 60, took
    assert not (folder.with_name("xcom.gone") / "xcom.json").exists()
