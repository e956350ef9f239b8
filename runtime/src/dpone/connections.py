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
from dpone.errors import DponeError, ErrorRecord

CONNECTION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")


def env_key(name: str) -> str:
    """DPONE_CONN_ + the upper-cased connection name."""
    return "DPONE_CONN_" + name.upper()


def resolve_dsn(name: str, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    key = env_key(name)
    value = env.get(key)
    if not value:
        raise DponeError(
            errors.CONNECTION_MISSING,
            f"connection {name!r} has no DSN: set {key}",
        )
    return value


def require_connections(
    names: Iterable[str | None], environ: Mapping[str, str] | None = None
) -> None:
    """Refuse when any of ``names`` has no DSN, naming every missing variable at once (one
    record each) rather than the first one the run happens to open."""
    env = os.environ if environ is None else environ
    missing = sorted({name for name in names if name and not env.get(env_key(name))})
    if missing:
        raise DponeError.from_records(
            ErrorRecord(
                errors.CONNECTION_MISSING,
                f"connection {name!r} has no DSN: set {env_key(name)}"
                + (f" ({len(missing)} connections are missing)" if len(missing) > 1 else ""),
            )
            for name in missing
        )


def dsn_kind(dsn: str) -> str:
    """'postgres', 'sqlite' or 'mssql' from the DSN's scheme."""
    scheme = urlsplit(dsn).scheme.lower()
    if scheme in ("postgres", "postgresql"):
        return "postgres"
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("mssql", "mssql+pyodbc", "odbc"):
        return "mssql"
    raise DponeError(errors.CONFIG_INVALID, f"unsupported DSN scheme {scheme!r}")


def redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    parts = urlsplit(dsn)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return dsn


def sqlite_path(dsn: str) -> str:
    """sqlite:///relative.db or sqlite:////abs/path.db -> filesystem path."""
    rest = dsn[len("sqlite://") :]
    if rest.startswith("/"):
        rest = rest[1:]
    if not rest:
        raise DponeError(errors.CONFIG_INVALID, "sqlite DSN needs a file path: sqlite:///file.db")
    return rest
