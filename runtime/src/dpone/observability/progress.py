"""Progress of long runs: a live bar on a terminal, one line per chunk everywhere else.

Pods and Airflow task logs are not terminals: there every finished chunk is one line (index,
range, rows, milliseconds, outcome, then the run's rate and ETA), as text or, with
``DPONE_LOG_FORMAT=json``, as one JSON object per line. Lines carry chunk bounds and counts only:
never a DSN, a credential or a row value.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from dpone import errors
from dpone.errors import DponeError
from dpone.observability.result import ChunkTiming
from dpone.plan.chunks import Bound

ENV_LOG_FORMAT = "DPONE_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
PROGRESS_EVENT_SCHEMA = "dpone.progress.v1"

_OUTCOME_WORDS = {
    "committed": "committed",
    "skipped_resume": "already committed",
    "failed": "failed",
    "busy": "busy",
    "lease_lost": "lease lost",
    "not_started": "not started",
}


def log_format(environ: Mapping[str, str]) -> str:
    """``text`` (the default) or ``json`` from DPONE_LOG_FORMAT, in any case, blank meaning unset
    (docs/cli.md says so: an operator's ``JSON`` is not a typo); anything else is a usage error."""
    raw = environ.get(ENV_LOG_FORMAT, "")
    value = raw.strip().lower() or "text"
    if value not in LOG_FORMATS:
        raise DponeError(
            errors.USAGE,
            f"{ENV_LOG_FORMAT}={raw[:40]!r} is not one of {', '.join(LOG_FORMATS)} "
            "(any case; empty means text)",
        )
    return value


class NoProgressSink:
    """Silence (``--no-progress``): only the run's summary line is printed."""

    def start(self, total: int, label: str) -> None:
        return None

    def advance(
        self, committed: int, skipped: int, failed: int, rows: int, chunk: ChunkTiming
    ) -> None:
        return None

    def finish(self) -> None:
        return None


def _duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class ChunkLines:
    """One line per finished chunk, with the run's rate and ETA; a totals line at the end.

    The rate counts the chunks this run moved (committed or failed), not the ones a resume skipped,
    so the ETA of a resumed campaign is not flattered by the chunks it did not have to move.
    ``ranges`` maps a chunk index to its ``[start, end)`` bounds (the run's selection).
    """

    def __init__(
        self,
        ranges: Mapping[int, tuple[Bound, Bound]],
        stream: TextIO = sys.stderr,
        json_lines: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ranges = dict(ranges)
        self.stream = stream
        self.json_lines = json_lines
        self.clock = clock
        self.total = 0
        self.label = ""
        self._started = 0.0
        self._state = (0, 0, 0, 0)

    def _emit(self, text: str, event: dict[str, Any]) -> None:
        if self.json_lines:
            record = {"schema": PROGRESS_EVENT_SCHEMA, "label": self.label, **event}
            text = json.dumps(record, sort_keys=True, separators=(",", ":"))
        print(text, file=self.stream, flush=True)

    def _rates(self) -> dict[str, Any]:
        committed, skipped, failed, rows = self._state
        elapsed = max(self.clock() - self._started, 1e-9)
        moved = committed + failed
        remaining = self.total - committed - skipped - failed
        chunks_per_s = moved / elapsed
        eta: float | None = None
        if remaining <= 0:
            eta = 0.0
        elif chunks_per_s > 0:
            eta = remaining / chunks_per_s
        return {
            "done": committed + skipped + failed,
            "total": self.total,
            "committed": committed,
            "already_committed": skipped,
            "failed": failed,
            "rows_total": rows,
            "elapsed_s": round(elapsed, 3),
            "rows_per_s": round(rows / elapsed, 1),
            "chunks_per_s": round(chunks_per_s, 3),
            "eta_s": None if eta is None else round(eta, 1),
        }

    @staticmethod
    def _rate_text(r: dict[str, Any]) -> str:
        eta = "?" if r["eta_s"] is None else _duration(r["eta_s"])
        return (
            f"{r['done']}/{r['total']} chunks, {r['rows_total']:,} rows, "
            f"{r['rows_per_s']:,.0f} rows/s, {r['chunks_per_s']:.2f} chunks/s, ETA {eta}"
        )

    def start(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self._started = self.clock()
        self._emit(f"dpone: {label}: {total} chunk(s) selected", {"event": "start", "total": total})

    def advance(
        self, committed: int, skipped: int, failed: int, rows: int, chunk: ChunkTiming
    ) -> None:
        self._state = (committed, skipped, failed, rows)
        if chunk.status == "not_started":
            return  # counted in the totals line; a stopped run does not list what it never began
        start, end = self.ranges.get(chunk.index, (None, None))
        rates = self._rates()
        event = {
            "event": "chunk",
            "index": chunk.index,
            "start": start,
            "end": end,
            "outcome": chunk.status,
            "rows": chunk.rows,
            "duration_ms": chunk.duration_ms,
            "error_code": chunk.error_code,
            **rates,
        }
        bounds = f"[{start}, {end})" if chunk.index in self.ranges else "(whole source)"
        facts = [_OUTCOME_WORDS.get(chunk.status, chunk.status)]
        if chunk.error_code:
            facts[0] += f" {chunk.error_code}"
        if chunk.rows is not None:
            facts.append(f"{chunk.rows:,} rows")
        if chunk.duration_ms is not None:
            facts.append(f"{chunk.duration_ms} ms")
        text = (
            f"dpone: {self.label}: chunk {chunk.index} {bounds} {', '.join(facts)} | "
            f"{self._rate_text(rates)}"
        )
        self._emit(text, event)

    def finish(self) -> None:
        rates = self._rates()
        self._emit(
            f"dpone: {self.label}: end | {self._rate_text(rates)}", {"event": "end", **rates}
        )


class BarProgress:
    """A rich progress bar for interactive terminals (``dpone-runtime[progress]``)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task: Any = None
        self._started = 0.0

    def start(self, total: int, label: str) -> None:
        self._progress.start()
        self._started = time.monotonic()
        self._task = self._progress.add_task(label, total=total, detail="")

    def advance(
        self, committed: int, skipped: int, failed: int, rows: int, chunk: ChunkTiming
    ) -> None:
        if self._task is None:
            return
        elapsed = max(time.monotonic() - self._started, 1e-9)
        detail = f"{rows:,} rows, {rows / elapsed:,.0f} rows/s" + (
            f", {failed} failed" if failed else ""
        )
        self._progress.update(self._task, completed=committed + skipped + failed, detail=detail)

    def finish(self) -> None:
        self._progress.stop()


def choose_progress(
    ranges: Mapping[int, tuple[Bound, Bound]],
    stream: TextIO = sys.stderr,
    fmt: str = "text",
) -> ChunkLines | BarProgress:
    """The bar on an interactive terminal in text format, chunk lines everywhere else."""
    if fmt == "text" and stream.isatty():
        try:
            return BarProgress()
        except ImportError:
            pass
    return ChunkLines(ranges, stream, json_lines=fmt == "json")
