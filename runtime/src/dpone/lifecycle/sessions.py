"""Sessions a run hands from one connector to the next on the same database.

A run describes both tables on read-only connections before any lease (dpone.run.preflight),
then opens its source, the read-back gate's sibling and its sink: without hand-over a mapped item
opened six connections, each a backend the server starts (about 5 ms of its CPU) for a few
statements. Inside :func:`shared_sessions` a connector closed cleanly leaves its connection here
(idle, no transaction open, not broken) and the next connector opened on the same DSN takes it
instead of connecting. Outside that scope (a library caller, a test) nothing is kept; the scope
closes what is left when it ends. Pure: a dialect stores its own connection objects and says how
to close them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any


class IdleSessions:
    """Idle connections by DSN, taken by one connector at a time (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[Any, Callable[[], None]]]] = {}

    def give(self, dsn: str, session: Any, close: Callable[[], None]) -> None:
        with self._lock:
            self._idle.setdefault(dsn, []).append((session, close))

    def take(self, dsn: str) -> Any | None:
        with self._lock:
            idle = self._idle.get(dsn)
            return idle.pop()[0] if idle else None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for sessions in idle.values():
            for _, close in sessions:
                with suppress(Exception):
                    close()


class _Scope:
    """The process's open scope, if any (runs of one process do not overlap)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: IdleSessions | None = None


_SCOPE = _Scope()


@contextmanager
def shared_sessions() -> Iterator[None]:
    """Connectors opened inside hand their connections over (see the module doc); a nested
    scope joins the outer one."""
    with _SCOPE.lock:
        outer = _SCOPE.idle
        scope = _SCOPE.idle = outer if outer is not None else IdleSessions()
    try:
        yield
    finally:
        if outer is None:
            with _SCOPE.lock:
                _SCOPE.idle = None
            scope.close()


def idle_sessions() -> IdleSessions | None:
    """The open scope's idle connections; None outside :func:`shared_sessions`."""
    return _SCOPE.idle
