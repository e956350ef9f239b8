"""A connection's DSN assembled from the parts teams keep apart: a DSN without its password, a
password in its own secret key or in a mounted file, one secret key per field.

Read from the environment at connect time (never cached), so a file a Vault agent or a CSI driver
rewrites is picked up by the next connection without restarting anything:

- ``DPONE_CONN_<NAME>``: the whole DSN (or ``DPONE_CONN_<NAME>_FILE``: a file holding it);
- ``DPONE_CONN_<NAME>_<FIELD>`` or ``DPONE_CONN_<NAME>_<FIELD>_FILE`` for FIELD in SCHEME, HOST,
  PORT, USER, PASSWORD, DBNAME: that part, put into the DSN (or, with SCHEME and no DSN, building
  it).

Parts are never spliced as text: each is percent-encoded into its URL component and the result is
read back with the driver's own parser (libpq's for Postgres, the URL parser the MySQL and MSSQL
connectors use) and refused unless the driver sees exactly the parts given, so a password with
``/ @ : ? # %`` reaches the server unchanged. Every part that is a secret, and the assembled DSN,
is registered for redaction before anything can print it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from dpone import errors
from dpone.credentials import redaction
from dpone.credentials.dsn_parts import _url_view, libpq_view, register_driver_secrets
from dpone.errors import DponeError

#: the parts a connection may take from its own variable or file, in DSN order
FIELDS = ("scheme", "host", "port", "user", "password", "dbname")
#: the parts whose value is a secret (registered for redaction as they are read)
SECRET_FIELDS = frozenset({"password"})
#: a credential file larger than this is not a credential (a device, a wrong path)
MAX_FILE_BYTES = 64 * 1024
_URL_SCHEMES = frozenset({"postgres", "postgresql", "mysql", "mariadb", "mssql", "mssql+pyodbc"})


def field_env(name: str, field: str) -> str:
    """DPONE_CONN_<NAME>_<FIELD>: where one part of connection ``name`` arrives."""
    return f"DPONE_CONN_{name.upper()}_{field.upper()}"


def dsn_file_env(name: str) -> str:
    return f"DPONE_CONN_{name.upper()}_FILE"


def has_any(name: str, env: Mapping[str, str]) -> bool:
    """Whether any form of connection ``name`` is set (a DSN, its file, or a part)."""
    base = f"DPONE_CONN_{name.upper()}"
    keys = [base, dsn_file_env(name)]
    for field in FIELDS:
        keys += [field_env(name, field), field_env(name, field) + "_FILE"]
    return any(env.get(key) for key in keys)


def _read_file(variable: str, path: str) -> str:
    """The file's text without its final line break (``kubectl create secret --from-file`` keeps
    one), read now: a rotated file is seen by the next connection."""
    try:
        # non-blocking: a pipe (or a FIFO left where the secret should be) must not hang the run
        # before its signal handlers can end it; fstat then refuses anything but a file
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise DponeError(
                    errors.CONNECTION_MISSING,
                    f"{variable} names {path!r}, which is not a regular file (a folder, a pipe "
                    "or a device)",
                )
            data = b""
            while len(data) <= MAX_FILE_BYTES:
                block = os.read(fd, MAX_FILE_BYTES + 1 - len(data))
                if not block:
                    break
                data += block
        finally:
            os.close(fd)
        if len(data) > MAX_FILE_BYTES:
            raise DponeError(
                errors.CONNECTION_MISSING,
                f"{variable} names {path!r}, which holds more than {MAX_FILE_BYTES} bytes",
            )
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise DponeError(
            errors.CONNECTION_MISSING, f"{variable} names {path!r}, which cannot be read: {reason}"
        ) from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise DponeError(errors.CONNECTION_MISSING, f"{variable} names {path!r}, which is empty")
    return text


def _value(variable: str, env: Mapping[str, str], secret: bool) -> str | None:
    """The value of ``variable`` or of the file ``variable``_FILE names; the direct one wins."""
    value = env.get(variable) or None
    if value is not None and not _utf8(value):  # a byte the environment could not decode
        raise DponeError(
            errors.CONFIG_INVALID,
            f"{variable} holds bytes that are not UTF-8 text; write it in UTF-8 (percent-encode "
            "other bytes in a URL)",
        )
    if value is None and env.get(variable + "_FILE"):
        value = _read_file(variable + "_FILE", env[variable + "_FILE"])
    if value is not None and secret:
        redaction.register_secret(value)
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _netloc(hostport: str, user: str | None, password: str | None) -> str:
    userinfo = ""
    if user is not None:
        userinfo = quote(user, safe="")
    if password is not None:
        userinfo += ":" + quote(password, safe="")
    if userinfo:
        userinfo += "@"
    return userinfo + hostport


def _hostport(host: str, port: str | None) -> str:
    shown_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return shown_host + (f":{port}" if port else "")


def assemble(base: str | None, parts: Mapping[str, str], label: str) -> str:
    """``base`` (a URL DSN, or None with a ``scheme`` part) with ``parts`` put in, checked with the
    driver's parser. ``label`` names the connection in messages (never the DSN)."""
    if base is None:
        base = parts["scheme"] + "://"
    elif "scheme" in parts:
        raise DponeError(
            errors.CONFIG_INVALID,
            f"{label}: a SCHEME part is set beside a whole DSN; set one of them",
        )
    scheme, sep, _ = base.partition("://")
    kind = scheme.strip().lower()
    if not sep or kind not in _URL_SCHEMES:
        raise DponeError(
            errors.CONFIG_INVALID,
            f"{label}: separate parts go into a postgresql://, mysql:// or mssql:// DSN "
            f"(not {kind + '://' if sep else 'this DSN'}); put them in the DSN itself",
        )
    moved = "host" in parts or "port" in parts  # else the base's host text is kept as written
    try:
        url = urlsplit(base.strip())
        port = parts.get("port")
        if moved and port is None and url.port is not None:
            port = str(url.port)
    except ValueError:
        raise DponeError(errors.CONFIG_INVALID, f"{label}: the DSN is malformed") from None
    if port is not None and not port.isdigit():
        raise DponeError(errors.CONFIG_INVALID, f"{label}: the PORT part is not a number")
    user = parts.get("user", None if url.username is None else _unq(url.username))
    password = parts.get("password", None if url.password is None else _unq(url.password))
    host = parts.get("host", url.hostname or "")
    dbname = parts.get("dbname", _unq(url.path.lstrip("/")))
    if password is not None and user is None:
        user = ""
    if moved:
        hostport = _hostport(host, port)
    else:  # the base's own text: a socket folder or a host list stays as its driver reads it
        hostport = url.netloc.rpartition("@")[2]
        host = ""
    dsn = urlunsplit(
        (
            url.scheme,
            _netloc(hostport, user, password),
            "/" + quote(dbname, safe="") if dbname else "",
            url.query,
            url.fragment,
        )
    )
    if password is not None:
        redaction.register_secret(password)
    redaction.register_dsn(dsn)
    register_driver_secrets(dsn)
    _check_driver_reads(dsn, kind, host, port, user, password, dbname, label)
    return dsn


