"""Exporters run off the data path: daemon threads (one per exporter) send what OpenLineage and
OpenTelemetry have to send, and the run waits for them only at its end, within a small total
budget. (The clients are built on the run's thread before the first chunk: that imports the
libraries and reads their settings, and sends nothing.)

An endpoint that hangs, refuses, answers slowly or does not resolve can therefore delay neither
the first chunk nor any chunk, and delays the end of a `dpone run` process by at most
``DPONE_EXPORT_BUDGET_S`` seconds in all (3 by default; at most 1 once SIGTERM or SIGINT asked the
process to stop, so a pod always leaves within its grace period). The run result, XCom and
evidence are written before the run waits. What is still unsent when the budget is spent is
dropped with one warning; the senders are daemon threads, so they never hold the process.

The exporter libraries' own log records and Python warnings never reach stderr as they are: they
become at most one ``dpone: warning:`` line per exporter (redacted, one line), the same as a send
that failed. See docs/observability.md.

Whether lineage or metrics are asked for, and the silent lineage and observer a run uses when they
are not, live here too: a run without exporters never imports dpone.observability.lineage nor dpone.observability.metrics
(nor their libraries).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import threading
import time
import unicodedata
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import unquote

from dpone.credentials.redaction import (
    json_secrets,
    redact_text,
    register_secret,
    secret_env_name,
)
from dpone.lifecycle.interrupt import STOP

if TYPE_CHECKING:
    from dpone.observability.result import ChunkTiming

BUDGET_VARIABLE = "DPONE_EXPORT_BUDGET_S"
DEFAULT_BUDGET_S = 3.0
MAX_BUDGET_S = 60.0
#: the most the process waits for exporters once a stop (SIGTERM / SIGINT) was requested
STOP_BUDGET_S = 1.0
#: the libraries behind the exporters, whose loggers dpone takes over
#: (their HTTP clients' records are dropped: the exporter's own failure says it once)
LIBRARY_LOGGERS: dict[str, str | None] = {
    "openlineage": "OpenLineage",
    "opentelemetry": "OpenTelemetry metrics",
    "urllib3": None,
    "requests": None,
}
_MESSAGE_LIMIT = 200
#: the OpenTelemetry variables whose value turns metrics on (dpone.observability.metrics)
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: thread id -> the library messages collected on that thread (see collected_library_records)
_COLLECTING: dict[int, list[str]] = {}


# --- the exporters' own secrets -------------------------------------------------------------------
def register_exporter_secrets(environ: Mapping[str, str]) -> None:
    """Redact the exporters' credentials from everything dpone writes: an API key or token
    variable of OpenLineage or OpenTelemetry (as given and without the white space around it,
    which a library quotes back when it refuses the value) and every OTLP header's value."""
    for name, value in environ.items():
        if not name.startswith(("OPENLINEAGE", "OTEL_")) or not value.strip():
            continue
        if name.endswith("HEADERS"):
            for pair in value.split(","):
                header = pair.partition("=")[2]
                for form in (header, header.strip(), unquote(header).strip()):
                    if form:
                        register_secret(form)
        elif secret_env_name(name, value):
            register_secret(value)
            register_secret(value.strip())
        for _, secret in json_secrets(value):  # a transport's auth object: {"apiKey": ...}
            register_secret(secret)


# --- the switches and the silent defaults ---------------------------------------------------------
def lineage_requested(environ: Mapping[str, str], cwd: str | None = None) -> bool:
    """True when the OpenLineage client would find a transport: OPENLINEAGE_URL, an
    OPENLINEAGE__TRANSPORT__* variable or a config file (OPENLINEAGE_CONFIG, ./openlineage.yml,
    ~/.openlineage/openlineage.yml); OPENLINEAGE_DISABLED=true turns it off."""
    if environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OPENLINEAGE_URL", "").strip():
        return True
    if any(key.startswith("OPENLINEAGE__TRANSPORT") for key in environ):
        return True
    if environ.get("OPENLINEAGE_CONFIG", "").strip():  # asked for, even when it is missing
        return True
    return lineage_config_file(environ, cwd) is not None


def lineage_config_file(environ: Mapping[str, str], cwd: str | None = None) -> Path | None:
    """The OpenLineage config file the client would read: OPENLINEAGE_CONFIG, then
    ./openlineage.yml, then ~/.openlineage/openlineage.yml. A process with no home (no HOME and
    no passwd entry for its uid, as some pods run) has no file there, and no error."""
    config = environ.get("OPENLINEAGE_CONFIG", "")
    candidates = [Path(config)] if config else []
    candidates.append(Path(cwd or os.getcwd()) / "openlineage.yml")
    home = environ.get("HOME")
    if not home:
        with contextlib.suppress(RuntimeError, KeyError, OSError):
            home = str(Path.home())
    if home:
        candidates.append(Path(home) / ".openlineage" / "openlineage.yml")
    return next((path for path in candidates if path.is_file()), None)


