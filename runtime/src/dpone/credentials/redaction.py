"""Secrets never leave the process: one redaction applied wherever text leaves dpone.

Two layers, because either alone misses something:

- a registry of the secret parts of every DSN dpone resolved (``register_dsn``): the whole DSN,
  every password-like value in every form dpone accepts (URL userinfo, URL query parameters,
  libpq ``key=value``, ODBC ``PWD=``), raw and decoded and as the usual quoting rules would echo
  it. A driver that quotes a fragment back (``invalid percent-encoded token: "S3cr3t%zz"``) is
  caught by this layer even when the text no longer looks like a DSN;
- pattern scrubbing of anything that looks like a connection string (``scheme://user:pw@...``,
  ``password=...``, ``PWD={...}``), for DSNs dpone never resolved (a test harness, a copy in a
  driver message).

``redact_text`` and ``redact_document`` are applied at every boundary: the stderr error lines, the
run result / XCom and evidence files, the ledger's stored error and cancel text, the status
renderers and warnings. Standard library only.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any
from urllib.parse import unquote, unquote_plus

MASK = "***"

#: parameter names (lower case) whose value is a secret, in any DSN form
SECRET_KEYS = frozenset(
    {
        "password",
        "passwd",
        "pass",
        "pwd",
        "sslpassword",
        "secret",
        "token",
        "access_token",
        "api_key",
        "apikey",
        "authentication_token",
    }
)
#: DSN parameter names (lower case) that hold an encryption key (SQLCipher's ``?key=``); kept
#: out of SECRET_KEYS, whose names the text scrubber masks wherever ``name=`` appears
KEY_PARAMETERS = frozenset({"key", "hexkey", "rekey", "hexrekey", "passphrase"})
#: parameter names whose free-text value is registered too (libpq passes ``options`` to the
#: server and echoes it back in errors)
FREE_TEXT_KEYS = frozenset({"options"})
#: a registered secret shorter than this is matched only as a whole token, so a one-letter test
#: password does not erase every such letter from a message
SHORT_SECRET = 6

# The patterns below are texts, compiled by ``re`` on first use and cached there: most runs never
# redact a message, and compiling them all cost a pod about 1.5 ms of its start.
_KEY_ALTERNATION = "|".join(sorted(SECRET_KEYS, key=len, reverse=True))
_KEY_VALUE = (
    rf"(?i)(?<![A-Za-z0-9_])((?:{_KEY_ALTERNATION})(?:%[0-9a-f]{{2}})*)(\s*=\s*)"
    r"('(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|\{(?:[^}]|\}\})*\}?|[^\s;&,'\")]*)"
)
_ENCODED_KEY_VALUE = r"(?i)([?&;\s])([^=&;\s]*%[0-9a-f]{2}[^=&;\s]*)=([^&;\s]*)"
#: libpq and the server quote a rejected setting back: ``invalid sslmode value: "X"``,
#: ``invalid connection option "X"``, ``invalid value for parameter "p": "X"``
_DRIVER_ECHO = (
    r"(?i)((?:invalid [\w -]{0,40}?(?:value|option|parameter|token)(?: for parameter \"[^\"\n]*\")?"
    r":? ?)|missing \"=\" after )\"[^\"\n]*\""
)
_URL = r"(?i)\b([a-z][a-z0-9+.\-]*)://([^\s'\"<>`]*)"


class _Registry:
    """The process's registered secret forms and the one pattern that matches them all."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.forms: set[str] = set()
        self.pattern: re.Pattern[str] | None = None

    def add(self, forms: set[str]) -> None:
        with self.lock:
            if forms <= self.forms:
                return
            self.forms.update(forms)
            ordered = sorted(self.forms, key=len, reverse=True)
            self.pattern = re.compile(
                "|".join(
                    (
                        re.escape(s)
                        if len(s) >= SHORT_SECRET
                        else rf"(?<![A-Za-z0-9]){re.escape(s)}(?![A-Za-z0-9])"
                    )
                    for s in ordered
                )
            )

    def clear(self) -> None:
        with self.lock:
            self.forms.clear()
            self.pattern = None


_REGISTRY = _Registry()


def forget_registered_secrets() -> None:
    """Forget every registered secret: for tests that run many commands in one process (a real
    `dpone` process registers only its own connections)."""
    _REGISTRY.clear()


