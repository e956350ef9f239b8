"""A SIGTERM or SIGINT that arrives once the run result is written, while the process waits for
a hanging exporter: it only shortens the wait (at most 1 s), and the exit code stays the one the
result and the last stderr line give (not 143/130 after "passed", not a retryable 143 after a
result saying retryable false)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .endpoints import hanging_listener
from .runproject import DPONE
from .test_result_writes import fix_the_bad_day

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("day", ["passing", "failing_chunk"])
def test_a_stop_after_the_result_keeps_the_results_exit_code(
    project: dict[str, Any], tmp_path: Path, day: str, signum: signal.Signals
) -> None:
    if day == "passing":
        fix_the_bad_day(project)
    xcom = tmp_path / "xcom.json"
    with hanging_listener() as (url, accepted):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OTEL_"))}
        env.update(
            {
                "DPONE_CONN_WH": project["dsn"],
                "OPENLINEAGE_URL": url,  # START hangs: the process waits after its result
                "DPONE_EXPORT_BUDGET_S": "60",  # only the stop can end the wait early
                "DPONE_XCOM_PATH": str(xcom),
            }
        )
        argv = [str(DPONE), "run", "--catalog", project["catalog"], "--workload", "orders"]
        with subprocess.Popen(
            [*argv, "--no-progress"], env=env, stderr=subprocess.PIPE, text=True
        ) as proc:
            deadline = time.monotonic() + 30
            while not (accepted and xcom.is_file()) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert accepted and xcom.is_file() and proc.poll() is None  # written; still waiting
            proc.send_signal(signum)
            signalled = time.monotonic()
            _, stderr = proc.communicate(timeout=30)
            took = time.monotonic() - signalled
    assert took < 5.0, (took, stderr)
    result = json.loads(xcom.read_text())
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "DPONE_RUN_INTERRUPTED" not in stderr, stderr
    if day == "passing":
        assert result["status"] == "passed" and result["error"] is None
        assert proc.returncode == 0, stderr
        assert ": passed — 12 committed" in lines[-1], stderr
    else:
        assert result["error"]["code"] == "DPONE_SINK_FAILED", result["error"]
        assert result["error"]["retryable"] is False
        assert proc.returncode == 1, stderr  # not 143, which the DAG would retry
        assert json.loads(lines[-1])["code"] == "DPONE_SINK_FAILED", stderr