class RunLineage:
    """The silent default: lineage is off."""

    def start(self) -> None:
        """Emit START."""

    def complete(self, rows_written: int) -> None:
        """Emit COMPLETE with the rows written to the output."""

    def fail(self, message: str) -> None:
        """Emit FAIL with a secret-free message (a dpone error code and text)."""


class RunObserver:
    """What a run reports while it moves chunks; this base class is the silent default."""

    def run_started(self, chunks_selected: int) -> None:
        """Before the first chunk: how many chunks this process was given."""

    def chunk_recorded(self, timing: ChunkTiming) -> None:
        """One chunk's outcome, exactly as the run result counts it."""

    def run_finished(self) -> None:
        """After the last chunk (also on failure): flush and release what was opened."""


def otlp_requested(environ: Mapping[str, str]) -> bool:
    """True when the standard OpenTelemetry variables ask for OTLP metrics."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [e.strip() for e in environ.get("OTEL_METRICS_EXPORTER", "otlp").split(",")]
    if "otlp" not in exporters:
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def unserved_exporters(environ: Mapping[str, str]) -> str:
    """OTEL_METRICS_EXPORTER when it names exporters dpone does not run (console, prometheus)
    beside an OTLP endpoint, without otlp: metrics were asked for and none will be sent."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ""
    asked = [e.strip() for e in environ.get("OTEL_METRICS_EXPORTER", "").split(",") if e.strip()]
    if not asked or "otlp" in asked or asked == ["none"]:
        return ""
    if not any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES):
        return ""
    return ",".join(asked)[:60]


def metrics_requested(environ: Mapping[str, str]) -> bool:
    """True when the OpenTelemetry variables ask for metrics: over OTLP, or through exporters
    dpone does not run beside an endpoint, which the run must then say (it opens the metrics
    observer, and its warnings, only when this is true)."""
    return otlp_requested(environ) or bool(unserved_exporters(environ))


def escape_controls(text: str) -> str:
    """``text`` with every control, format and line-separator character escaped (``\\n``,
    ``\\x1b``, ``\\u2028``): a value a warning names (a path, a library's message) can then never
    start a second line that imitates a record, nor move the terminal's cursor."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or char == " ":
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(char.encode("unicode_escape").decode("ascii"))
        else:  # other unprintable spaces (U+00A0, ...): harmless on one line
            out.append(char)
    return "".join(out)


def one_line_warnings(warn: Callable[[str], None]) -> Callable[[str], None]:
    """``warn`` for messages that name user-given values: each is printed on one line (see
    escape_controls), whatever the value holds; redacted first, so that a secret holding a
    control character is still recognised."""
    if getattr(warn, "one_line", False):
        return warn

    def escaped(message: str) -> None:
        warn(escape_controls(redact_text(message)))

    escaped.one_line = True  # type: ignore[attr-defined]
    return escaped


def export_budget(environ: Mapping[str, str], warn: Callable[[str], None]) -> float:
    """Seconds the process may wait for exporters in all; a bad value is a warning, and the
    default applies (an exporter setting never fails a run)."""
    warn = one_line_warnings(warn)
    text = environ.get(BUDGET_VARIABLE, "").strip()
    if not text:
        return DEFAULT_BUDGET_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_BUDGET_S:  # also NaN
        warn(
            f"{BUDGET_VARIABLE} must be a number of seconds from 0 to {MAX_BUDGET_S:g}; "
            f"using {DEFAULT_BUDGET_S:g}"
        )
        return DEFAULT_BUDGET_S
    return value


def one_line(text: str) -> str:
    """A library's message as one short, redacted line."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = escape_controls(redact_text(first))
    return first if len(first) <= _MESSAGE_LIMIT else first[: _MESSAGE_LIMIT - 3] + "..."


