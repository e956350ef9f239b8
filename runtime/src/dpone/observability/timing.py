"""Opt-in phase timing of `dpone run` (``DPONE_TIMING=<file>``), read by bench/campaign_bench.py.

Off (the default) this module is never imported and nothing on the chunk path changes: the CLI
imports it only when the variable is set. On, :func:`install` wraps a fixed list of functions
(``PHASES``) with a timer and counts psycopg's ``Connection.wait`` calls, one per request/response
exchange with the server (a round trip), charging each to the innermost running phase of its
thread. A phase's time excludes the phases nested in it, so the phases of a chunk add up to its
wall time, except ``copy_out`` of a chunk read ahead (dpone.lifecycle.read_ahead), which runs on its own
thread beside them. At exit the process appends one JSON line to the file: per phase the calls, the
exclusive and inclusive nanoseconds and the round trips. It measures; it never changes a result.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from dpone.credentials.redaction import redact_text
from dpone.lifecycle.read_ahead import THREAD_NAME as READ_AHEAD_THREAD
from dpone.observability.exporting import escape_controls
from dpone.observability.progress import ENV_LOG_FORMAT, PROGRESS_EVENT_SCHEMA

ENV_TIMING = "DPONE_TIMING"

#: phase name -> (module, attribute path) of the function timed as that phase.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("pack", "dpone.run.runner", "load_workload_pack"),
    ("ledger_open", "dpone.run.orchestrator", "RunContext.open_store"),
    ("initialize", "dpone.ledger.sql", "SqlLedger.initialize"),
    ("load", "dpone.ledger.sql", "SqlLedger._load"),
    ("load", "dpone.ledger.postgres", "PostgresLedger._load_scope"),  # a mapped item's chunks
    ("preflight", "dpone.run.orchestrator", "ChunkMover.preflight"),
    ("connect", "dpone.connectors.postgres", "PgConnection.get"),
    ("chunk", "dpone.run.orchestrator", "_run_chunk"),
    ("group", "dpone.run.orchestrator", "_run_group"),  # coalesced chunks: + the group's commit
    ("group", "dpone.run.orchestrator", "_run_set"),  # a set-based group: + its commit
    ("lease", "dpone.ledger.sql", "SqlLedger.acquire_lease"),
    ("lease", "dpone.ledger.sql", "SqlLedger.lease_and_complete"),  # one commit: + the commit
    ("lease", "dpone.ledger.sql", "SqlLedger._lease_member"),  # a coalesced chunk's lease
    ("lease", "dpone.ledger.sql", "SqlLedger._lease_set"),  # a set-based group's leases
    ("completion", "dpone.ledger.sql", "SqlLedger._close_members"),  # a group's completions
    ("completion", "dpone.ledger.sql", "SqlLedger._close_in"),
    ("cas", "dpone.ledger.sql", "SqlLedger._view"),
    ("completion", "dpone.ledger.sql", "SqlLedger.complete_in_transaction"),
    ("completion", "dpone.ledger.sql", "SqlLedger.complete"),
    ("sink_other", "dpone.connectors.base", "Sink.write_chunk"),
    ("delete", "dpone.connectors.postgres", "PostgresSink._delete"),
    ("copy_in", "dpone.connectors.postgres", "PostgresSource.copy_into"),
    ("copy_out", "dpone.connectors.postgres", "raw_copy_blocks"),
    ("checksum", "dpone.connectors.postgres", "relation_checksum"),  # sink's and source's
    ("checksum", "dpone.connectors.postgres", "window_checksums"),  # a set-based group's
    ("sink_other", "dpone.connectors.postgres", "PostgresSink.write_group"),
    ("read_back", "dpone.connectors.base", "ReadBackGate.check"),  # the wait for the source's
    ("read_back", "dpone.connectors.base", "GroupReadBackGate.check_all"),
)

_local = threading.local()
_lock = threading.Lock()
#: name -> [calls, exclusive ns, inclusive ns, round trips]
_totals: dict[str, list[int]] = {}
_source_connections: set[int] = set()
_state: dict[str, int] = {"started": time.perf_counter_ns(), "installed": 0}


def _stack() -> list[list[Any]]:
    stack: list[list[Any]] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _add(name: str, calls: int, own: int, total: int, trips: int) -> None:
    with _lock:
        row = _totals.setdefault(name, [0, 0, 0, 0])
        row[0] += calls
        row[1] += own
        row[2] += total
        row[3] += trips


def _enter(name: str) -> None:
    _stack().append([name, time.perf_counter_ns(), 0, 0])  # name, start, child ns, round trips


def _leave() -> None:
    stack = _stack()
    name, start, child, trips = stack.pop()
    elapsed = time.perf_counter_ns() - start
    if stack:
        stack[-1][2] += elapsed
    _add(name, 1, elapsed - child, elapsed, trips)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _enter(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _leave()

    return timed


def _timed_generator(name: str, fn: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
    """Times each step of a generator (the time its consumer waits for the next item)."""

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Generator[Any, None, None]:
        inner = fn(*args, **kwargs)
        try:
            while True:
                _enter(name)
                try:
                    item = next(inner)
                except StopIteration:
                    return
                finally:
                    _leave()
                yield item
        finally:
            close = getattr(inner, "close", None)
            if close is not None:
                close()

    return timed


def _count_round_trip(conn: object) -> None:
    stack = _stack()
    if not stack:
        if threading.current_thread().name == READ_AHEAD_THREAD:  # a read-ahead's COPY TO
            _add("copy_out", 0, 0, 0, 1)
        return
    frame = stack[-1]
    if frame[0] == "copy_in" and id(conn) in _source_connections:
        _add("copy_out", 0, 0, 0, 1)  # the source's COPY TO statement, started inside copy_into
        return
    frame[3] += 1


def _patch_wait() -> None:
    import psycopg

    wait = psycopg.Connection.wait

    @functools.wraps(wait)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        _count_round_trip(self)
        return wait(self, *args, **kwargs)

    psycopg.Connection.wait = counted  # type: ignore[method-assign]


def _patch_source_tagging() -> None:
    """Remember the source's connections, so its COPY TO round trip is charged to copy_out."""
    from dpone.connectors import postgres

    get = postgres.PgConnection.get

    @functools.wraps(get)
    def tagged(self: Any) -> Any:
        conn = get(self)
        if self._label.startswith("source"):
            _source_connections.add(id(conn))
        return conn

    postgres.PgConnection.get = tagged  # type: ignore[method-assign]


