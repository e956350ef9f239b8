"""Each invalid observability setting is ONE warning per `dpone run` process that names it and
says what is wrong, and the run goes on: real `dpone run` processes on a SQLite project (no
database server) against a receiver that keeps every byte, a manifest of two processes among
them (the settings are read again for each), and a listener that never answers."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from dpone.observability.exporting import ExportWorker
from dpone.observability.lineage import parent_problems
from dpone.observability.lineage import settings_problem as lineage_problem
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from .endpoints import hanging_listener
from .receiver import Received, receiver
from .runproject import DPONE
from .sqliteproject import sqlite_project, sqlite_run, warning_lines

PARENT = f"my_ns/my_job/{uuid.uuid4()}"


def lineage_events(got: Received) -> list[dict[str, Any]]:
    return [json.loads(body) for body in got.bodies("/api/v1/lineage")]


def test_a_warning_is_printed_once_per_process_not_once_per_manifest_process(
    tmp_path: Path,
) -> None:
    """Regression: with two processes each warning was printed twice (the settings are read
    again for each process)."""
    project = sqlite_project(tmp_path, ("orders", "orders_copy"))
    with receiver() as (url, got):
        done = sqlite_run(
            project,
            {
                "OPENLINEAGE_URL": "bogus",
                "OTEL_METRIC_EXPORT_INTERVAL": "abc",
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            },
        )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(": passed") == 2, done.stderr
    warnings = warning_lines(done.stderr)
    assert len(warnings) == 2, done.stderr
    assert any(w.startswith("dpone: warning: OPENLINEAGE_URL ") for w in warnings), warnings
    assert any("OTEL_METRIC_EXPORT_INTERVAL must be" in w for w in warnings), warnings
    assert len(got.bodies("/v1/metrics")) == 2  # metrics stayed on, one final export each


def test_the_export_budget_warning_is_printed_once_per_process(tmp_path: Path) -> None:
    """Regression: "unfinished after the export budget" was printed after each process."""
    project = sqlite_project(tmp_path, ("orders", "orders_copy"))
    with hanging_listener() as (url, accepted):
        done = sqlite_run(
            project,
            {
                "OPENLINEAGE_URL": url,
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
                "DPONE_EXPORT_BUDGET_S": "1",
            },
        )
        assert accepted, "the exporters never reached the listener"
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(": passed") == 2, done.stderr
    warnings = warning_lines(done.stderr)
    unfinished = [w for w in warnings if "unfinished after the export budget" in w]
    assert len(unfinished) == 1, done.stderr
    assert "OpenLineage" in unfinished[0] and "OpenTelemetry metrics" in unfinished[0]
    assert len(set(warnings)) == len(warnings), done.stderr


def test_a_later_process_does_not_wait_for_an_earlier_ones_sends(tmp_path: Path) -> None:
    """Regression: the export budget was waited for at the end of each process, so a hanging
    endpoint held the second process's data back by the whole budget. The run waits once,
    after its last process: the first process's summary comes at once, the budget later."""
    project = sqlite_project(tmp_path, ("orders", "orders_copy"))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OTEL_", "OPENLINEAGE"))
    }
    budget = 5.0
    with hanging_listener() as (url, accepted):
        env.update(
            DPONE_CONN_DEMO=project["dsn"],
            OPENLINEAGE_URL=url,
            DPONE_EXPORT_BUDGET_S=str(budget),
        )
        argv = [str(DPONE), "run", "--catalog", project["catalog"], "--workload", "orders"]
        started = time.monotonic()
        with subprocess.Popen(
            [*argv, "--no-progress"],
            env=env,
            cwd=project["folder"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        ) as proc:
            assert proc.stderr is not None
            passed_at = [time.monotonic() - started for line in proc.stderr if ": passed" in line]
            assert proc.wait(timeout=60) == 0
        assert accepted, "the exporters never reached the listener"
    assert len(passed_at) == 2, passed_at
    first, last = passed_at
    assert last - first >= budget - 2.0, passed_at  # the one wait comes after the last process
    assert last <= first + budget + 3.0, passed_at  # and only once


#: (extra env, what the one warning says, what it must not say, whether lineage / metrics flow)
AT_FAULT: list[tuple[dict[str, str], str, str, str]] = [
    # was blamed on OPENLINEAGE_URL ("the transport's settings are incomplete or invalid")
    (
        {"OPENLINEAGE_URL": "{url}", "OPENLINEAGE_CLIENT_LOGGING": "bogus"},
        "OPENLINEAGE_CLIENT_LOGGING is not a logging level name",
        "OPENLINEAGE_URL",
        "none",
    ),
    # passed the check, then "the exporter reported: Invalid key value resource attribute
    # pair ...; the run goes on without it" while metrics were sent
    (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_RESOURCE_ATTRIBUTES": "a=b,,c=d"},
        "OTEL_RESOURCE_ATTRIBUTES has an empty pair",
        "goes on without it",
        "metrics",
    ),
    # failed at each send: "could not send the START event (TypeError: 'str' object is not a
    # mapping)"
    (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "{url}",
            "OPENLINEAGE__TRANSPORT__CUSTOM_HEADERS": "x",
        },
        "OPENLINEAGE__TRANSPORT__CUSTOM_HEADERS is not a mapping of header names to values",
        "TypeError",
        "none",
    ),
    (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "{url}",
            "OPENLINEAGE__TRANSPORT__CUSTOM_HEADERS__X_TEAM": "42",
        },
        "OPENLINEAGE__TRANSPORT__CUSTOM_HEADERS__X_TEAM has a value that is int, not text",
        "InvalidHeader",
        "none",
    ),
    # failed at each send: "UnicodeEncodeError: 'latin-1' codec can't encode characters"
    (
        {"OPENLINEAGE_URL": "{url}", "OPENLINEAGE_API_KEY": "\udcff\udcfe"},
        "OPENLINEAGE_API_KEY holds a character an HTTP header cannot carry",
        "UnicodeEncodeError",
        "none",
    ),
    # ignored without a word
    (
        {"OPENLINEAGE_URL": "{url}", "OPENLINEAGE_PARENT_ID": "garbage"},
        "OPENLINEAGE_PARENT_ID is not namespace/name/runId",
        "OPENLINEAGE_ROOT_PARENT_ID",
        "lineage",
    ),
    (
        {"OPENLINEAGE_URL": "{url}", "OPENLINEAGE_PARENT_ID": "a/b/not-a-uuid"},
        "OPENLINEAGE_PARENT_ID is not namespace/name/runId",
        "OPENLINEAGE_ROOT_PARENT_ID",
        "lineage",
    ),
    (
        {
            "OPENLINEAGE_URL": "{url}",
            "OPENLINEAGE_PARENT_ID": PARENT,
            "OPENLINEAGE_ROOT_PARENT_ID": "a/b/c/d",
        },
        "OPENLINEAGE_ROOT_PARENT_ID is not namespace/name/runId",
        "OPENLINEAGE_PARENT_ID ",
        "lineage",
    ),
]