def _variants(value: str) -> set[str]:
    """The ways a secret is commonly echoed: raw, percent-decoded, and quoted for repr, JSON,
    libpq ``key='value'`` and ODBC ``{value}``."""
    forms = {value}
    for decode in (unquote, unquote_plus):
        forms.add(decode(value))
    for form in list(forms):
        forms.add(repr(form)[1:-1])
        forms.add(json.dumps(form, ensure_ascii=False)[1:-1])
        forms.add(json.dumps(form)[1:-1])
        forms.add(form.replace("\\", "\\\\").replace("'", "\\'"))
        forms.add(form.replace("}", "}}"))
    return {form for form in forms if form}


def _odbc_pairs(text: str) -> list[tuple[str, str]]:
    """``KEY=value;KEY={va;lue}}}`` pairs, tolerant of a malformed tail."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        eq = text.find("=", i)
        if eq < 0:
            break
        key = text[i:eq].strip()
        j = eq + 1
        if j < len(text) and text[j] == "{":
            k, value = j + 1, []
            while k < len(text):
                if text[k] == "}":
                    if text[k + 1 : k + 2] == "}":
                        value.append("}")
                        k += 2
                        continue
                    break
                value.append(text[k])
                k += 1
            pairs.append((key, "".join(value)))
            pairs.append((key, text[j : k + 1]))
            end = text.find(";", k)
        else:
            end = text.find(";", j)
            pairs.append((key, text[j:] if end < 0 else text[j:end]))
        if end < 0:
            break
        i = end + 1
    return pairs


def odbc_fields(text: str) -> list[tuple[str, str]]:
    """The ``KEY=value`` pairs of an ODBC connection string (a braced value twice: unbraced, then
    as written)."""
    return _odbc_pairs(text)


def _libpq_pairs(text: str) -> list[tuple[str, str]]:
    """``key = value`` / ``key='quo\\'ted'`` pairs of a libpq keyword/value string."""
    pairs = []
    for match in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)", text):
        key, value = match.group(1), match.group(2)
        pairs.append((key, value))
        if value.startswith("'"):
            inner = value[1:-1] if value.endswith("'") and len(value) > 1 else value[1:]
            pairs.append((key, re.sub(r"\\(.)", r"\1", inner)))
    return pairs


def _url_pairs(text: str) -> list[tuple[str, str]]:
    """The password of a URL's userinfo (read two tolerant ways) and its query parameters."""
    pairs: list[tuple[str, str]] = []
    _, sep, rest = text.partition("://")
    if not sep:
        return pairs
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    candidates = {
        authority.rpartition("@")[0],
        rest.split("?", 1)[0].rpartition("@")[0],
        rest.rpartition("@")[0],  # libpq reads userinfo up to the last "@"
    }
    for userinfo in candidates:
        if ":" in userinfo:
            pairs.append(("password", userinfo.partition(":")[2]))
    query = rest.partition("?")[2].partition("#")[0]
    for field in re.split(r"[&;]", query):
        key, eq, value = field.partition("=")
        if eq:
            pairs.append((unquote_plus(key), value))
    return pairs


#: ``user:password@host[:port][/path]`` written without a scheme (``//`` allowed in front)
_BARE_USERINFO = r"(?://)?[^\s/:@]+:(?P<secret>[^\s]+)@[A-Za-z0-9_.\-]+(?::[0-9]*)?(?:/[^\s@]*)?"


def _bare_userinfo_pairs(text: str) -> list[tuple[str, str]]:
    """The password of a URL's userinfo written without a scheme (``etl:pw@db.example.com``);
    the host must read as a host name, so ``image:1.0@sha256:...`` is not taken for one."""
    if "://" in text:
        return []
    found = re.fullmatch(_BARE_USERINFO, text.strip())
    return [("password", found.group("secret"))] if found else []


def _pairs(dsn: str) -> list[tuple[str, str]]:
    pairs = _url_pairs(dsn) + _libpq_pairs(dsn) + _odbc_pairs(dsn.partition("://")[2] or dsn)
    pairs += _bare_userinfo_pairs(dsn)
    for key, value in list(pairs):
        if key.strip().lower() == "odbc_connect":  # odbc://?odbc_connect=<encoded ODBC string>
            pairs += _odbc_pairs(unquote_plus(value))
    return pairs


def has_credentials(value: str) -> bool:
    """True when ``value`` reads as a connection string that carries a password (any form)."""
    return any(key.strip().lower() in SECRET_KEYS and secret for key, secret in _pairs(value))


