"""What a Postgres error may say outside dpone: its class, SQLSTATE and the objects it names.

A driver's message can carry row values: DETAIL lines always may, and so may the primary
message of a data exception (22), a constraint violation (23) or a PL/pgSQL ``RAISE`` (P0)
that a target's trigger formats with ``NEW``. Only the SQLSTATE classes whose primary message
names objects keep it, and only when the server wrote it: an error raised inside a function of a
procedural language (a trigger's ``RAISE .. USING ERRCODE = '42501'``) says what its author
formatted, whatever its class. The connectors and the Postgres ledger describe errors this one
way (docs/security.md).
"""

from __future__ import annotations

import re
from typing import Any

#: SQLSTATE classes whose primary message names objects, never row values.
SAFE_MESSAGE_CLASSES = frozenset(
    {"08", "0A", "25", "28", "3D", "3F", "40", "42", "53", "54", "55", "57"}
)

#: A context line of an error raised in a procedural-language function (``PL/pgSQL function
#: f() line 3 at RAISE``, ``PL/Python function "f"``): user code, whose message may hold values.
_IN_USER_FUNCTION = re.compile(r"\bPL/[A-Za-z0-9]+ function\b")
#: The server's source files of the procedural languages' own errors (RAISE, plpy.error, ...).
_USER_CODE_FILES = ("pl_", "plpy", "plperl", "pltcl")

#: The column of a COPY context line (``COPY t, line 3, column v: "<value>"``): the line's first
#: ", line N" is the row's (a row-level context, ``COPY t, line 3: "<row>"``, then has no
#: column), and the name stops at the first ": ", so no part of the value is ever taken.
_COPY_COLUMN = re.compile(r"COPY (?:(?!, line [0-9]+[,:]).)+, line [0-9]+, column (.+?)(?:: |$)")


#: psycopg's own refusal of a value Python's datetime cannot hold (its message quotes the value
#: after this prefix, which is all that is kept)
_UNLOADABLE = re.compile(
    r"(?:date|timestamp|time|interval) too (?:large|small) \((?:after year 10K|before year 1)\)"
)


def describe_postgres_error(exc: Any) -> str:
    """Error class, SQLSTATE and object names of a psycopg error; never DETAIL, and no message
    outside SAFE_MESSAGE_CLASSES."""
    state = exc.sqlstate
    text = type(exc).__name__ + (f" (SQLSTATE {state})" if state else "")
    parts = [text]
    diag = exc.diag
    if diag.constraint_name:
        parts.append(f'constraint "{diag.constraint_name}"')
    column = diag.column_name or _copy_column(diag.context)
    if column:
        parts.append(f'column "{column}"')
    if diag.datatype_name:
        parts.append(f'type "{diag.datatype_name}"')
    if state and state[:2] in SAFE_MESSAGE_CLASSES and diag.message_primary:
        if _raised_by_user_code(diag):
            parts.append("message withheld: raised by a database function, it may hold row values")
        else:
            parts.append(diag.message_primary)
    if state is None:  # psycopg's, not the server's: a value it cannot load into Python
        parts.extend(_unloadable(str(exc)))
    return ", ".join(parts)


def _raised_by_user_code(diag: Any) -> bool:
    """True when a procedural-language function (a trigger's, a view's) raised the error or
    was running when it was raised: its text is not the server's own."""
    source = (diag.source_file or "").rsplit("/", 1)[-1]
    return source.startswith(_USER_CODE_FILES) or bool(_IN_USER_FUNCTION.search(diag.context or ""))


def _copy_column(context: str | None) -> str | None:
    """The column a COPY was reading when the server refused a value (its context's first
    line), so a data error names where it is without quoting what it is."""
    match = _COPY_COLUMN.match((context or "").split("\n", 1)[0])
    return match.group(1) if match else None


def _unloadable(message: str) -> list[str]:
    """What psycopg could not load, without the value it quotes: ``infinity``, a BC date, a year
    past 9999 or a time of 24:00 have no Python datetime form."""
    found = _UNLOADABLE.match(message)
    if found is not None:
        kind = found.group(0)
        return [
            f"{kind}: a value Python cannot hold (an infinity, a date before year 1 or after "
            "9999); filter or cast it in a source query"
        ]
    if message.startswith("can't parse time"):
        return ["a time of day of 24:00 or later, which Python cannot hold; cast it in a query"]
    return []