@pytest.mark.parametrize(("extra", "says", "not_says", "flows"), AT_FAULT)
def test_the_warning_names_the_setting_at_fault_once_and_the_run_goes_on(
    tmp_path: Path, extra: dict[str, str], says: str, not_says: str, flows: str
) -> None:
    project = sqlite_project(tmp_path, ("orders", "orders_copy"))
    with receiver() as (url, got):
        done = sqlite_run(project, {k: v.format(url=url) for k, v in extra.items()})
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(": passed") == 2, done.stderr
    warnings = warning_lines(done.stderr)
    assert len(warnings) == 1, done.stderr
    assert says in warnings[0] and not_says not in warnings[0], warnings
    if flows == "none":
        assert "this run emits no lineage" in warnings[0] and got.posts == []
    elif flows == "metrics":
        bodies = got.bodies("/v1/metrics")
        assert "metrics are exported" in warnings[0] and len(bodies) == 2
        request = ExportMetricsServiceRequest()
        request.ParseFromString(bodies[0])
        resource = request.resource_metrics[0].resource
        attributes = {a.key: a.value.string_value for a in resource.attributes}
        assert (attributes["a"], attributes["c"]) == ("b", "d")  # what the warning says
    else:
        events = lineage_events(got)
        assert [e["eventType"] for e in events] == ["START", "COMPLETE"] * 2
        for event in events:
            parent = event["run"]["facets"].get("parent")
            if "ROOT" in says:  # the parent is kept, the root is not
                assert parent["run"]["runId"] == PARENT.rsplit("/", 1)[1]
                assert parent.get("root") is None
            else:
                assert parent is None


