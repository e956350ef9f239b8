"""Exporter settings checked before a client is built, and what the libraries' own threads may
do: no value crashes the check, each warning is one line that names the setting and says what
really happens, and an exception that ends a library thread becomes the exporter's warning (no
database needed)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from dpone.observability.exporting import (
    ExportWorker,
    escape_controls,
    one_line_warnings,
    route_thread_exceptions,
)
from dpone.observability.lineage import settings_problem as lineage_problem
from dpone.observability.lineage import transport_setting
from dpone.observability.metrics import (
    MAX_MILLISECONDS,
    RunLabels,
    export_millis,
    fallback_problems,
    open_run_observer,
)
from dpone.observability.metrics import settings_problem as metrics_problem

from .receiver import receiver
from .runproject import DPONE
from .sqliteproject import sqlite_project

LABELS = RunLabels(workload="w", process="p", mode="internal", item="internal")


@pytest.fixture
def restored_excepthook() -> Iterator[None]:
    saved = threading.excepthook
    try:
        yield
    finally:
        threading.excepthook = saved


@pytest.mark.parametrize("name", ["OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT"])
@pytest.mark.parametrize(
    "value", ["\u00b2", "\u0663", "99999999999999999999", str(MAX_MILLISECONDS + 1), "0", "-5"]
)
def test_a_bad_interval_or_timeout_is_named_and_the_default_used(name: str, value: str) -> None:
    """Regression: ``²`` passed ``str.isdigit`` and ``int()`` raised (DPONE_INTERNAL); a huge
    value passed and the SDK's reader thread died with OverflowError."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", name: value}
    assert metrics_problem(env) is None  # never raises, never turns metrics off
    values, problems = export_millis(env)
    assert values[name] == {"OTEL_METRIC_EXPORT_INTERVAL": 60_000}.get(name, 30_000)
    assert len(problems) == 1 and problems[0].startswith(f"{name} must be a whole number")
    assert "the default" in problems[0] and (len(value) < 3 or value not in problems[0])


def test_a_good_interval_and_timeout_are_taken() -> None:
    values, problems = export_millis(
        {"OTEL_METRIC_EXPORT_INTERVAL": " 500 ", "OTEL_METRIC_EXPORT_TIMEOUT": "86400000"}
    )
    assert values == {"OTEL_METRIC_EXPORT_INTERVAL": 500, "OTEL_METRIC_EXPORT_TIMEOUT": 86400000}
    assert problems == []


def test_an_unknown_temporality_says_the_default_is_used_once() -> None:
    """Regression: the SDK's log line became "...; the run goes on without it" while the
    metrics were exported, with the cumulative default."""
    name = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
    assert fallback_problems({name: "Delta "}) == []
    with receiver() as (url, _):
        warned: list[str] = []
        worker = ExportWorker(1.0, warned.append)
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, name: "bogus"}
        observer = open_run_observer(LABELS, env, warned.append, worker)
        worker.drain()
        assert type(observer).__name__ == "OtelRunObserver"  # metrics are on
        observer._provider.shutdown(timeout_millis=1000)  # type: ignore[attr-defined]
    assert warned == [
        f"{name} must be one of cumulative, delta, lowmemory; the default (cumulative) is used"
    ]


@pytest.mark.parametrize("value", ["{bogus", '"http"', "[1, 2]", "{}"])
def test_a_transport_variable_that_is_no_json_object_is_named(value: str) -> None:
    """Regression: ``OPENLINEAGE__TRANSPORT={bogus`` was reported against OPENLINEAGE_URL
    (unset) as "AttributeError: 'str' object has no attribute 'get'"."""
    env = {"OPENLINEAGE__TRANSPORT": value, "HOME": "/nonexistent"}
    problem = lineage_problem(env, cwd="/nonexistent")
    assert problem is not None and problem.startswith("OPENLINEAGE__TRANSPORT "), problem
    assert "AttributeError" not in problem and "OPENLINEAGE_URL" not in problem
    assert transport_setting(env) == "OPENLINEAGE__TRANSPORT"