def _unq(text: str) -> str:
    return unquote(text)


def _check_driver_reads(
    dsn: str,
    kind: str,
    host: str,
    port: str | None,
    user: str | None,
    password: str | None,
    dbname: str,
    label: str,
) -> None:
    """Refuse unless the driver's parser reads back exactly the parts given."""
    view = libpq_view(dsn) if kind in ("postgres", "postgresql") else _url_view(dsn)
    if view is None:
        if kind in ("postgres", "postgresql"):
            return  # psycopg is not installed: the Postgres connector cannot open it either
        raise DponeError(errors.CONFIG_INVALID, f"{label}: the assembled DSN does not parse")
    expected = {"host": host or None, "user": user or None, "password": password or None}
    expected["port"] = port if host else None
    expected["dbname"] = dbname or None
    for key, given in expected.items():
        got = view.get(key) or None
        want = given.lower() if key == "host" and given else given  # host names ignore case
        if key == "host" and got is not None:
            got = got.lower()
        if want is not None and got != want:
            raise DponeError(
                errors.CONFIG_INVALID,
                f"{label}: the driver reads the assembled DSN's {key} differently from the part "
                "given (a character its parser cannot carry)",
            )


def resolve_parts(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The DSN of connection ``name`` from any of its forms, read now; None when none is set."""
    env = os.environ if environ is None else environ
    base_var = f"DPONE_CONN_{name.upper()}"
    base = _value(base_var, env, secret=True)
    if base is not None and "__extra__" in base:  # an Airflow Connection's packed extra
        from dpone.credentials.airflow_extra import unpack_airflow_extra

        base = unpack_airflow_extra(base, f"connection {name!r}")
    parts: dict[str, str] = {}
    for field in FIELDS:
        value = _value(field_env(name, field), env, secret=field in SECRET_FIELDS)
        if value is not None:
            parts[field] = value
    if base is None and not parts:
        return None
    if not parts:
        return base
    if base is None and "scheme" not in parts:
        raise DponeError(
            errors.CONNECTION_MISSING,
            f"connection {name!r} has parts but no DSN: set {base_var} (a DSN without the parts) "
            f"or {field_env(name, 'scheme')}",
        )
    return assemble(base, parts, f"connection {name!r}")