def _report(path: str) -> None:
    with _lock:
        phases = {name: list(row) for name, row in sorted(_totals.items())}
    line = json.dumps(
        {
            "pid": os.getpid(),
            "wall_ns": time.perf_counter_ns() - _state["started"],
            "phases": phases,
        },
        sort_keys=True,
    )
    try:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    except OSError:  # at exit, after the run's last line: nothing may follow it (install checked)
        pass


def _warn(message: str) -> None:
    """One warning line as the runner prints it (a progress ``warning`` event in JSON log mode),
    with the path's control characters escaped: a newline in it cannot start a second line."""
    text = escape_controls(redact_text(message))
    if os.environ.get(ENV_LOG_FORMAT, "").strip().lower() == "json":
        record = {"schema": PROGRESS_EVENT_SCHEMA, "event": "warning", "message": text}
        line = json.dumps(record, sort_keys=True, separators=(",", ":"))
    else:
        line = f"dpone: warning: {text}"
    print(line, file=sys.stderr, flush=True)


def install(path: str) -> None:
    """Wrap every phase of ``PHASES`` and report to ``path`` at exit (idempotent per process);
    a path that cannot be appended to, or is no regular file (a FIFO would block the run until
    a reader came), is one warning now, and no timing at all."""
    if _state["installed"]:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(0, "not a regular file")
        finally:
            os.close(fd)
    except OSError as exc:
        _warn(
            f"{ENV_TIMING}={path}: cannot be written "
            f"({exc.strerror or type(exc).__name__}); the run goes on without timing"
        )
        return
    _state.update(installed=1, started=time.perf_counter_ns())
    _patch_wait()
    _patch_source_tagging()
    for name, module_name, attribute in PHASES:
        module = importlib.import_module(module_name)
        owner: Any = module
        *parents, leaf = attribute.split(".")
        for part in parents:
            owner = getattr(owner, part)
        fn = getattr(owner, leaf)
        wrap = _timed_generator if name == "copy_out" else _timed
        setattr(owner, leaf, wrap(name, fn))
    atexit.register(_report, path)
