"""Read-ahead: the next chunk's COPY data read into memory while the current chunk is written.

A worker moves its chunks one after another. Between one chunk's source read and the next, the
source sits idle while the sink reads the rows back for the checksum, records the completion,
commits and leases the next chunk. Reading the next chunk in that time, on a thread, lets the
source and the sink work at once (bench/campaign_bench.py, docs/benchmarks.md).

The rows read ahead are only a cache of one statement: they are used when the worker's next read
is that same statement with the same parameters, and dropped otherwise (the chunk's lease was
refused, the run stops). Nothing is handed over before the worker asks, so a chunk whose read
failed or outgrew the budget before that is simply read again as a stream. Memory is bounded:
before the worker asks, at most ``budget`` bytes are held (a larger chunk is dropped at the
budget, and the caller stops reading ahead); once it asks, the reader waits while the writer is
more than ``budget`` bytes behind.
"""

from __future__ import annotations

import collections
import math
import os
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

from dpone import errors
from dpone.errors import DponeError

READ_AHEAD_ENV = "DPONE_READ_AHEAD_MB"
DEFAULT_READ_AHEAD_MB = 32
THREAD_NAME = "dpone-read-ahead"
_MAX_MB = 1 << 20


def read_ahead_budget(environ: Mapping[str, str] = os.environ) -> int:
    """Bytes a worker may read ahead (``DPONE_READ_AHEAD_MB``, default 32; 0 turns it off)."""
    raw = environ.get(READ_AHEAD_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_READ_AHEAD_MB << 20
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or value > _MAX_MB:
        raise DponeError(
            errors.CONFIG_INVALID,
            f"{READ_AHEAD_ENV} must be a number of MiB between 0 (off) and {_MAX_MB} "
            f"(the next chunk read into memory while one is written); got {raw[:40]!r}",
        )
    return int(value * (1 << 20))


class ReadAhead:
    """One statement's output, read by a daemon thread from ``produce()`` (which owns the
    connection until the thread ends); ``cancel()`` asks the server to end that statement."""

    def __init__(
        self,
        key: Hashable,
        connection: Any,
        produce: Callable[[], Iterator[bytearray]],
        cancel: Callable[[], None],
        budget: int,
    ) -> None:
        self.key = key
        self.connection = connection  # what produce() reads on; the writer's after take()
        self._produce = produce
        self._cancel = cancel
        self._budget = budget
        self._cond = threading.Condition()
        self._blocks: collections.deque[bytearray] = collections.deque()
        self._held = 0
        self._taken = False  # the writer asked: blocks stream to it from now on
        self._dropped = False  # nobody will read what is left: read nothing more
        self._ended = False
        self._failure: BaseException | None = None
        #: the chunk outgrew the budget before the writer asked (the caller stops reading ahead)
        self.overflowed = False
        self.cancelled = False
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failure: BaseException | None = None
        try:
            for block in self._produce():
                with self._cond:
                    if self._dropped:
                        continue  # the cancel ends the statement; until then, drain it
                    if not self._taken and self._held + len(block) > self._budget:
                        self.overflowed = self._dropped = True
                        self._blocks.clear()
                        self._held = 0
                        self._cond.notify_all()
                    else:
                        while self._taken and self._held > self._budget and not self._dropped:
                            self._cond.wait()
                        if self._dropped:
                            continue
                        self._blocks.append(block)
                        self._held += len(block)
                        self._cond.notify_all()
                        continue
                self._send_cancel()
        except BaseException as exc:  # handed to the writer, or dropped with the rest
            failure = exc
        with self._cond:
            self._failure = failure
            self._ended = True
            self._cond.notify_all()

    def _send_cancel(self) -> None:
        with self._cond:
            if self._ended or self.cancelled:
                return
            self.cancelled = True
        self._cancel()

    def take(self) -> Iterator[bytearray] | None:
        """The blocks, streamed as they arrive; None when nothing can be handed over (the read
        failed or outgrew the budget before this call): read the statement again. A failure
        after this call is raised by the iterator."""
        with self._cond:
            self._taken = True
            self._cond.notify_all()
            while not self._ended and not self._blocks and not self._dropped:
                self._cond.wait()
            if self._dropped or (self._ended and self._failure is not None):
                return None
        return self._stream()

    def _stream(self) -> Iterator[bytearray]:
        while True:
            with self._cond:
                while not self._blocks and not self._ended:
                    self._cond.wait()
                if self._blocks:
                    block = self._blocks.popleft()
                    self._held -= len(block)
                    self._cond.notify_all()
                elif self._failure is not None:
                    raise self._failure
                else:
                    return
            yield block

    def drop(self, wait_s: float = 5.0) -> bool:
        """Stop reading and forget what was read; True when the statement ran to its end
        untouched (its connection is idle and reusable), False when it was cancelled or failed
        or is still running after ``wait_s`` (do not reuse the connection)."""
        with self._cond:
            self._dropped = True
            self._blocks.clear()
            self._held = 0
            self._cond.notify_all()
            ended = self._ended
        if not ended:
            self._send_cancel()
        return self.wait(wait_s)

    def wait(self, wait_s: float = 5.0) -> bool:
        """After the iterator of :meth:`take` ended: True when the thread ended cleanly."""
        self._thread.join(wait_s)
        with self._cond:
            return self._ended and self._failure is None and not self.cancelled