def test_an_exporter_dpone_does_not_run_is_said_in_a_real_run(tmp_path: Path) -> None:
    """Regression: the run only built its observer when OTLP was asked for, so the warning for
    ``OTEL_METRICS_EXPORTER=console`` beside an endpoint was never printed."""
    project = sqlite_project(tmp_path, ("orders", "orders_copy"))
    with receiver() as (url, got):
        done = sqlite_run(
            project, {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_METRICS_EXPORTER": "console"}
        )
    assert done.returncode == 0, done.stderr
    warnings = warning_lines(done.stderr)
    assert len(warnings) == 1 and "OTEL_METRICS_EXPORTER='console'" in warnings[0], warnings
    assert "this run exports no metrics" in warnings[0] and got.posts == []


def test_well_formed_headers_and_parents_are_sent_without_a_warning(tmp_path: Path) -> None:
    project = sqlite_project(tmp_path)
    root = f"dag_ns/my_dag/{uuid.uuid4()}"
    with receiver() as (url, got):
        done = sqlite_run(
            project,
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": url,
                "OPENLINEAGE__TRANSPORT__CUSTOM_HEADERS__X_TEAM": '"42"',
                "OPENLINEAGE__TRANSPORT__AUTH": '{"type": "api_key", "apiKey": "Key-Good-81"}',
                "OPENLINEAGE_PARENT_ID": PARENT,
                "OPENLINEAGE_ROOT_PARENT_ID": root,
            },
        )
    assert done.returncode == 0 and warning_lines(done.stderr) == [], done.stderr
    posts = [(headers, json.loads(body)) for path, headers, body in got.posts]
    assert [event["eventType"] for _, event in posts] == ["START", "COMPLETE"]
    for headers, event in posts:
        assert headers.get("x_team") == "42" and headers["Authorization"] == "Bearer Key-Good-81"
        parent = event["run"]["facets"]["parent"]
        assert parent["root"]["run"]["runId"] == root.rsplit("/", 1)[1]


@pytest.mark.parametrize(
    ("transport", "named"),
    [
        ({"type": "http", "url": "http://h", "custom_headers": "x"}, "{where}.custom_headers"),
        ({"type": "http", "url": "http://h", "custom_headers": {"a b": "1"}}, "{where}.custom"),
        (
            {"type": "http", "url": "http://h", "auth": {"type": "api_key", "apiKey": "k\n"}},
            "{where}.auth.apiKey holds a character",
        ),
        (
            {
                "type": "composite",
                "transports": {"one": {"type": "http", "url": "http://h", "custom_headers": 5}},
            },
            "{where}.transports.one.custom_headers",
        ),
    ],
)
def test_a_transports_headers_are_checked_in_the_file_and_the_json_variable(
    tmp_path: Path, transport: dict[str, Any], named: str
) -> None:
    whole = {"OPENLINEAGE__TRANSPORT": json.dumps(transport), "HOME": "/nonexistent"}
    problem = lineage_problem(whole, cwd="/nonexistent")
    assert problem is not None and problem.startswith(named.format(where="OPENLINEAGE__TRANSPORT"))
    config = tmp_path / "openlineage.yml"
    config.write_text(json.dumps({"transport": transport}), encoding="utf-8")
    problem = lineage_problem({"OPENLINEAGE_CONFIG": str(config), "HOME": "/nonexistent"})
    assert problem is not None and problem.startswith(named.format(where="transport"))


def test_parent_problems_name_the_variable_never_the_value() -> None:
    assert (
        parent_problems({"OPENLINEAGE_PARENT_ID": PARENT, "OPENLINEAGE_ROOT_PARENT_ID": " "}) == []
    )
    problems = parent_problems(
        {"OPENLINEAGE_PARENT_ID": "tok-3391", "OPENLINEAGE_ROOT_PARENT_ID": "a/b/c/d"}
    )
    assert [p.split(" ", 1)[0] for p in problems] == [
        "OPENLINEAGE_PARENT_ID",
        "OPENLINEAGE_ROOT_PARENT_ID",
    ]
    assert not any("tok-3391" in p or "a/b/c/d" in p for p in problems)


def test_a_worker_prints_each_distinct_warning_once() -> None:
    warned: list[str] = []
    worker = ExportWorker(0.0, warned.append)
    once = worker.once(warned.append)
    for message in ("A is bad", "B is bad", "A is bad"):
        once(message)
    worker.problem("OpenLineage", "could not send")
    worker.problem("OpenLineage", "could not send again")
    worker.drain()
    worker.drain()
    assert warned == [
        "A is bad",
        "B is bad",
        "OpenLineage: could not send; the run goes on without it",
    ]