def test_a_transport_variable_is_checked_like_the_config_file() -> None:
    env = {"OPENLINEAGE__TRANSPORT": '{"type": "http", "url": "x"}', "HOME": "/nonexistent"}
    assert lineage_problem(env, cwd="/nonexistent") == (
        "OPENLINEAGE__TRANSPORT.url is not an http:// or https:// URL with a host"
    )
    good = {"OPENLINEAGE__TRANSPORT": '{"type": "http", "url": "http://h:5000"}'}
    assert lineage_problem({**good, "HOME": "/nonexistent"}, cwd="/nonexistent") is None
    ipv6 = {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": "http://[::1]:5"}
    assert lineage_problem({**ipv6, "HOME": "/nonexistent"}, cwd="/nonexistent") is None


def test_every_warning_is_one_line_whatever_the_path_holds(tmp_path: Path) -> None:
    """Regression: a newline in OPENLINEAGE_CONFIG's path was printed raw, so the warning's
    second line could imitate an error record."""
    assert (
        escape_controls("a\nb\r\x1b[2K\u2028\u202e\tc d") == "a\\nb\\r\\x1b[2K\\u2028\\u202e\\tc d"
    )
    assert escape_controls("plain é ü") == "plain é ü"
    folder = tmp_path / "x\nerror: DPONE_FAKE: forged"
    folder.mkdir()
    (folder / "openlineage.yml").write_text("transport: [1\n", encoding="utf-8")
    env = {"OPENLINEAGE_CONFIG": str(folder / "openlineage.yml"), "HOME": "/nonexistent"}
    warned: list[str] = []
    problem = lineage_problem(env, cwd="/nonexistent")
    assert problem is not None
    one_line_warnings(warned.append)(problem)
    assert len(warned) == 1 and warned[0].splitlines() == [warned[0]]
    assert "x\\nerror: DPONE_FAKE: forged/openlineage.yml" in warned[0]


def test_an_exception_ending_a_library_thread_is_the_exporters_one_warning(
    restored_excepthook: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """Regression: the SDK's reader thread died with a raw 14-line traceback on stderr
    ("Exception in thread OtelPeriodicExportingMetricReader ... OverflowError"), not JSON in
    JSON log mode."""
    warned: list[str] = []
    worker = ExportWorker(1.0, warned.append)
    route_thread_exceptions(worker)
    route_thread_exceptions(worker)  # idempotent: one hook, not two

    def overflow() -> None:
        raise OverflowError("timestamp out of range for platform time_t")

    for _ in range(2):
        thread = threading.Thread(target=overflow, name="OtelPeriodicExportingMetricReader")
        thread.start()
        thread.join()
    worker.drain()
    assert capfd.readouterr().err == ""
    assert warned == [
        "OpenTelemetry metrics: its background thread stopped (OverflowError: timestamp out of "
        "range for platform time_t); the run goes on without it"
    ]


def test_another_threads_exception_still_reaches_the_previous_hook(
    restored_excepthook: None,
) -> None:
    seen: list[str] = []
    threading.excepthook = lambda args: seen.append(args.exc_type.__name__)
    worker = ExportWorker(1.0, lambda message: None)
    route_thread_exceptions(worker)

    def boom() -> None:
        raise KeyError("x")

    thread = threading.Thread(target=boom, name="some-other-thread")
    thread.start()
    thread.join()
    assert seen == ["KeyError"]


@pytest.mark.parametrize("exporters", ["console", "prometheus", "console,prometheus"])
def test_an_exporter_dpone_does_not_run_is_one_warning(exporters: str) -> None:
    """Metrics asked for (an endpoint) through an exporter other than OTLP: none is sent, and the
    warning says so instead of turning metrics off without a word."""
    warned: list[str] = []
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_METRICS_EXPORTER": exporters,
    }
    observer = open_run_observer(LABELS, env, warned.append)
    assert type(observer).__name__ == "RunObserver"
    assert len(warned) == 1 and warned[0].startswith(f"OTEL_METRICS_EXPORTER={exporters!r}")
    for quiet in ("none", "otlp,console"):
        warned.clear()
        open_run_observer(LABELS, {**env, "OTEL_METRICS_EXPORTER": quiet}, warned.append)
        assert not any("OTEL_METRICS_EXPORTER" in w for w in warned), warned


def test_the_protocol_warning_names_the_variable_that_set_it() -> None:
    with receiver() as (url, _):
        warned: list[str] = []
        worker = ExportWorker(1.0, warned.append)
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }
        observer = open_run_observer(LABELS, env, warned.append, worker)
        worker.drain()
        observer._provider.shutdown(timeout_millis=1000)  # type: ignore[attr-defined]
    assert warned[0].startswith("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL='grpc'"), warned


def test_a_process_with_no_home_runs_with_lineage_off(tmp_path: Path) -> None:
    """A pod's uid may have no passwd entry and no HOME: looking for ~/.openlineage/ must not
    fail the run (it raised RuntimeError, DPONE_INTERNAL), lineage being off. The child process
    is a real `dpone run` whose passwd lookup finds no entry, as for such a uid."""
    project = sqlite_project(tmp_path)
    no_passwd_entry = (
        "import pwd, sys\n"
        "def missing(uid):\n"
        "    raise KeyError(f'getpwuid(): uid not found: {uid}')\n"
        "pwd.getpwuid = missing\n"
        "from dpone.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {"PATH": os.environ["PATH"], "DPONE_CONN_DEMO": project["dsn"]}  # no HOME
    argv = ["run", "--catalog", project["catalog"], "--workload", "orders", "--no-progress"]
    done = subprocess.run(
        [str(Path(DPONE).with_name("python")), "-c", no_passwd_entry, *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "passed" in done.stdout + done.stderr and "warning" not in done.stderr
