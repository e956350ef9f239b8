"""Progress of long runs: a live bar on a terminal, periodic plain lines everywhere else."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class NoProgressSink:
    """Silence: mapped items in pods log one summary line instead."""

    def start(self, total: int, label: str) -> None:
        return None

    def advance(self, committed: int, skipped: int, failed: int, rows: int) -> None:
        return None

    def finish(self) -> None:
        return None


class LineProgress:
    """Plain progress lines (pods, CI logs): at most one every ``interval`` seconds, plus the end."""

    def __init__(self, stream: TextIO = sys.stderr, interval: float = 10.0) -> None:
        self.stream = stream
        self.interval = interval
        self.total = 0
        self.label = ""
        self._last = 0.0
        self._started = 0.0
        self._state = (0, 0, 0, 0)

    def start(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self._started = self._last = time.monotonic()
        print(f"dpone: {label}: {total} chunk(s) selected", file=self.stream, flush=True)

    def _line(self) -> str:
        committed, skipped, failed, rows = self._state
        done = committed + skipped + failed
        elapsed = time.monotonic() - self._started
        return (
            f"dpone: {self.label}: {done}/{self.total} chunks "
            f"({committed} committed, {skipped} already committed, {failed} failed), "
            f"{rows:,} rows, {elapsed:.1f}s"
        )

    def advance(self, committed: int, skipped: int, failed: int, rows: int) -> None:
        self._state = (committed, skipped, failed, rows)
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            print(self._line(), file=self.stream, flush=True)

    def finish(self) -> None:
        print(self._line(), file=self.stream, flush=True)


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
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task: Any = None

    def start(self, total: int, label: str) -> None:
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, detail="")

    def advance(self, committed: int, skipped: int, failed: int, rows: int) -> None:
        if self._task is None:
            return
        detail = f"{rows:,} rows" + (f", {failed} failed" if failed else "")
        self._progress.update(self._task, completed=committed + skipped + failed, detail=detail)

    def finish(self) -> None:
        self._progress.stop()


def choose_progress(stream: TextIO = sys.stderr) -> LineProgress | BarProgress:
    if stream.isatty():
        try:
            return BarProgress()
        except ImportError:
            pass
    return LineProgress(stream)
