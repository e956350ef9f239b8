"""SIGTERM and SIGINT: stop leasing, roll back the chunk in flight, release its lease, exit.

Kubernetes deletes a pod with SIGTERM (then SIGKILL after the grace period) and Airflow's on_kill
does the same. PID 1 in a container gets no default action for SIGTERM, so the handlers are
installed explicitly. The C-level handler only writes the signal number to a wakeup pipe; a
watcher thread reads it and does the work (set the stop flag, ask every open database connection
to cancel its statement), because the main thread may be blocked inside a driver call that does
not return to Python until the server answers. A second signal ends the process at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

from dpone import errors
from dpone.errors import ErrorRecord

HANDLED = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The process-wide stop flag and the cancel callbacks of what is in flight."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.settled = threading.Event()  # every canceller of the stop was called
        self.signum: int | None = None
        self._lock = threading.Lock()
        self._cancellers: dict[int, Callable[[], None]] = {}
        self._next = 0
        self.handlers_installed = False

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "a stop request"

    @property
    def exit_code(self) -> int:
        """The shell convention: 128 + the signal number (143 for SIGTERM, 130 for SIGINT)."""
        return 128 + (self.signum or signal.SIGTERM)

    def record(self, what: str) -> ErrorRecord:
        return ErrorRecord(
            errors.RUN_INTERRUPTED,
            f"interrupted by {self.signal_name}: {what}",
        )

    @contextlib.contextmanager
    def cancellable(self, cancel: Callable[[], None]) -> Iterator[None]:
        """Register ``cancel`` (called from the watcher thread on a stop) for the block's time."""
        with self._lock:
            key = self._next
            self._next += 1
            self._cancellers[key] = cancel
        try:
            if self.requested:
                cancel()
            yield
        finally:
            with self._lock:
                self._cancellers.pop(key, None)

    def request(self, signum: int) -> None:
        """Stop: set the flag, then cancel every registered statement (idempotent)."""
        with self._lock:
            if self.event.is_set():
                return
            self.signum = signum
            self.event.set()
            cancellers = list(self._cancellers.values())
        for cancel in cancellers:
            with contextlib.suppress(Exception):
                cancel()
        self.settled.set()

    def settle(self, timeout_s: float = 10.0) -> None:
        """After a stop request, wait until every statement in flight was asked to cancel.

        The cancels go out one after another from the watcher thread, while the worker may
        already be releasing its chunk after the first one landed: a later cancel request could
        then cancel the statement that records the release. Once they are all sent, a cancel
        reaching an idle session is ignored by the server."""
        if self.requested:
            self.settled.wait(timeout_s)

    def reset(self) -> None:
        """For tests that run several commands in one process."""
        with self._lock:
            self.event.clear()
            self.settled.clear()
            self.signum = None


STOP = StopRequest()


def install_handlers() -> None:
    """Route SIGTERM/SIGINT to :data:`STOP` (main thread only; once per process)."""
    if STOP.handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def on_signal(signum: int, frame: object) -> None:
        """Nothing here: the wakeup pipe carries the signal to the watcher thread."""

    for signum in HANDLED:
        signal.signal(signum, on_signal)

    def watch() -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            for value in data:
                if value not in HANDLED:
                    continue
                if STOP.requested:
                    os._exit(128 + value)  # a second signal: the user insists
                STOP.request(value)

    threading.Thread(target=watch, name="dpone-signal-watcher", daemon=True).start()
    STOP.handlers_installed = True
