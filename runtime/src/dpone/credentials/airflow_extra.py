"""An Airflow Connection's URI with its extra packed as ``?__extra__=<JSON>``, unpacked.

``Connection.get_uri()`` writes the extra as plain query parameters only when every value is a
string; one number or boolean (``{"sslmode": "disable", "connect_timeout": 5}``) makes it put the
whole extra, as JSON, into the one parameter ``__extra__``, which no driver knows. dpone turns it
back into the query parameters it stands for, so a Connection whose extra holds a number works the
same as one whose extra holds only strings. A nested value (an object or a list) has no query
parameter form and is refused, naming its key; the values are never quoted (one may be a secret).
"""

from __future__ import annotations

import json
from urllib.parse import quote, unquote, unquote_plus

from dpone import errors
from dpone.errors import DponeError

#: Airflow's ``Connection.EXTRA_KEY``
EXTRA_KEY = "__extra__"


def _text(value: object, kind: str) -> str | None:
    """A scalar as its query parameter's text; None for null (the parameter is left out)."""
    if value is None:
        return None
    if isinstance(value, bool):  # libpq has no booleans: its yes/no options are 1 and 0
        if kind in ("postgres", "postgresql"):
            return "1" if value else "0"
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    assert isinstance(value, str)
    return value


def unpack_airflow_extra(dsn: str, label: str) -> str:
    """``dsn`` with an ``__extra__`` query parameter replaced by the parameters its JSON object
    holds; any other DSN unchanged. ``label`` names the connection in messages."""
    if EXTRA_KEY not in dsn:
        return dsn
    scheme, sep, rest = dsn.partition("://")
    head, mark, tail = rest.rpartition("?")  # Airflow quotes every "?" before the query's
    if not sep or not mark:
        return dsn
    query, hash_mark, fragment = tail.partition("#")
    kept: list[str] = []
    packed: list[str] = []
    for piece in query.split("&"):
        key, _, value = piece.partition("=")
        if unquote(key) == EXTRA_KEY:
            packed.append(unquote_plus(value))  # urlencode wrote it
        elif piece:
            kept.append(piece)
    if not packed:
        return dsn
    where = f"{label}: the {EXTRA_KEY} query parameter (an Airflow Connection's extra)"
    if len(packed) > 1:
        raise DponeError(errors.CONFIG_INVALID, f"{where} is given twice")
    try:
        extra = json.loads(packed[0])
    except ValueError:
        extra = None
    if not isinstance(extra, dict):
        raise DponeError(errors.CONFIG_INVALID, f"{where} is not a JSON object")
    given = {unquote(piece.partition("=")[0]) for piece in kept}
    kind = scheme.strip().lower()
    for key, value in extra.items():
        if isinstance(value, dict | list):
            raise DponeError(
                errors.CONFIG_INVALID,
                f"{where} holds {key!r} as a JSON {'object' if isinstance(value, dict) else 'list'}"
                ", which cannot be a connection parameter: give it a string, number or boolean "
                "value in the Connection's extra, or remove it",
            )
        if key in given:
            raise DponeError(
                errors.CONFIG_INVALID,
                f"{where} sets {key!r}, which the URI also sets: keep one of them",
            )
        text = _text(value, kind)
        if text is not None:
            kept.append(f"{quote(key, safe='')}={quote(text, safe='')}")
    return f"{scheme}://{head}" + ("?" + "&".join(kept) if kept else "") + hash_mark + fragment
