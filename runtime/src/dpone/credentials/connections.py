"""Connection names resolve to DSNs from the environment only (DPONE_CONN_<NAME>).

DSNs never appear in a catalog, a plan, a DAG file, an item, XCom or evidence; in Kubernetes they
arrive as secret references.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from dpone import errors
from dpone.credentials import redaction
from dpone.credentials.credential_parts import has_any, resolve_parts
from dpone.credentials.dsn_parts import register_driver_secrets
from dpone.errors import DponeError, ErrorRecord


def env_key(name: str) -> str:
    """DPONE_CONN_ + the upper-cased connection name."""
    return "DPONE_CONN_" + name.upper()


def register_dsn(dsn: str) -> None:
    """Redact ``dsn``'s secrets as dpone reads them and as its driver parses them."""
    redaction.register_dsn(dsn)
    register_driver_secrets(dsn)


class ConnectionDsn(str):
    """A DSN read from connection ``name``'s variables that can read them again: the string the
    call sites pass around is also the resolver a connector calls at each (re)connect
    (:func:`current_dsn`), so a password rotated mid-run (a rewritten file) is used by the next
    connection of the same process, not only by the next process."""

    name: str
    environ: Mapping[str, str] | None

    def __new__(cls, value: str, name: str, environ: Mapping[str, str] | None) -> ConnectionDsn:
        dsn = super().__new__(cls, value)
        dsn.name, dsn.environ = name, environ
        return dsn

    def __reduce__(self) -> tuple[type[ConnectionDsn], tuple[str, str, Mapping[str, str] | None]]:
        return type(self), (str(self), self.name, self.environ)

    def reread(self) -> ConnectionDsn:
        """The connection's DSN read now (its secrets registered for redaction again)."""
        return resolve_dsn(self.name, self.environ)


def current_dsn(dsn: str) -> str:
    """The DSN to open now: a :class:`ConnectionDsn` read again from its variables and files, any
    other string (a DSN given directly, e.g. by a test) as it is."""
    return dsn.reread() if isinstance(dsn, ConnectionDsn) else dsn


def resolve_dsn(name: str, environ: Mapping[str, str] | None = None) -> ConnectionDsn:
    """The DSN of ``name``, read now from its variable, its file or its separate parts
    (dpone.credentials.credential_parts), so a rotated file is seen by the next connection; the
    result reads them again when a connector reconnects (:func:`current_dsn`)."""
    env = os.environ if environ is None else environ
    key = env_key(name)
    value = resolve_parts(name, env)
    if not value:
        raise DponeError(
            errors.CONNECTION_MISSING,
            f"connection {name!r} has no DSN: set {key}",
        )
    register_dsn(value)
    return ConnectionDsn(value, name, environ)


def require_connections(
    names: Iterable[str | None], environ: Mapping[str, str] | None = None
) -> None:
    """Refuse when any of ``names`` has no DSN, naming every missing variable at once (one
    record each) rather than the first one the run happens to open."""
    env = os.environ if environ is None else environ
    missing = sorted({name for name in names if name and not has_any(name, env)})
    if missing:
        raise DponeError.from_records(
            ErrorRecord(
                errors.CONNECTION_MISSING,
                f"connection {name!r} has no DSN: set {env_key(name)}"
                + (f" ({len(missing)} connections are missing)" if len(missing) > 1 else ""),
            )
            for name in missing
        )


def check_dsns(roles: Mapping[str, str], environ: Mapping[str, str] | None = None) -> None:
    """Read each connection's DSN and its kind now, so a malformed one is refused before any
    I/O naming the role that uses it (``roles``: connection -> ``sink 'dst' table 'orders'``),
    every one at once, rather than by whichever connection the run happens to open first."""
    problems: list[ErrorRecord] = []
    for name, role in roles.items():
        try:
            dsn_kind(resolve_dsn(name, environ))
        except DponeError as exc:
            if exc.code != errors.CONFIG_INVALID:
                raise
            problems.extend(ErrorRecord(r.code, f"{role}: {r.message}") for r in exc.records)
    if problems:
        raise DponeError.from_records(problems)


def dsn_kind(dsn: str) -> str:
    """'postgres', 'sqlite', 'mssql' or 'mysql' (MySQL and MariaDB) from the DSN's scheme."""
    register_dsn(dsn)
    scheme, sep, _ = dsn.partition("://")
    scheme = scheme.strip().lower() if sep else ""
    if scheme in ("postgres", "postgresql"):
        check_url_dsn(dsn, "the Postgres DSN", port=False)  # libpq reads multi-host ports itself
        return "postgres"
    if scheme == "sqlite":
        return "sqlite"
    if scheme == "odbc":
        return "mssql"
    if scheme in ("mssql", "mssql+pyodbc"):
        check_url_dsn(dsn, "the MSSQL DSN", port=True)
        return "mssql"
    if scheme in ("mysql", "mariadb"):
        check_url_dsn(dsn, "the MySQL DSN", port=True)
        return "mysql"
    if not sep:
        raise DponeError(
            errors.CONFIG_INVALID,
            "the DSN is not a URL (scheme://...); use postgresql://, mssql://, odbc://, mysql:// "
            "or sqlite:///",
        )
    if not re.fullmatch(r"[a-z][a-z0-9+.\-]{0,30}", scheme):
        raise DponeError(errors.CONFIG_INVALID, "the DSN's scheme is not a URL scheme")
    raise DponeError(errors.CONFIG_INVALID, f"unsupported DSN scheme {scheme!r}")


def check_url_dsn(dsn: str, label: str, *, port: bool) -> None:
    """Refuse a URL DSN the URL parser cannot read (e.g. an unclosed ``[::1`` IPv6 host, or with
    ``port`` a port that is not a number), with a message that never quotes the DSN."""
    try:
        parts = urlsplit(dsn)
        if port:
            parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        reason = "an invalid IPv6 host" if "IPv6" in str(exc) else "an invalid host or port"
        raise DponeError(
            errors.CONFIG_INVALID, f"{label}: the DSN is malformed ({reason})"
        ) from None


def redact(dsn: str) -> str:
    """What a message may say about a DSN: scheme, host, port and database, never a secret."""
    return redaction.describe_dsn(dsn)


def sqlite_path(dsn: str) -> str:
    """sqlite:///relative.db or sqlite:////abs/path.db -> filesystem path."""
    rest = dsn[len("sqlite://") :]
    if rest.startswith("/"):
        rest = rest[1:]
    if not rest:
        raise DponeError(errors.CONFIG_INVALID, "sqlite DSN needs a file path: sqlite:///file.db")
    return rest