#: the last word of an environment variable's name that says its value is a secret
#: (``PGPASSWORD``, ``MYSQL_PWD``, ``AWS_SESSION_TOKEN``, ``OPENLINEAGE_API_KEY``)
_SECRET_NAME_ENDINGS = (
    ("PASSWORD",),
    ("PGPASSWORD",),
    ("PASSWD",),
    ("PWD",),
    ("SECRET",),
    ("TOKEN",),
    ("APIKEY",),
    ("API", "KEY"),
    ("SECRET", "KEY"),
    ("ACCESS", "KEY"),
    ("PRIVATE", "KEY"),
    ("AUTH", "KEY"),
    ("FERNET", "KEY"),
    ("PASS",),
    ("PASSPHRASE",),
)
#: a ``NAME=value`` assignment inside a command or a string (``PGPASSWORD=x psql``, ``env
#: MYSQL_PWD=x``, ``export API_TOKEN=x``); a value taken from a variable (``$X``) is no secret
_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_$])([A-Za-z_][A-Za-z0-9_]*)=(?![\s$]|$)")
#: OTLP header lists (``OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer ..``) that carry a secret
_SECRET_HEADER = re.compile(
    r"(?i)(?:^|,)\s*(?:authorization|proxy-authorization|x-api-key|api-key|x-auth-token)\s*="
)


def secret_env_name(name: str, value: str) -> bool:
    """True when an environment variable named ``name`` holds a secret by its name (its last
    words, ``_``-separated, say password, token, secret or key) or, for an OTLP headers list,
    an authorization header. Such a value must come from a secret, never be written in clear."""
    if not value.strip():
        return False
    words = tuple(word for word in re.split(r"[_.\-]+", name.upper()) if word)
    if any(words[-len(ending) :] == ending for ending in _SECRET_NAME_ENDINGS):
        return True
    return words[-1:] == ("HEADERS",) and _SECRET_HEADER.search(value) is not None


#: header names whose value is a credential (in a JSON headers object as in an OTLP list)
_SECRET_HEADER_NAMES = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-auth-token"}
)
#: how deep json_secrets looks into nested objects (an Airflow Connection's extra, a transport's
#: auth); deeper ones are not read
_JSON_DEPTH = 8


