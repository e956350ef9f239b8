"""Run metrics through OpenTelemetry: off unless the standard OTEL_* environment asks for them.

The orchestrator reports what it already counts (each chunk's outcome, as ``_Tally.record``
sees it) to a :class:`RunObserver`. The default observer does nothing and imports nothing; the
OpenTelemetry one (the ``metrics`` extra: ``opentelemetry-sdk`` + the OTLP/HTTP exporter) is built
only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._METRICS_ENDPOINT``) is set, and imports the
SDK then. Attributes are names the manifest already shows (workload, process, mapping mode, item
index, chunk outcome): never a DSN, a row value or a bound. See docs/observability.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dpone.result import ChunkTiming

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
METER_NAME = "dpone"
#: ChunkTiming statuses that moved (or tried to move) data: their duration is measured.
_TIMED = frozenset({"committed", "failed", "lease_lost"})


@dataclass(frozen=True)
class RunLabels:
    """The attributes every data point of one `dpone run` process carries."""

    workload: str
    process: str
    mode: str  # internal | visible | summary
    item: str  # the mapped item's index, or "internal"

    def attributes(self) -> dict[str, str]:
        return {
            "dpone.workload": self.workload,
            "dpone.process": self.process,
            "dpone.mode": self.mode,
            "dpone.item": self.item,
        }


class RunObserver:
    """What a run reports while it moves chunks; this base class is the silent default."""

    def run_started(self, chunks_selected: int) -> None:
        """Before the first chunk: how many chunks this process was given."""

    def chunk_recorded(self, timing: ChunkTiming) -> None:
        """One chunk's outcome, exactly as the run result counts it."""

    def run_finished(self) -> None:
        """After the last chunk (also on failure): flush and release what was opened."""


def metrics_requested(environ: Mapping[str, str]) -> bool:
    """True when the standard OpenTelemetry variables ask for OTLP metrics."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [e.strip() for e in environ.get("OTEL_METRICS_EXPORTER", "otlp").split(",")]
    if "otlp" not in exporters:
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def open_run_observer(
    labels: RunLabels,
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] = lambda message: None,
) -> RunObserver:
    """The OpenTelemetry observer when metrics are requested, else the silent one.

    Metrics never stop a backfill: a missing extra is a warning, and export errors are the
    SDK's own (logged, not raised).
    """
    env = os.environ if environ is None else environ
    if not metrics_requested(env):
        return RunObserver()
    protocol = env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol.strip() != "http/protobuf":
        warn(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: dpone exports metrics over http/protobuf")
    try:
        return OtelRunObserver(labels, env)
    except ImportError:
        warn(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry packages are missing: "
            "install dpone-runtime[metrics]; this run exports no metrics"
        )
        return RunObserver()


class OtelRunObserver(RunObserver):
    """Counters, a histogram and gauges on a private MeterProvider, pushed over OTLP/HTTP.

    The provider is this run's own (not the global one), read periodically
    (OTEL_METRIC_EXPORT_INTERVAL, 60 s by default) and once more at :meth:`run_finished`, so a
    short run still exports its final figures.
    """

    def __init__(self, labels: RunLabels, environ: Mapping[str, str]) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        resource = Resource.create({} if named else {"service.name": "dpone"})
        self._reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        self._provider = MeterProvider(resource=resource, metric_readers=[self._reader])
        meter = self._provider.get_meter(METER_NAME)
        self._attrs = labels.attributes()
        self._selected = 0
        self._done = 0
        self._chunks: Any = meter.create_counter(
            "dpone.chunks",
            unit="{chunk}",
            description="Chunks by outcome (attribute dpone.outcome)",
        )
        self._rows: Any = meter.create_counter(
            "dpone.rows", unit="{row}", description="Rows written by committed chunks"
        )
        self._duration: Any = meter.create_histogram(
            "dpone.chunk.duration",
            unit="s",
            description="Time to lease, move and complete one chunk",
        )
        self._takeovers: Any = meter.create_counter(
            "dpone.lease.takeovers",
            unit="{lease}",
            description="Chunks leased by a later attempt than the first (a retry, or an expired "
            "lease taken over)",
        )
        self._refusals: Any = meter.create_counter(
            "dpone.fence.refusals",
            unit="{chunk}",
            description="Attempts refused because a newer attempt owns the chunk (lease lost)",
        )
        self._progress: Any = meter.create_gauge(
            "dpone.campaign.progress",
            unit="1",
            description="Share of this process's selected chunks that are committed",
        )
        self._selected_gauge: Any = meter.create_gauge(
            "dpone.campaign.chunks_selected",
            unit="{chunk}",
            description="Chunks this process was given",
        )

    def run_started(self, chunks_selected: int) -> None:
        self._selected = chunks_selected
        self._selected_gauge.set(chunks_selected, self._attrs)
        self._progress.set(0.0, self._attrs)

    def chunk_recorded(self, timing: ChunkTiming) -> None:
        attrs = {**self._attrs, "dpone.outcome": timing.status}
        self._chunks.add(1, attrs)
        if timing.status == "committed":
            self._rows.add(timing.rows or 0, self._attrs)
        if timing.status in _TIMED and timing.duration_ms is not None:
            self._duration.record(timing.duration_ms / 1000.0, attrs)
        if timing.status in _TIMED and (timing.attempt or 0) > 1:
            self._takeovers.add(1, self._attrs)
        if timing.status == "lease_lost":
            self._refusals.add(1, self._attrs)
        if timing.status in ("committed", "skipped_resume"):
            self._done += 1
            if self._selected:
                self._progress.set(self._done / self._selected, self._attrs)

    def run_finished(self) -> None:
        self._provider.shutdown()  # a final collect + export, then the exporter's session closes
