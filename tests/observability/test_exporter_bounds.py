"""Exporters can neither stall nor fail a run: real `dpone run` processes against the real
Postgres with OpenLineage and OTLP pointed at a listener that never answers, a closed port and a
name that does not resolve (the wall time stays within the export budget plus the run's own
time), SIGTERM while the START event hangs (exit within 5 s, the result on disk), and every bad
observability setting (one warning naming it, the run passes, JSON log mode stays JSON)."""

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

from .endpoints import closed_port, erroring_server, hanging_listener
from .receiver import receiver
from .runproject import DPONE, dpone_run

pytestmark = pytest.mark.postgres
BUDGET_S = 2.0
#: what a run may take beyond the budget on a loaded 2-core machine (its own work included)
SLACK_S = 4.0


@pytest.fixture
def passing(project: dict[str, Any]) -> dict[str, Any]:
    """The observability project with its bad day fixed: every run passes."""
    with psycopg.connect(project["pg"], autocommit=True) as conn:
        conn.execute(f"UPDATE {project['schema']}.raw_orders SET amount = 1 WHERE amount < 0")
    return project


def reset(project: dict[str, Any]) -> None:
    """Forget the campaign, so the next run moves every chunk again."""
    with psycopg.connect(project["pg"], autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {project['schema']}_audit CASCADE")
        conn.execute(f"TRUNCATE {project['schema']}.orders")


def timed(project: dict[str, Any], env: dict[str, str]) -> tuple[float, Any]:
    started = time.monotonic()
    result = dpone_run(project, env)
    return time.monotonic() - started, result


def only_dpone_lines(stderr: str) -> list[str]:
    """Every stderr line is dpone's own (no library output); returns the warning lines."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert all(line.startswith(("dpone:", "{", "error:")) for line in lines), stderr
    assert "Traceback" not in stderr
    return [line for line in lines if line.startswith("dpone: warning:")]


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize("endpoint", ["hanging", "closed", "unresolvable", "erroring"])
def test_a_dead_endpoint_costs_at_most_the_budget(
    passing: dict[str, Any], endpoint: str, log_format: str, tmp_path: Path
) -> None:
    baseline, first = timed(passing, {})
    assert first.returncode == 0, first.stderr
    reset(passing)
    with hanging_listener() as (hanging, accepted), erroring_server() as erroring:
        url = {
            "hanging": hanging,
            "closed": closed_port(),
            "unresolvable": "http://dpone-no-such-host.invalid:4318",
            "erroring": erroring,
        }[endpoint]
        env = {
            "OPENLINEAGE_URL": url,
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "DPONE_EXPORT_BUDGET_S": str(BUDGET_S),
            "DPONE_XCOM_PATH": str(tmp_path / "xcom.json"),
            "DPONE_LOG_FORMAT": log_format,
        }
        took, result = timed(passing, env)
        if endpoint == "hanging":
            assert accepted, "the exporters never reached the listener"
    assert result.returncode == 0, result.stderr
    print(f"exporter bounds: {endpoint}/{log_format}: {took:.2f} s (no exporter: {baseline:.2f} s)")
    assert took <= baseline + BUDGET_S + SLACK_S, (took, baseline, result.stderr)
    assert json.loads((tmp_path / "xcom.json").read_text())["status"] == "passed"
    if log_format == "json":  # every line is JSON: no raw retry line of an HTTP client
        records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
        warnings = [r["message"] for r in records if r.get("event") == "warning"]
        assert records[-1]["event"] == "summary" and records[-1]["committed"] == 12
    else:
        warnings = only_dpone_lines(result.stderr)
        assert "12 committed" in result.stderr
    assert 1 <= len(warnings) <= 3, result.stderr  # at most one per exporter + the budget's


@pytest.mark.parametrize("when", ["at_start", "after_the_result"])
def test_sigterm_while_start_hangs_exits_within_5_s_with_the_result(
    passing: dict[str, Any], tmp_path: Path, when: str
) -> None:
    """``at_start``: as soon as START reached the listener (the run is starting or moving
    chunks); ``after_the_result``: once the result file is on disk while the process still
    waits for the hanging START (proof that the result is written before exit-time exports)."""
    xcom = tmp_path / "xcom.json"
    with hanging_listener() as (url, accepted):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OTEL_"))}
        env.update(
            {
                "DPONE_CONN_WH": passing["dsn"],
                "OPENLINEAGE_URL": url,
                "DPONE_EXPORT_BUDGET_S": "60",  # only the stop can end the wait early
                "DPONE_XCOM_PATH": str(xcom),
            }
        )
        argv = [str(DPONE), "run", "--catalog", passing["catalog"], "--workload", "orders"]
        with subprocess.Popen(
            [*argv, "--no-progress"], env=env, stderr=subprocess.PIPE, text=True
        ) as proc:
            deadline = time.monotonic() + 30
            while not accepted and time.monotonic() < deadline:
                time.sleep(0.02)
            assert accepted, "START never reached the listener"
            if when == "after_the_result":
                while not xcom.is_file() and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert xcom.is_file() and proc.poll() is None  # written; still waiting
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            _, stderr = proc.communicate(timeout=30)
            took = time.monotonic() - signalled
            assert xcom.is_file(), stderr  # on disk before the process ended
    print(f"exporter bounds: SIGTERM {when}: exit {proc.returncode} {took:.2f} s after the signal")
    assert took < 5.0, (took, stderr)
    result = json.loads(xcom.read_text())
    assert result["schema"] == "dpone.run-result.v1"
    # a stop after the result only shortens the wait: the exit code is the result's
    stopped = (result["error"] or {}).get("code") == "DPONE_RUN_INTERRUPTED"
    assert proc.returncode == (143 if stopped else 0), stderr
    if when == "after_the_result":
        assert not stopped and proc.returncode == 0, stderr
    only_dpone_lines(stderr)


def _bad_yaml(tmp: Path) -> str:
    path = tmp / "openlineage.yml"
    path.write_text("transport:\n  type: http\n  url: [1, 2\n", encoding="utf-8")
    return str(path)


def _bad_yaml_in_a_folder_with_a_newline(tmp: Path) -> str:
    folder = tmp / "nl\nerror: DPONE_FAKE"
    folder.mkdir(exist_ok=True)
    return _bad_yaml(folder)


#: (extra env, the setting the one warning must name); {url} is a live receiver
BAD_SETTINGS: list[tuple[dict[str, str], str]] = [
    ({"OPENLINEAGE_URL": "not a url"}, "OPENLINEAGE_URL"),
    ({"OPENLINEAGE__TRANSPORT__TYPE": "kafka"}, "OPENLINEAGE__TRANSPORT__TYPE='kafka'"),
    ({"OPENLINEAGE__TRANSPORT__TYPE": "bogus"}, "OPENLINEAGE__TRANSPORT__TYPE='bogus'"),
    ({"OPENLINEAGE_CONFIG": "{bad_yaml}"}, "openlineage.yml:4 is not valid YAML"),
    ({"OPENLINEAGE_CONFIG": "{tmp}/missing.yml"}, "OPENLINEAGE_CONFIG"),
    (
        {"OPENLINEAGE_URL": "{url}", "OPENLINEAGE__TRANSPORT__TIMEOUT": "-3"},
        "OPENLINEAGE__TRANSPORT__TIMEOUT",
    ),
    (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_METRIC_EXPORT_INTERVAL": "-5"},
        "OTEL_METRIC_EXPORT_INTERVAL",
    ),
    (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OPENLINEAGE_URL": "{url}", "DPONE_EXPORT_BUDGET_S": "-1"}, "DPONE_EXPORT_BUDGET_S"),
    # asked for explicitly, the console transport used to print nothing and say nothing
    ({"OPENLINEAGE__TRANSPORT__TYPE": "console"}, "console transport"),
    # a superscript digit passed isdigit() and failed int(): DPONE_INTERNAL, nothing moved
    (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_METRIC_EXPORT_INTERVAL": "\u00b2"},
        "OTEL_METRIC_EXPORT_INTERVAL must be a whole number of milliseconds",
    ),
    (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_METRIC_EXPORT_TIMEOUT": "\u00b2"},
        "OTEL_METRIC_EXPORT_TIMEOUT must be a whole number of milliseconds",
    ),
    # passed the check, then the SDK's reader thread died with a raw traceback on stderr
    (
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "{url}",
            "OTEL_METRIC_EXPORT_INTERVAL": "99999999999999999999",
        },
        "OTEL_METRIC_EXPORT_INTERVAL must be a whole number of milliseconds from 1 to",
    ),
    # named OPENLINEAGE_URL (unset) and showed "AttributeError: 'str' object has no attribute"
    ({"OPENLINEAGE__TRANSPORT": "{{bogus"}, "OPENLINEAGE__TRANSPORT is not a JSON object"),
    # said "the run goes on without it" while metrics were exported with the default
    (
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "{url}",
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "bogus",
        },
        "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE must be one of cumulative, delta, "
        "lowmemory; the default (cumulative) is used",
    ),
    # a newline in a path the warning names printed a second line that imitated a record
    (
        {"OPENLINEAGE_CONFIG": "{bad_yaml_nl}"},
        "nl\\nerror: DPONE_FAKE/openlineage.yml:4 is not valid YAML",
    ),
    ({"DPONE_TIMING": "{tmp}/missing\nerror: DPONE_FAKE/t.jsonl"}, "missing\\nerror: DPONE_FAKE"),
]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_each_bad_setting_is_one_warning_and_the_run_passes(
    passing: dict[str, Any], tmp_path: Path, log_format: str
) -> None:
    with receiver() as (url, _):
        for extra, setting in BAD_SETTINGS:
            reset(passing)
            env = {
                key: value.format(
                    url=url,
                    tmp=tmp_path,
                    bad_yaml=_bad_yaml(tmp_path),
                    bad_yaml_nl=_bad_yaml_in_a_folder_with_a_newline(tmp_path),
                )
                for key, value in extra.items()
            }
            env["DPONE_LOG_FORMAT"] = log_format
            result = dpone_run(passing, env)
            assert result.returncode == 0, (extra, result.stderr)
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            if log_format == "json":
                records = [json.loads(line) for line in lines]  # every line is JSON
                warnings = [r["message"] for r in records if r.get("event") == "warning"]
                assert records[-1]["event"] == "summary" and records[-1]["committed"] == 12
            else:
                warnings = only_dpone_lines(result.stderr)
                assert "12 committed" in result.stderr
            assert len(warnings) == 1, (extra, result.stderr)
            assert setting in warnings[0], (setting, warnings)
            assert "openlineage-python is missing" not in result.stderr
            assert "Traceback" not in result.stderr


def test_the_metrics_final_export_waits_the_whole_budget_and_says_what_it_dropped(
    passing: dict[str, Any], tmp_path: Path
) -> None:
    """Regression: the OpenTelemetry SDK's shutdown had its own 3 s timeout, so with a budget of
    4 s it gave up first and the metrics it dropped went without the run's warning."""
    with hanging_listener() as (url, accepted):
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "DPONE_EXPORT_BUDGET_S": "4",
            "DPONE_XCOM_PATH": str(tmp_path / "xcom.json"),
        }
        took, result = timed(passing, env)
        assert accepted, "the metrics never reached the listener"
    assert result.returncode == 0, result.stderr
    warnings = only_dpone_lines(result.stderr)
    assert any("OpenTelemetry metrics" in w and "unfinished" in w for w in warnings), warnings
    assert took >= 4.0, took  # it waited the budget it was given, not 3 s


def test_an_async_http_event_still_unsent_at_the_budget_is_one_warning(
    passing: dict[str, Any], tmp_path: Path
) -> None:
    """Regression: the async_http transport queues events and sends them on its own thread;
    its close timed out after 1 s and the undelivered START and COMPLETE went without a word."""
    with hanging_listener() as (url, accepted):
        config = tmp_path / "openlineage.yml"
        config.write_text(f"transport:\n  type: async_http\n  url: {url}\n", encoding="utf-8")
        env = {"OPENLINEAGE_CONFIG": str(config), "DPONE_EXPORT_BUDGET_S": str(BUDGET_S)}
        took, result = timed(passing, env)
        assert accepted, "the events never reached the listener"
    assert result.returncode == 0, result.stderr
    warnings = only_dpone_lines(result.stderr)
    assert len(warnings) == 1, result.stderr
    assert "async_http transport still held" in warnings[0], warnings
    assert "unsent" in warnings[0] and "DPONE_EXPORT_BUDGET_S=2 s" in warnings[0], warnings
    assert took >= BUDGET_S - 0.5, took  # it waited (almost) the budget, not the old 1 s
