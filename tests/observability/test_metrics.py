"""OpenTelemetry metrics from a real `dpone run` process against the real Postgres, pushed over
OTLP/HTTP to a loopback receiver, decoded with the OpenTelemetry protobuf definitions and checked
against the ledger; off by default (no request, no OpenTelemetry import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from dpone.observability.metrics import RunLabels, metrics_requested, open_run_observer
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from .receiver import receiver
from .runproject import PASSWORD, dpone_run

pytestmark = pytest.mark.postgres


def decode(body: bytes) -> dict[str, list[tuple[dict[str, str], Any]]]:
    """metric name -> [(attributes, data point)] of one ExportMetricsServiceRequest."""
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    found: dict[str, list[tuple[dict[str, str], Any]]] = {}
    for resource in request.resource_metrics:
        service = {a.key: a.value.string_value for a in resource.resource.attributes}
        assert service["service.name"] == "dpone"
        for scope in resource.scope_metrics:
            assert scope.scope.name == "dpone"
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    attrs = {a.key: a.value.string_value for a in point.attributes}
                    found.setdefault(metric.name, []).append((attrs, point))
    return found


def ledger_figures(project: dict[str, Any]) -> dict[str, int]:
    with psycopg.connect(project["pg"]) as conn:
        rows = conn.execute(
            f"SELECT state, count(*), coalesce(sum(rows_moved), 0) FROM "
            f"{project['schema']}_audit.chunk_transition WHERE state IN ('committed', 'failed') "
            "GROUP BY state"
        ).fetchall()
    figures = {f"{state}_chunks": int(n) for state, n, _ in rows}
    figures["rows"] = sum(int(moved) for state, _, moved in rows if state == "committed")
    return figures


def test_a_run_exports_its_figures_and_they_match_the_ledger(project: dict[str, Any]) -> None:
    with receiver() as (url, got):
        first = dpone_run(project, {"OTEL_EXPORTER_OTLP_ENDPOINT": url})
        assert first.returncode != 0 and "DPONE_SINK_FAILED" in first.stderr  # the bad day
        bodies = got.bodies("/v1/metrics")
        assert bodies, first.stderr
        raw = b"".join(bodies)
        assert PASSWORD.encode() not in raw and b"postgres" not in raw  # no DSN in any form
        metrics = decode(bodies[-1])  # cumulative: the final export holds the run's totals
        ledger = ledger_figures(project)
        base = {
            "dpone.workload": "orders",
            "dpone.process": "orders",
            "dpone.mode": "internal",
            "dpone.item": "internal",
        }
        chunks = {a["dpone.outcome"]: p.as_int for a, p in metrics["dpone.chunks"]}
        assert all({k: a[k] for k in base} == base for a, _ in metrics["dpone.chunks"])
        assert chunks == {"committed": 11, "failed": 1}
        assert chunks["committed"] == ledger["committed_chunks"]
        assert chunks["failed"] == ledger["failed_chunks"]
        ((attrs, rows),) = metrics["dpone.rows"]
        assert attrs == base and rows.as_int == ledger["rows"] == 1100
        durations = {a["dpone.outcome"]: p for a, p in metrics["dpone.chunk.duration"]}
        assert durations["committed"].count == 11 and durations["failed"].count == 1
        assert 0 < durations["committed"].sum < 60
        ((_, progress),) = metrics["dpone.campaign.progress"]
        assert progress.as_double == pytest.approx(11 / 12)
        ((_, selected),) = metrics["dpone.campaign.chunks_selected"]
        assert selected.as_int == 12
        assert "dpone.lease.takeovers" not in metrics and "dpone.fence.refusals" not in metrics

        # fix the bad day; the re-run skips the committed chunks and retries the failed one
        with psycopg.connect(project["pg"], autocommit=True) as conn:
            conn.execute(f"UPDATE {project['schema']}.raw_orders SET amount = 1 WHERE amount < 0")
        count_before = len(got.bodies("/v1/metrics"))
        second = dpone_run(project, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": url + "/v1/metrics"})
        assert second.returncode == 0, second.stderr
        metrics = decode(got.bodies("/v1/metrics")[-1])
        assert len(got.bodies("/v1/metrics")) > count_before
    chunks = {a["dpone.outcome"]: p.as_int for a, p in metrics["dpone.chunks"]}
    assert chunks == {"committed": 1, "skipped_resume": 11}
    ((_, takeovers),) = metrics["dpone.lease.takeovers"]
    assert takeovers.as_int == 1  # the failed chunk's second attempt
    ((_, progress),) = metrics["dpone.campaign.progress"]
    assert progress.as_double == 1.0
    assert ledger_figures(project)["committed_chunks"] == 12


def _context(run_id: str, try_number: int) -> str:
    return json.dumps(
        {
            "schema": "dpone.airflow-context.v1",
            "dag_id": "dpone_orders",
            "task_id": "run_orders",
            "run_id": run_id,
            "try_number": try_number,
            "map_index": -1,
            "logical_date": f"2024-03-0{try_number}T00:00:00+00:00",
            "data_interval_start": None,
            "data_interval_end": None,
        }
    )


def test_under_airflow_the_dag_and_task_label_every_point_never_the_run(
    project: dict[str, Any],
) -> None:
    """Two Airflow runs (different run ids, tries and logical dates) report into the same series:
    the DAG and task ids are labels, the run id, try number and date are in no request byte."""
    runs = (("manual__2024-03-01T00:00:00+00:00", 3), ("scheduled__2024-03-02T00:00:00", 1))
    series: list[set[tuple[str, tuple[tuple[str, str], ...]]]] = []
    with receiver() as (url, got):
        for run_id, try_number in runs:
            before = len(got.bodies("/v1/metrics"))
            env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
                "DPONE_AIRFLOW_CONTEXT": _context(run_id, try_number),
            }
            done = dpone_run(project, env)
            assert "DPONE_SINK_FAILED" in done.stderr or done.returncode == 0, done.stderr
            bodies = got.bodies("/v1/metrics")[before:]
            assert bodies, done.stderr
            raw = b"".join(bodies)
            for per_run in (run_id, run_id.split("__")[1], "2024-03-0", "manual__", "scheduled__"):
                assert per_run.encode() not in raw, per_run
            metrics = decode(bodies[-1])
            keys = set()
            for name, points in metrics.items():
                for attrs, _ in points:
                    assert attrs["airflow.dag_id"] == "dpone_orders", (name, attrs)
                    assert attrs["airflow.task_id"] == "run_orders", (name, attrs)
                    assert str(try_number) not in {attrs[k] for k in attrs if k != "dpone.item"}
                    keys.add((name, tuple(sorted(attrs.items()))))
            series.append(
                {(n, a) for n, a in keys if n in ("dpone.rows", "dpone.campaign.chunks_selected")}
            )
            with psycopg.connect(project["pg"], autocommit=True) as conn:
                conn.execute(
                    f"UPDATE {project['schema']}.raw_orders SET amount = 1 WHERE amount < 0"
                )
    assert series[0] == series[1] and len(series[0]) == 2  # one series each, whatever the run
    expected = {
        "dpone.workload", "dpone.process", "dpone.mode", "dpone.item", "airflow.dag_id",
        "airflow.task_id",
    }  # fmt: skip
    for _, attrs in series[0]:
        assert {k for k, _ in attrs} == expected


def test_metrics_are_off_by_default_and_import_nothing(project: dict[str, Any]) -> None:
    assert not metrics_requested({})
    assert not metrics_requested(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}
    )
    assert not metrics_requested(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_METRICS_EXPORTER": "none"}
    )
    labels = RunLabels("w", "p", "internal", "internal")
    assert type(open_run_observer(labels, {})).__name__ == "RunObserver"
    probe = (
        "import sys, runpy; sys.argv = ['dpone', 'run', '--catalog', sys.argv[1], '--workload', "
        "'orders', '--process', 'orders', '--no-progress']\n"
        "from dpone.cli import main\ncode = main(sys.argv[1:])\n"
        "print('OTEL_IMPORTED' if any(m.startswith('opentelemetry') for m in sys.modules) else "
        "'CLEAN', code)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OTEL_"))}
    env["DPONE_CONN_WH"] = project["dsn"]
    done = subprocess.run(
        [sys.executable, "-c", probe, project["catalog"]],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.startswith("CLEAN"), done.stdout + done.stderr


def test_a_missing_extra_is_a_warning_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_otel(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_otel)
    warnings: list[str] = []
    observer = open_run_observer(
        RunLabels("w", "p", "internal", "internal"),
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
        warnings.append,
    )
    assert type(observer).__name__ == "RunObserver"
    assert warnings and "[metrics] extra" in warnings[0]
