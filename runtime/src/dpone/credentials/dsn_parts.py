"""A DSN as its driver reads it: the secrets to redact and the server parts a name may show.

A password holding a raw ``@``, ``/``, ``:``, ``?``, ``#`` or ``%`` is split differently by each
parser: libpq reads a URL's userinfo up to the first ``@`` and its host up to the first ``/``, so
``postgresql://u:p@ss@host/db`` connects to the host ``ss@host`` and the driver's error quotes that
"host". Redaction therefore registers what the driver itself parsed (libpq's own parser,
``psycopg.conninfo.conninfo_to_dict``, for Postgres; the URL parser PyMySQL's and the ODBC
connection's DSNs are built with for MySQL and MSSQL) besides the forms ``dpone.credentials.redaction`` reads,
and names (OpenLineage namespaces) are built only from parts that parse and validate: a host, a
port number, a database name. Anything else gives a neutral name, never DSN text.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote, urlsplit

from dpone.credentials import redaction
from dpone.records import record

#: a password fragment shorter than this is registered only when a driver parsed it as a part
MIN_FRAGMENT = 3
# The patterns are texts, compiled by ``re`` on first use (a pod that never splits a password or
# checks a host pays nothing for them).
_DELIMITERS = r"[/@:?#&;=\[\]]+"
_HOST = (
    r"[A-Za-z0-9](?:[A-Za-z0-9.\-]{0,251}[A-Za-z0-9])?"  # a DNS name or an IPv4 address
    r"|\[?[0-9A-Fa-f:.]{2,45}\]?"  # an IPv6 address
    r"|/[A-Za-z0-9._/\-]{0,200}"  # a Unix-domain socket folder (libpq)
)
_DATABASE = r"[A-Za-z0-9_$.\-]{1,128}"
_DEFAULT_PORTS = {"postgres": 5432, "mysql": 3306, "mssql": 1433}
_PART_KEYS = ("host", "hostaddr", "port", "dbname", "user")


@record
class ServerParts:
    """Validated parts of a DSN: safe to show in a name."""

    host: str
    port: int
    database: str | None


def libpq_view(dsn: str) -> dict[str, str] | None:
    """The DSN as libpq parses it (URL or key=value), or None when libpq refuses it or psycopg
    is not installed."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return None
    try:
        return {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
    except Exception:  # libpq's parse error: the DSN is refused where it is opened
        return None


def _url_view(dsn: str) -> dict[str, str] | None:
    """The DSN as the URL parser reads it (dpone's MySQL and MSSQL connectors), or None."""
    try:
        parts = urlsplit(dsn.strip())
        port = parts.port
    except ValueError:
        return None
    view = {"host": parts.hostname or "", "dbname": unquote(parts.path.lstrip("/"))}
    if port is not None:
        view["port"] = str(port)
    if parts.username is not None:
        view["user"] = unquote(parts.username)
    if parts.password is not None:
        view["password"] = unquote(parts.password)
    return view


def _fragments(value: str) -> set[str]:
    """``value`` and its pieces between the characters parsers split a DSN at."""
    pieces = {piece for piece in re.split(_DELIMITERS, value) if len(piece) >= MIN_FRAGMENT}
    return {value, unquote(value), *pieces} - {""}


@functools.lru_cache(maxsize=64)
def driver_secrets(dsn: str) -> frozenset[str]:
    """Every secret fragment of ``dsn`` as its driver and a URL's intended userinfo read it."""
    found: set[str] = set()
    scheme, sep, rest = dsn.partition("://")
    if sep and "@" in rest:  # what the writer meant as userinfo: up to the last "@"
        userinfo = rest.rpartition("@")[0]
        if ":" in userinfo:
            found |= _fragments(userinfo.partition(":")[2])
    kind = scheme.strip().lower() if sep else ""
    if kind in ("postgres", "postgresql") or not sep:
        view = libpq_view(dsn)
    elif kind in ("mysql", "mariadb", "mssql", "mssql+pyodbc"):
        view = _url_view(dsn)
    else:
        view = None
    for key, value in (view or {}).items():
        if key in ("password", "sslpassword") and value:
            found |= {value, *_fragments(value)}
        elif key in _PART_KEYS and "@" in value:  # a password's tail read as a host or name
            head = value.rpartition("@")[0]
            found |= {head, *_fragments(head)}
        elif key == "port" and value and not value.replace(",", "").isdigit():
            found |= {value, *_fragments(value)}
    return frozenset(form for form in found if form)


def unencoded_userinfo(dsn: str) -> bool:
    """True when a Postgres URL DSN's password, as written, holds a raw ``@`` or ``/`` that
    libpq splits it at: two ``@`` before the host part ends (libpq ends the userinfo at the
    first), or an ``@`` past it that a ``/`` follows (a raw ``/`` ended the host part early:
    ``postgresql://u:p/w@host/db`` tries the host ``u``). Read on the text as written, so a
    percent-encoded ``@`` (``%40``) anywhere, or one in a parameter's value, is never one."""
    _, sep, rest = dsn.strip().partition("://")
    if not sep:
        return False
    before_query = rest.split("?", 1)[0]
    authority = before_query.split("/", 1)[0]
    path = before_query[len(authority) :]
    return authority.count("@") > 1 or re.search(r"@[^/]*/", path) is not None


def register_driver_secrets(dsn: str) -> None:
    """Register what :func:`driver_secrets` finds (besides ``redaction.register_dsn``)."""
    for secret in driver_secrets(dsn):
        redaction.register_secret(secret)


def _valid(host: str, port: int, database: str | None) -> ServerParts | None:
    if not re.fullmatch(_HOST, host) or not 0 < port < 65536:
        return None
    if database is not None and not re.fullmatch(_DATABASE, database):
        return None
    for text in (host, database or ""):
        if redaction.redact_text(text) != text:  # it holds a registered secret
            return None
    return ServerParts(host, port, database)


def _first(value: str | None) -> str | None:
    return value.split(",")[0].strip() if value else value


def server_parts(dsn: str, kind: str) -> ServerParts | None:
    """(host, port, database) of ``dsn`` read as its driver reads it and validated; None when
    they do not parse or could hold a credential (then a name must be neutral)."""
    scheme, sep, rest = dsn.partition("://")
    default_port = _DEFAULT_PORTS.get(kind, 0)
    if kind == "postgres":
        view = libpq_view(dsn)
        if view is None:
            return None
        if sep and "@" in rest and "user" not in view and "password" not in view:
            return None  # an "@" libpq did not read as userinfo: the host may be a user name
        host = _first(view.get("host")) or _first(view.get("hostaddr")) or "localhost"
        port_text = _first(view.get("port")) or str(default_port)
        database = view.get("dbname") or None
    elif kind == "mssql" and scheme.strip().lower() == "odbc":
        fields: dict[str, str] = {}
        for key, value in redaction.odbc_fields(rest):  # a braced value comes unbraced first
            fields.setdefault(key.strip().upper(), value.strip())
        server = fields.get("SERVER", "localhost").removeprefix("tcp:")
        host, _, odbc_port = server.partition(",")
        port_text = odbc_port.strip() or str(default_port)
        database = fields.get("DATABASE") or None
    else:
        url = _url_view(dsn)
        if url is None:
            return None
        authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
        if "@" in rest and "@" not in authority:
            return None  # a raw "/", "?" or "#" in the userinfo: the URL parser misreads it
        host = url["host"] or "localhost"
        port_text = url.get("port") or str(default_port)
        database = url["dbname"] or None
    if not port_text.isdigit() or len(port_text) > 5:
        return None
    return _valid(host, int(port_text), database)
