"""Server-side limits every database session of a run sets, so a lost pod frees its chunk.

A lost client is not a dead session: Postgres keeps a partitioned client's transaction, and the
locks it holds (a fence row, a chunk's advisory lock), until TCP notices, which with the kernel's
defaults takes about two hours. Client-side keepalives only end the client. So each session asks
the *server* to probe its peer (``tcp_keepalives_*``, ``tcp_user_timeout``) and to end a
transaction that sits idle (``idle_in_transaction_session_timeout``) or a statement that runs
without end (``statement_timeout``, which also ends a COPY whose client was frozen mid-stream).

Every limit has its own variable (VARIABLES); the defaults are documented in docs/ledger.md.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Mapping

from dpone import errors
from dpone.errors import DponeError
from dpone.records import record


@record
class LimitVariable:
    env: str
    default: float
    minimum: float
    meaning: str


VARIABLES: tuple[LimitVariable, ...] = (
    LimitVariable(
        "DPONE_DB_IDLE_TIMEOUT", 60, 1, "idle_in_transaction_session_timeout of every session"
    ),
    LimitVariable(
        "DPONE_DB_STATEMENT_TIMEOUT", 3600, 0, "statement_timeout of every session (0: none)"
    ),
    LimitVariable("DPONE_DB_KEEPALIVE_IDLE", 20, 1, "server and client TCP keepalive idle time"),
    LimitVariable("DPONE_DB_KEEPALIVE_INTERVAL", 10, 1, "TCP keepalive probe interval"),
    LimitVariable("DPONE_DB_KEEPALIVE_COUNT", 3, 1, "TCP keepalive probes before giving up"),
    LimitVariable(
        "DPONE_DB_TCP_USER_TIMEOUT", 50, 0, "tcp_user_timeout: unacknowledged data (0: kernel)"
    ),
    LimitVariable(
        "DPONE_FENCE_LOCK_TIMEOUT", 30, 1, "lock waits inside a chunk's sink transaction"
    ),
)
"""Seconds, except the keepalive count. Documented in docs/ledger.md and docs/cli.md."""


@record
class SessionLimits:
    idle_in_transaction_s: float
    statement_s: float
    keepalive_idle_s: int
    keepalive_interval_s: int
    keepalive_count: int
    tcp_user_timeout_s: float
    fence_lock_s: float

    @property
    def dead_peer_s(self) -> float:
        """How long a silent peer keeps a session alive at most (keepalive or user timeout)."""
        probes = self.keepalive_idle_s + self.keepalive_interval_s * self.keepalive_count
        return min(probes, self.tcp_user_timeout_s) if self.tcp_user_timeout_s else probes

    def postgres_settings(self, server_version: int) -> tuple[tuple[str, str], ...]:
        """Server settings (all user-settable) applied with set_config right after connecting.

        A statement that runs on the server without touching the socket (an INSERT .. SELECT,
        a sort) would not notice a dead peer until it ends: from Postgres 14 on,
        ``client_connection_check_interval`` makes it look every keepalive interval.
        """
        settings: tuple[tuple[str, str], ...] = (
            ("idle_in_transaction_session_timeout", _ms(self.idle_in_transaction_s)),
            ("statement_timeout", _ms(self.statement_s)),
            ("tcp_keepalives_idle", str(self.keepalive_idle_s)),
            ("tcp_keepalives_interval", str(self.keepalive_interval_s)),
            ("tcp_keepalives_count", str(self.keepalive_count)),
            ("tcp_user_timeout", _ms(self.tcp_user_timeout_s)),
        )
        if server_version >= 140000:
            check = ("client_connection_check_interval", _ms(self.keepalive_interval_s))
            settings = (*settings, check)
        return settings

    def libpq_client(self) -> dict[str, str]:
        """Client-side connection parameters (the DSN's own values win)."""
        return {
            "keepalives": "1",
            "keepalives_idle": str(self.keepalive_idle_s),
            "keepalives_interval": str(self.keepalive_interval_s),
            "keepalives_count": str(self.keepalive_count),
            "tcp_user_timeout": _ms(self.tcp_user_timeout_s).removesuffix("ms"),
        }

    @property
    def fence_lock_ms(self) -> str:
        return _ms(self.fence_lock_s)


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms" if seconds else "0"


def _value(var: LimitVariable, environ: Mapping[str, str]) -> float:
    raw = environ.get(var.env)
    if raw is None or raw.strip() == "":
        return var.default
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < var.minimum or value > 86400 * 7:
        raise DponeError(
            errors.CONFIG_INVALID,
            f"{var.env} must be a number of seconds between {var.minimum:g} and 604800 "
            f"({var.meaning}); got {raw[:40]!r}",
        )
    return value


def session_limits(environ: Mapping[str, str] | None = None) -> SessionLimits:
    """The limits from the environment (CONFIG_INVALID naming the variable on a bad value)."""
    env = os.environ if environ is None else environ
    values = {var.env: _value(var, env) for var in VARIABLES}
    return SessionLimits(
        idle_in_transaction_s=values["DPONE_DB_IDLE_TIMEOUT"],
        statement_s=values["DPONE_DB_STATEMENT_TIMEOUT"],
        keepalive_idle_s=max(1, int(values["DPONE_DB_KEEPALIVE_IDLE"])),
        keepalive_interval_s=max(1, int(values["DPONE_DB_KEEPALIVE_INTERVAL"])),
        keepalive_count=max(1, int(values["DPONE_DB_KEEPALIVE_COUNT"])),
        tcp_user_timeout_s=values["DPONE_DB_TCP_USER_TIMEOUT"],
        fence_lock_s=values["DPONE_FENCE_LOCK_TIMEOUT"],
    )


#: Postgres session settings every text form dpone reads or hashes (COPY text, checksum text)
#: depends on; every dpone Postgres session (connector or ledger) sets them when it connects.
TEXT_FORM_SETTINGS: tuple[tuple[str, str], ...] = (
    ("TimeZone", "UTC"),
    ("DateStyle", "ISO, YMD"),
    ("IntervalStyle", "postgres"),
    ("bytea_output", "hex"),
    ("extra_float_digits", "3"),
    ("client_encoding", "UTF8"),
)
_TEXT_FORM_SESSIONS: weakref.WeakSet[object] = weakref.WeakSet()


def mark_text_forms(connection: object) -> None:
    """Record that ``connection``'s session holds TEXT_FORM_SETTINGS (set and committed at
    connect), so a chunk written inside its transaction needs no SET LOCAL round trip."""
    _TEXT_FORM_SESSIONS.add(connection)


def has_text_forms(connection: object) -> bool:
    return connection in _TEXT_FORM_SESSIONS