class ExportWorker:
    """The exporters' background threads (one lane per exporter, so a hanging lineage backend
    does not hold the metrics back), the run's wait budget, and the warnings already printed:
    one worker serves a whole `dpone run` process, however many processes of the manifest it
    runs, so each distinct warning is printed once per process (:meth:`once`)."""

    def __init__(self, budget_s: float, warn: Callable[[str], None]) -> None:
        self.budget_s = budget_s
        self._lock = threading.Lock()
        self._said: set[str] = set()
        self._warn = self.once(one_line_warnings(warn))
        self._dropped: set[str] = set()  # exporters already said unfinished
        self._expected: dict[str, list[str]] = {}
        self._spent = 0.0
        self._draining_since: float | None = None
        self._lanes: dict[str, queue.Queue[tuple[str, Callable[[], object]]]] = {}
        self._pending: dict[str, int] = {}
        self._idle = threading.Condition(self._lock)
        self._held: list[str] = []
        self._reported: set[str] = set()
        self._current: dict[str, str] = {}

    def once(self, warn: Callable[[str], None]) -> Callable[[str], None]:
        """``warn`` that prints a message this worker's process printed already no more: the
        settings are read again for each process of a manifest, and say the same thing."""

        def said_once(message: str) -> None:
            with self._lock:
                if message in self._said:
                    return
                self._said.add(message)
            warn(message)

        return said_once

    def expect(self, exporter: str, fragment: str) -> None:
        """A library record of ``exporter`` holding ``fragment`` repeats what a dpone warning
        already said (a setting the library then logs about on a thread of its own): drop it."""
        with self._lock:
            self._expected.setdefault(exporter, []).append(fragment)

    def expected(self, exporter: str, message: str) -> bool:
        """Whether ``message`` (a library record of ``exporter``) was said already (see expect)."""
        with self._lock:
            return any(fragment in message for fragment in self._expected.get(exporter, ()))

    def submit(self, exporter: str, what: str, call: Callable[[], object]) -> None:
        """Queue ``call`` (one step of ``exporter``: build, send, close) on the exporter's lane,
        after the steps queued before it; never blocks, never raises."""
        with self._lock:
            self._pending[exporter] = self._pending.get(exporter, 0) + 1
            lane = self._lanes.get(exporter)
            if lane is None:
                lane = self._lanes[exporter] = queue.Queue()
                name = "dpone-export-" + "".join(c for c in exporter.lower() if c.isalnum())
                threading.Thread(
                    target=self._work, args=(exporter, lane), name=name, daemon=True
                ).start()
        lane.put((what, call))

    def problem(
        self, exporter: str, message: str, outcome: str = "the run goes on without it"
    ) -> None:
        """One warning per exporter for the whole process, ending in what happens now
        (``outcome``). It is held and printed by the run's own thread when it waits
        (:meth:`drain`), so it never splits a progress line and never follows the run's last
        line."""
        with self._lock:
            if exporter in self._reported:
                return
            self._reported.add(exporter)
            self._held.append(f"{exporter}: {message}; {outcome}")

    def time_left(self) -> float:
        """Seconds the run will still wait for the exporters (its budget less what it waited
        already), for a client that waits on its own (OpenLineage's async transport)."""
        with self._lock:
            left = self.budget_s - self._spent
            if self._draining_since is not None:
                left -= time.monotonic() - self._draining_since
                if STOP.requested:
                    left = min(left, STOP_BUDGET_S - (time.monotonic() - self._draining_since))
        return max(left, 0.0)

    def _work(self, exporter: str, lane: queue.Queue[tuple[str, Callable[[], object]]]) -> None:
        while True:
            what, call = lane.get()
            with self._lock:
                self._current[exporter] = what
            try:
                call()
            except Exception as exc:  # an exporter never stops a run
                detail = one_line(str(exc))
                self.problem(
                    exporter,
                    f"could not send the {what} ({type(exc).__name__}"
                    + (f": {detail}" if detail else "")
                    + ")",
                )
            finally:
                with self._lock:
                    self._pending[exporter] -= 1
                    self._current.pop(exporter, None)
                    self._idle.notify_all()

    def drain(self) -> None:
        """Wait, within what is left of the budget (at most STOP_BUDGET_S after a stop request),
        until every lane has done its steps; then print the held warnings and say what was
        dropped, if anything."""
        started = time.monotonic()
        with self._lock:
            self._draining_since = started
            while any(self._pending.values()):
                left = self.budget_s - self._spent - (time.monotonic() - started)
                if STOP.requested:
                    left = min(left, STOP_BUDGET_S - (time.monotonic() - started))
                if left <= 0:
                    break
                self._idle.wait(min(left, 0.05))  # short steps: a stop shortens the wait
            self._spent += time.monotonic() - started
            self._draining_since = None
            # an exporter said unfinished once is not said again by a later process's wait
            late = [e for e, count in sorted(self._pending.items()) if count]
            unfinished = [
                f"{exporter} ({self._current.get(exporter, 'queued')})"
                for exporter in late
                if exporter not in self._dropped
            ]
            self._dropped.update(late)
            held, self._held = self._held, []
        for message in held:
            self._warn(message)
        if unfinished:
            self._warn(
                f"exporters: {', '.join(unfinished)} unfinished after the export budget "
                f"({BUDGET_VARIABLE}={self.budget_s:g} s); dropped, the run's result is "
                "unaffected"
            )


