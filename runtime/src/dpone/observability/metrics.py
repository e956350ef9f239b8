"""Run metrics through OpenTelemetry: off unless the standard OTEL_* environment asks for them.

The orchestrator reports what it already counts (each chunk's outcome, as ``_Tally.record``
sees it) to a :class:`RunObserver`. The default observer does nothing and imports nothing; the
OpenTelemetry one (the ``metrics`` extra: ``opentelemetry-sdk`` + the OTLP/HTTP exporter) is built
only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._METRICS_ENDPOINT``) is set, and imports the
SDK then. Attributes are names the manifest already shows (workload, process, mapping mode, item
index, chunk outcome) and, under Airflow, the DAG and task ids: never a DSN, a row value, a bound
or a per-run value (run id, try number). See docs/observability.md.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from dpone.credentials.redaction import redact_text
from dpone.observability.exporting import (
    DEFAULT_BUDGET_S,
    ENDPOINT_VARIABLES,
    ExportWorker,
    RunObserver,
    build_client,
    metrics_requested,
    one_line_warnings,
    register_exporter_secrets,
    unserved_exporters,
)
from dpone.observability.result import ChunkTiming
from dpone.records import record

METER_NAME = "dpone"
#: ChunkTiming statuses that moved (or tried to move) data: their duration is measured.
_TIMED = frozenset({"committed", "failed", "lease_lost"})
#: What a run exports: (instrument kind, name, unit, description).
INSTRUMENTS: tuple[tuple[str, str, str, str], ...] = (
    ("counter", "dpone.chunks", "{chunk}", "Chunks by outcome (attribute dpone.outcome)"),
    ("counter", "dpone.rows", "{row}", "Rows written by committed chunks"),
    ("histogram", "dpone.chunk.duration", "s", "Time to lease, move and complete one chunk"),
    (
        "counter",
        "dpone.lease.takeovers",
        "{lease}",
        "Chunks leased by a later attempt than the first (a retry, or an expired lease taken "
        "over)",
    ),
    (
        "counter",
        "dpone.fence.refusals",
        "{chunk}",
        "Attempts refused because a newer attempt owns the chunk (lease lost)",
    ),
    (
        "gauge",
        "dpone.campaign.progress",
        "1",
        "Share of this process's selected chunks that are committed",
    ),
    ("gauge", "dpone.campaign.chunks_selected", "{chunk}", "Chunks this process was given"),
)
#: RunLabels' fields every data point carries as ``dpone.<field>``.
_LABEL_FIELDS = ("workload", "process", "mode", "item")


@record
class RunLabels:
    """The attributes every data point of one `dpone run` process carries.

    Bounded cardinality: each is fixed by the catalog (the item index by its ``max_items``).
    Under Airflow the DAG and task ids are added (from DPONE_AIRFLOW_CONTEXT); never the run id,
    try number, map index or dates, which would make every run a new series. A run outside
    Airflow carries neither."""

    workload: str
    process: str
    mode: str  # internal | visible | summary
    item: str  # the mapped item's index, or "internal"
    dag_id: str | None = None  # the Airflow DAG id, None outside Airflow
    task_id: str | None = None  # the Airflow task id, None outside Airflow

    def attributes(self) -> dict[str, str]:
        attributes = {f"dpone.{name}": getattr(self, name) for name in _LABEL_FIELDS}
        if self.dag_id is not None:
            attributes["airflow.dag_id"] = self.dag_id
        if self.task_id is not None:
            attributes["airflow.task_id"] = self.task_id
        return attributes


#: OpenTelemetry variables whose value is a whole number of milliseconds -> the SDK's default
_MILLISECONDS = {"OTEL_METRIC_EXPORT_INTERVAL": 60_000, "OTEL_METRIC_EXPORT_TIMEOUT": 30_000}
#: the longest interval or timeout taken (a day): beyond it the SDK's reader thread overflows
#: its timer (and a longer one means no periodic export anyway; the run's final one is kept)
MAX_MILLISECONDS = 86_400_000
#: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE values the exporter knows; the first is its
#: default
_TEMPORALITIES = ("cumulative", "delta", "lowmemory")
_HISTOGRAMS = ("explicit_bucket_histogram", "base2_exponential_bucket_histogram")
#: OpenTelemetry variables whose value is a timeout greater than 0
_TIMEOUTS = ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")
_COMPRESSIONS = ("gzip", "deflate", "none")
#: an HTTP header name (RFC 9110 token); the SDK drops a pair whose name is not one, quoting it
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def settings_problem(environ: Mapping[str, str]) -> str | None:
    """What is wrong with the OpenTelemetry metrics settings, naming the variable, or None.

    Checked before the SDK is built: the SDK raises on some (a negative interval) and only logs
    others at the first export; here each is one warning and the run goes on without metrics."""
    for name in ENDPOINT_VARIABLES:
        given = environ.get(name, "")
        endpoint = given.strip()
        if not endpoint:
            continue
        if endpoint != given:  # the SDK takes the value as it is
            return f"{name} has white space around the URL"
        try:
            parts = urlsplit(endpoint)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            return f"{name} is not a valid URL (bad host or port)"
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            return f"{name} is not an http:// or https:// URL with a host"
    for name in _TIMEOUTS:
        value = environ.get(name)
        if value is None:
            continue
        try:
            number = float(value.strip())
        except ValueError:
            number = math.nan
        if not 0 < number < math.inf:
            return f"{name} must be a number greater than 0"
    for name in ("OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"):
        value = environ.get(name)
        if value is not None and value.strip().lower() not in _COMPRESSIONS:
            return f"{name} must be one of {', '.join(_COMPRESSIONS)}"
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS"):
        value = environ.get(name)
        if value is not None and value.strip():
            pairs = [pair for pair in value.split(",") if pair.strip()]
            if any(
                "=" not in pair or not _HEADER_NAME.fullmatch(pair.partition("=")[0].strip())
                for pair in pairs
            ):
                return f"{name} must be name=value pairs separated by commas (HTTP header names)"
    attributes = environ.get("OTEL_RESOURCE_ATTRIBUTES")
    if attributes is not None and attributes.strip():
        pairs = [pair for pair in attributes.split(",") if pair.strip()]
        if any("=" not in pair or not pair.partition("=")[0].strip() for pair in pairs):
            return "OTEL_RESOURCE_ATTRIBUTES must be key=value pairs separated by commas"
    for name in ("OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"):
        value = environ.get(name)
        if value and not os.path.isfile(value):
            return f"{name} names no readable file"
    return None


def export_millis(environ: Mapping[str, str]) -> tuple[dict[str, int], list[str]]:
    """The reader's interval and timeout (OTEL_METRIC_EXPORT_INTERVAL / _TIMEOUT) and what is
    wrong with them: a value that is not 1 to MAX_MILLISECONDS in ASCII digits is named, and the
    default is used (the SDK itself would take ``²`` or ``1e30`` and fail later)."""
    values: dict[str, int] = {}
    problems: list[str] = []
    for name, default in _MILLISECONDS.items():
        text = environ.get(name)
        values[name] = default
        if text is None:
            continue
        digits = text.strip()
        if digits.isascii() and digits.isdigit() and 0 < int(digits) <= MAX_MILLISECONDS:
            values[name] = int(digits)
        else:
            problems.append(
                f"{name} must be a whole number of milliseconds from 1 to {MAX_MILLISECONDS}; "
                f"the default {default} is used"
            )
    return values, problems


#: how the SDK's own log record names a setting a fallback problem names (it logs the resource
#: attributes' problem without the variable, on a resource detector's thread)
_SDK_WORDS = {"OTEL_RESOURCE_ATTRIBUTES": "resource attribute pair"}


def fallback_problems(environ: Mapping[str, str]) -> list[str]:
    """The metrics settings that the exporter replaces by its default or skips (it logs, and
    goes on), each named with what really happens."""
    problems = []
    attributes = environ.get("OTEL_RESOURCE_ATTRIBUTES")
    if attributes and any(not pair.strip() for pair in attributes.split(",")):
        problems.append(
            "OTEL_RESOURCE_ATTRIBUTES has an empty pair (two commas in a row, or a comma at an "
            "end); it is skipped, and metrics are exported with the other attributes"
        )
    name = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
    value = environ.get(name)
    if value is not None and value.strip().lower() not in _TEMPORALITIES:
        problems.append(
            f"{name} must be one of {', '.join(_TEMPORALITIES)}; "
            f"the default ({_TEMPORALITIES[0]}) is used"
        )
    name = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
    value = environ.get(name)
    if value is not None and value not in _HISTOGRAMS:
        problems.append(
            f"{name} must be one of {', '.join(_HISTOGRAMS)}; the default ({_HISTOGRAMS[0]}) "
            "is used"
        )
    return problems


def open_run_observer(
    labels: RunLabels,
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] = lambda message: None,
    exports: ExportWorker | None = None,
) -> RunObserver:
    """The OpenTelemetry observer when metrics are requested, else the silent one.

    Metrics never stop a backfill: a missing extra or an unusable setting is one warning (naming
    the setting) and the run goes on without metrics; sends run on the export worker.
    """
    env = os.environ if environ is None else environ
    if not metrics_requested(env):
        return RunObserver()
    # one worker per `dpone run` process: a warning its other processes gave is not repeated
    worker = exports or ExportWorker(DEFAULT_BUDGET_S, warn)
    warn = worker.once(one_line_warnings(warn))
    unserved = unserved_exporters(env)
    if unserved:
        warn(
            f"OTEL_METRICS_EXPORTER={unserved!r}: dpone exports metrics over OTLP only "
            "(otlp); this run exports no metrics"
        )
        return RunObserver()
    register_exporter_secrets(env)
    for name in ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(name)
        if protocol:  # the metrics one wins, as in the SDK
            if protocol.strip() != "http/protobuf":
                warn(f"{name}={protocol.strip()[:40]!r}: dpone exports metrics over http/protobuf")
            break
    problem = settings_problem(env)
    if problem is not None:
        warn(f"{problem}; this run exports no metrics")
        return RunObserver()
    millis, fallbacks = export_millis(env)
    fallbacks += fallback_problems(env)
    for fallback in fallbacks:
        warn(fallback)
        # what the SDK logs about a setting named here (also later, on a thread of its own)
        # says nothing new
        name = fallback.split(" ", 1)[0]
        for fragment in (name, _SDK_WORDS.get(name)):
            if fragment:
                worker.expect("OpenTelemetry metrics", fragment)
    observer, records = build_client(
        lambda: OtelRunObserver(labels, env, worker, millis),
        warn,
        "the OpenTelemetry metrics settings (OTEL_*) are invalid",
        "this run exports no metrics",
        missing="OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry packages are missing: "
        "install the dpone-runtime wheel with its [metrics] extra, by path "
        "(docs/deploy-kubernetes.md); this run exports no metrics",
    )
    if observer is None:
        return RunObserver()
    records = [r for r in records if not worker.expected("OpenTelemetry metrics", r)]
    if records:
        worker.problem(
            "OpenTelemetry metrics",
            f"the SDK reported at start-up: {records[0]}",
            "metrics are exported as the SDK set them up",
        )
    return observer


class OtelRunObserver(RunObserver):
    """Counters, a histogram and gauges on a private MeterProvider, pushed over OTLP/HTTP.

    The provider is this run's own (not the global one), read periodically
    (OTEL_METRIC_EXPORT_INTERVAL, 60 s by default) and once more at :meth:`run_finished`, so a
    short run still exports its final figures.
    """

    def __init__(
        self,
        labels: RunLabels,
        environ: Mapping[str, str],
        exports: ExportWorker,
        millis: Mapping[str, int] | None = None,
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        resource = Resource.create({} if named else {"service.name": "dpone"})
        self._exports = exports
        # the interval and timeout as checked (export_millis), never the SDK's own reading
        millis = millis if millis is not None else export_millis(environ)[0]
        self._reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(),
            export_interval_millis=millis["OTEL_METRIC_EXPORT_INTERVAL"],
            export_timeout_millis=millis["OTEL_METRIC_EXPORT_TIMEOUT"],
        )
        # no atexit shutdown: the final export runs on the export worker, within the budget
        self._provider = MeterProvider(
            resource=resource, metric_readers=[self._reader], shutdown_on_exit=False
        )
        meter = self._provider.get_meter(METER_NAME)
        self._attrs = {key: redact_text(value) for key, value in labels.attributes().items()}
        self._selected = 0
        self._done = 0
        self._metric: dict[str, Any] = {
            name: getattr(meter, f"create_{kind}")(name, unit=unit, description=description)
            for kind, name, unit, description in INSTRUMENTS
        }

    def run_started(self, chunks_selected: int) -> None:
        self._selected = chunks_selected
        self._metric["dpone.campaign.chunks_selected"].set(chunks_selected, self._attrs)
        self._metric["dpone.campaign.progress"].set(0.0, self._attrs)

    def chunk_recorded(self, timing: ChunkTiming) -> None:
        attrs = {**self._attrs, "dpone.outcome": timing.status}
        self._metric["dpone.chunks"].add(1, attrs)
        if timing.status == "committed":
            self._metric["dpone.rows"].add(timing.rows or 0, self._attrs)
        if timing.status in _TIMED and timing.duration_ms is not None:
            self._metric["dpone.chunk.duration"].record(timing.duration_ms / 1000.0, attrs)
        if timing.status in _TIMED and (timing.attempt or 0) > 1:
            self._metric["dpone.lease.takeovers"].add(1, self._attrs)
        if timing.status == "lease_lost":
            self._metric["dpone.fence.refusals"].add(1, self._attrs)
        if timing.status in ("committed", "skipped_resume"):
            self._done += 1
            if self._selected:
                self._metric["dpone.campaign.progress"].set(
                    self._done / self._selected, self._attrs
                )

    def run_finished(self) -> None:
        """The final collect + export and the exporter's close, on the export worker."""
        self._exports.submit("OpenTelemetry metrics", "final export", self._shutdown)

    def _shutdown(self) -> None:
        # The SDK gives up a second after the run's own wait does (DPONE_EXPORT_BUDGET_S): had it
        # its own, shorter timeout, what it dropped would go without the run's one warning.
        self._provider.shutdown(timeout_millis=(self._exports.budget_s + 1.0) * 1000)