def json_secrets(text: str) -> list[tuple[str, str]]:
    """The (field, value) pairs of a JSON object in ``text``, at any depth, whose value is a
    secret: a non-empty string under a field named as one (``password``, ``apiKey``,
    ``client_secret``, an ``Authorization`` header), or a connection string with a password.
    Airflow's JSON form of a Connection and an OpenLineage transport's ``auth`` read so; text
    that is no JSON object has none."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return []
    try:
        document = json.loads(stripped)
    except (ValueError, RecursionError):
        return []
    found: list[tuple[str, str]] = []
    _json_secrets(document, _JSON_DEPTH, found)
    return found


def _json_secrets(node: Any, depth: int, found: list[tuple[str, str]]) -> None:
    if depth <= 0:
        return
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node) if isinstance(node, list) else ()
    )
    for key, value in items:
        name = str(key)
        if isinstance(value, str):
            if value.strip() and (
                name.strip().lower() in SECRET_KEYS
                or name.strip().lower() in _SECRET_HEADER_NAMES
                or secret_env_name(name, value)
                or has_credentials(value)
            ):
                found.append((name, value))
        else:
            _json_secrets(value, depth - 1, found)


def secret_parameter(name: str) -> bool:
    """True when a DSN parameter named ``name`` (in a URL query, a libpq or an ODBC string, any
    scheme, sqlite included) holds a secret: a name of SECRET_KEYS or KEY_PARAMETERS, or one
    whose last words say so as a variable's name would (``client_secret``, ``auth_token``,
    ``ssl_key``, ``db_passphrase``); percent-encoded names are decoded first."""
    plain = unquote_plus(name).strip().lower()
    if not plain:
        return False
    if plain in SECRET_KEYS or plain in KEY_PARAMETERS or secret_env_name(plain, "x"):
        return True
    return re.split(r"[_.\-]+", plain)[-1] in ("key", "passphrase")


def secret_assignment(text: str) -> str | None:
    """The name of the first variable ``text`` sets to a value in clear whose name says it is a
    secret (``PGPASSWORD=s3cret psql ...``), or None."""
    for match in _ASSIGNMENT.finditer(text):
        if secret_env_name(match.group(1), "x"):
            return match.group(1)
    return None


def secret_parts(dsn: str) -> set[str]:
    """Every secret fragment of ``dsn`` in any accepted form, malformed ones included."""
    found: set[str] = set()
    for key, value in _pairs(dsn):
        if value and (secret_parameter(key) or key.strip().lower() in FREE_TEXT_KEYS):
            found |= _variants(value)
    return found


def register_secret(value: str) -> None:
    """Redact ``value`` (and its usual echoes) from every output of this process."""
    _REGISTRY.add(_variants(value))


def register_dsn(dsn: str) -> None:
    """Register the whole DSN and each of its secret parts (called where a DSN is resolved)."""
    if not dsn:
        return
    if not dsn.lower().startswith("sqlite:"):  # a file path, no credentials
        register_secret(dsn)
    for part in secret_parts(dsn):
        register_secret(part)


def _scrub_url(match: re.Match[str]) -> str:
    scheme, rest = match.group(1), match.group(2)
    authority, sep, tail = rest.partition("/") if "/" in rest else (rest, "", "")
    before_query = rest.split("?", 1)[0]
    has_user = "@" in before_query
    host = authority.rpartition("@")[2]
    if has_user and "@" not in authority:  # a malformed userinfo holding "/": hide up to the "@"
        host, sep, tail = before_query.rpartition("@")[2], "", ""
    path = tail.split("?", 1)[0]
    query = "?" + MASK if "?" in rest else ""
    user = MASK + "@" if has_user else ""
    return f"{scheme}://{user}{host}{sep}{path}{query}"


def redact_text(text: str) -> str:
    """``text`` with every registered secret and every DSN-looking secret replaced by ***."""
    pattern = _REGISTRY.pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    text = re.sub(_URL, _scrub_url, text)
    text = re.sub(_DRIVER_ECHO, lambda m: m.group(1) + '"' + MASK + '"', text)
    text = re.sub(_KEY_VALUE, lambda m: m.group(1) + m.group(2) + MASK, text)
    return re.sub(
        _ENCODED_KEY_VALUE,
        lambda m: (
            m.group(1) + m.group(2) + "=" + MASK if secret_parameter(m.group(2)) else m.group(0)
        ),
        text,
    )


#: quoted words of libpq's own in its DSN parse errors, never a piece of the DSN
_DRIVER_OWN_QUOTES = ('"="', '"]"')


def mask_quoted(text: str) -> str:
    """A driver's DSN parse error with every quoted fragment masked (they are DSN pieces).

    A fragment may hold quotes itself (``unexpected spaces found in "pa"ss word"``), so a line is
    masked from its first quote to its last (to its end when one quote is left), keeping only
    libpq's own quoted words."""
    kept: list[str] = []

    def keep(match: re.Match[str]) -> str:
        kept.append(match.group(0))
        return f"\x00{len(kept) - 1}\x00"

    own = "|".join(re.escape(word) for word in _DRIVER_OWN_QUOTES)
    masked = re.sub(own, keep, text.replace("\x00", ""))
    masked = re.sub(r'"[^\n]*"|"[^\n]*', '"' + MASK + '"', masked)
    return re.sub(r"\x00(\d+)\x00", lambda m: kept[int(m.group(1))], masked)


def redact_document(value: Any) -> Any:
    """A JSON-shaped value with ``redact_text`` applied to every string (keys included)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            redact_text(k) if isinstance(k, str) else k: redact_document(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_document(v) for v in value]
    return value


def describe_dsn(dsn: str) -> str:
    """What a message may say about a DSN: its scheme, host, port and database, nothing else."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return "(a DSN that is not a URL)"
    if scheme.lower() == "odbc":
        servers = [v for k, v in _odbc_pairs(rest) if k.strip().lower() == "server"]
        return "odbc://" + (f"SERVER={servers[0]}" if servers else "...")
    before_query = rest.split("?", 1)[0]
    if "@" in rest and "@" not in before_query:
        return f"{scheme}://(unreadable DSN)"  # the userinfo itself holds "?": show nothing
    hostpart = before_query.rpartition("@")[2]
    if not re.fullmatch(r"[A-Za-z0-9._\-:\[\],%/]*", hostpart):
        return f"{scheme}://(unreadable DSN)"
    described = f"{scheme}://{hostpart}"
    pattern = _REGISTRY.pattern
    return described if pattern is None else pattern.sub(MASK, described)
