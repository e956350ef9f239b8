"""A connect that fails on the connection's own settings is a configuration error, not an outage.

libpq refuses an unknown ``sslmode``, a port that is not a number and a missing root certificate
before it sends a byte; the server refuses a bad ``options`` (``-c name=value``) at startup. None of
these heals by itself, so they are DPONE_CONFIG_INVALID (not retryable) instead of the retryable
DPONE_CONNECTION_FAILED; nor does a URL DSN whose password holds a raw ``@`` or ``/``. Messages
name the setting, never its value or the DSN. Any other failed connect is described by a coarse
reason shared by the connectors and the ledger, never by libpq's text (it names the user and the
database).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from dpone import errors
from dpone.credentials import redaction
from dpone.credentials.dsn_parts import unencoded_userinfo
from dpone.errors import DponeError

# The patterns are texts, compiled by ``re`` on first use (only a refused connection needs them).
#: libpq's own checks of a connection option (``connection is bad: ...``)
#: and psycopg's, which resolves the host and reads ``connect_timeout`` before libpq runs (a port
#: that is not a number fails that lookup as a service name the resolver does not know)
_CLIENT_OPTION = (
    r'invalid integer value "[^"]*" for connection option "(?P<option>\w+)"'
    r"|invalid (?P<port>port number)"
    r"|invalid (?P<named>\w+) value:"
    r"|bad value for (?P<psycopg>\w+):"
    r"|failed to resolve host .*(?P<service>Servname not supported)"
)
#: the server's refusals of the startup packet's ``options`` (``FATAL:  ...``)
_SERVER_OPTION = (
    r'unrecognized configuration parameter "(?P<unknown>[^"]{1,63})"'
    r'|invalid value for parameter "(?P<invalid>[^"]{1,63})"'
    r'|parameter "(?P<fixed>[^"]{1,63})" cannot be (?:changed|set)'
    r"|(?P<argument>invalid command-line argument for server process)"
)
_SERVER_PARAMETER = r"[a-z_][a-z0-9_.]*"
#: libpq's refusals that quote only a parameter's name (never its value)
_UNKNOWN_PARAMETER = r'(?:invalid URI query parameter:|invalid connection option) "([^"\n]*)"$'
_PARAMETER_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_VERIFYING = ("verify-ca", "verify-full")


#: libpq's words for a TLS setting the server can never satisfy as it is set up, and the setting
#: to correct: another attempt cannot connect either
_TLS_PROBLEMS = (
    (
        "server does not support ssl, but ssl was required",
        "sslmode (the server offers no TLS, which this sslmode demands)",
    ),
    (
        "certificate verify failed",
        "sslrootcert (the server's certificate does not verify against it)",
    ),
    (
        "does not match host name",
        "host (the server's certificate names another host, which sslmode verify-full refuses)",
    ),
)


def postgres_setting_problem(message: str) -> str | None:
    """The DSN setting a failed Postgres connect refused, from the driver's message; None when
    the failure is anything else (an outage, credentials, a missing database)."""
    for needle, problem in _TLS_PROBLEMS:
        if needle in message.lower():
            return problem
    client = re.search(_CLIENT_OPTION, message)
    if client is not None:
        if client.group("port") or client.group("service"):
            return "port (not a valid port number)"
        name = client.group("option") or client.group("named") or client.group("psycopg")
        return f"{name} (not a value libpq accepts)"
    server = re.search(_SERVER_OPTION, message)
    if server is None:
        return None
    if server.group("argument"):
        return "options (not a server command line: use -c name=value)"
    parameter = server.group("unknown") or server.group("invalid") or server.group("fixed") or ""
    shown = repr(parameter) if re.fullmatch(_SERVER_PARAMETER, parameter) else "a parameter"
    if server.group("unknown"):
        return f"options (sets {shown}, which the server does not know)"
    if server.group("invalid"):
        return f"options (gives {shown} a value the server refuses)"
    return f"options (sets {shown}, which cannot be set at connect)"


def postgres_connect_problem(dsn: str, message: str) -> str | None:
    """The setting a failed Postgres connect shows to be wrong: one the driver's message names
    (postgres_setting_problem), or a URL DSN's user or password holding a character libpq
    splits it at (dsn_parts.unencoded_userinfo): libpq then tried another host or database
    than the one written, which no retry changes."""
    setting = postgres_setting_problem(message)
    if setting is None and unencoded_userinfo(dsn):
        setting = (
            "user or password (it holds '@' or '/', which a URL DSN must percent-encode:"
            " %40, %2F)"
        )
    return setting


def postgres_parse_problem(exc: BaseException) -> str:
    """libpq's reason for refusing a DSN's text, every quoted fragment masked (they are pieces of
    the DSN) except an unknown parameter's name: a plain word that is no registered secret, and
    the one thing the user needs to see to correct the DSN."""
    message = str(exc).strip()
    unknown = re.search(_UNKNOWN_PARAMETER, message)
    if unknown is not None:
        name = unknown.group(1)
        if re.fullmatch(_PARAMETER_NAME, name) and redaction.redact_text(name) == name:
            return f"{name!r} is not a connection parameter libpq knows"
    return redaction.mask_quoted(message)


def postgres_connect_reason(message: str) -> str:
    """A coarse, secret-free reason for a failed Postgres connect, from the driver's message
    (libpq's text names the host, the user and the database: docs/security.md)."""
    text = message.lower()
    for needle, reason in (
        ("password", "authentication failed"),
        ("authentication", "authentication failed"),
        ("refused", "connection refused"),
        ("timeout", "timed out"),
        ("does not exist", "database or role does not exist"),
        ("could not translate host", "unknown host"),
        ("failed to resolve host", "unknown host"),
        ("too many", "too many connections"),
    ):
        if needle in text:
            return reason
    return "server unreachable"


def postgres_missing_file(params: Mapping[str, object]) -> str | None:
    """A certificate file libpq will need and cannot find: the root certificate when the server
    is verified (verify-ca, verify-full; ``system`` is libpq's own store), the key of a given
    client certificate."""
    mode = str(params.get("sslmode") or "prefer")
    if mode == "disable":
        return None
    root = str(params.get("sslrootcert") or "")
    if mode in _VERIFYING and root and root != "system" and not os.path.isfile(root):
        return "sslrootcert"
    cert, key = str(params.get("sslcert") or ""), str(params.get("sslkey") or "")
    if cert and os.path.isfile(cert) and key and not os.path.isfile(key):
        return "sslkey"
    return None


def invalid_setting(label: str, setting: str) -> DponeError:
    return DponeError(
        errors.CONFIG_INVALID,
        f"{label}: the connection's {setting} is invalid; correct it in the DSN "
        "(DPONE_CONN_<NAME>): another attempt with the same setting cannot connect",
    )


def missing_file(label: str, setting: str) -> DponeError:
    return DponeError(
        errors.CONFIG_INVALID,
        f"{label}: the connection's {setting} names a file that does not exist in this "
        "container; mount it there or correct the DSN (DPONE_CONN_<NAME>)",
    )