class _LibraryHandler(logging.Handler):
    """Library log records become (at most) one dpone warning per exporter."""

    def __init__(self, worker: ExportWorker, exporter: str | None) -> None:
        super().__init__(logging.WARNING)
        self.worker = worker
        self.exporter = exporter

    def emit(self, record: logging.LogRecord) -> None:
        if self.exporter is None:
            return
        try:
            message = one_line(record.getMessage())
        except Exception:  # a record whose arguments do not format
            message = record.levelname.lower()
        if self.worker.expected(self.exporter, message):
            return
        collecting = _COLLECTING.get(threading.get_ident())
        if collecting is not None:
            collecting.append(message)
            return
        self.worker.problem(self.exporter, f"the exporter reported: {message}")


def take_over_library_output(worker: ExportWorker) -> None:
    """Route the exporter libraries' loggers and Python warnings away from raw stderr."""
    for name, exporter in LIBRARY_LOGGERS.items():
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if isinstance(handler, _LibraryHandler):
                logger.removeHandler(handler)
        logger.addHandler(_LibraryHandler(worker, exporter))
        logger.propagate = False
    for name in LIBRARY_LOGGERS:
        warnings.filterwarnings("ignore", module=rf"{name}(\.|$)")
    route_thread_exceptions(worker)


#: the threads the exporter libraries start, by name prefix (the SDK's periodic reader)
_LIBRARY_THREADS = {"OtelPeriodicExportingMetricReader": "OpenTelemetry metrics"}
#: a library's source folder (in a traceback's file names) -> its exporter
_LIBRARY_FOLDERS = {"opentelemetry": "OpenTelemetry metrics", "openlineage": "OpenLineage"}


def _thread_exporter(thread_name: str, tb: TracebackType | None) -> str | None:
    """The exporter a thread that died belongs to, by its name or its traceback's files."""
    for prefix, exporter in _LIBRARY_THREADS.items():
        if thread_name.startswith(prefix):
            return exporter
    while tb is not None:
        parts = Path(tb.tb_frame.f_code.co_filename).parts
        for folder, exporter in _LIBRARY_FOLDERS.items():
            if folder in parts:
                return exporter
        tb = tb.tb_next
    return "exporters" if thread_name.startswith("dpone-export-") else None


def route_thread_exceptions(worker: ExportWorker) -> None:
    """An exception that ends an exporter library's own thread (the SDK's periodic reader, the
    async transport's loop) becomes the exporter's one warning instead of Python's raw
    traceback on stderr; any other thread's goes to the hook that was there before."""
    previous = threading.excepthook
    if getattr(previous, "dpone_exporters", False):
        previous = previous.previous  # type: ignore[attr-defined]

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else ""
        exporter = _thread_exporter(name, args.exc_traceback)
        if exporter is None or args.exc_type is SystemExit:
            previous(args)
            return
        detail = one_line(str(args.exc_value)) if args.exc_value is not None else ""
        worker.problem(
            exporter,
            f"its background thread stopped ({args.exc_type.__name__}"
            + (f": {detail}" if detail else "")
            + ")",
        )

    hook.dpone_exporters = True  # type: ignore[attr-defined]
    hook.previous = previous  # type: ignore[attr-defined]
    threading.excepthook = hook


@contextlib.contextmanager
def collected_library_records() -> Iterator[list[str]]:
    """Collect (instead of report) what the libraries log on this thread meanwhile: building a
    client that fails is then one warning, not the client's complaint and dpone's."""
    collected: list[str] = []
    _COLLECTING[threading.get_ident()] = collected
    try:
        yield collected
    finally:
        _COLLECTING.pop(threading.get_ident(), None)


Client = TypeVar("Client")


def build_client(
    build: Callable[[], Client],
    warn: Callable[[str], None],
    invalid: str,
    off: str,
    missing: str | None = None,
) -> tuple[Client | None, list[str]]:
    """``build()`` with what the libraries log meanwhile collected: the client and those
    records, or (None, []) after ONE warning when building fails: ``invalid`` (the settings
    at fault) with the error's type and first line, then ``off`` (what the run goes without);
    ``missing`` instead for an ImportError, when the caller did not check the package first."""
    with collected_library_records() as records:
        try:
            return build(), records
        except Exception as exc:
            if missing is not None and isinstance(exc, ImportError):
                warn(missing)
            else:
                detail = one_line(str(exc))
                shown = type(exc).__name__ + (f": {detail}" if detail else "")
                warn(f"{invalid} ({shown}); {off}")
            return None, []
