"""What a Postgres error may say outside dpone: the objects it names, never a row value."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from dpone.credentials.postgres_errors import describe_postgres_error


class _Refused(Exception):
    def __init__(
        self, sqlstate: str, context: str | None, primary: str = "x", source: str | None = None
    ) -> None:
        super().__init__(primary)
        self.sqlstate = sqlstate
        self.diag = SimpleNamespace(
            constraint_name=None,
            column_name=None,
            datatype_name=None,
            message_primary=primary,
            context=context,
            source_file=source,
        )


@pytest.mark.parametrize(
    ("context", "source"),
    [
        ("PL/pgSQL function a.trg() line 3 at RAISE", "pl_exec.c"),
        ("PL/pgSQL function a.trg() line 4 at EXECUTE", "parse_relation.c"),
        ('PL/Python function "trg"', "plpy_elog.c"),
        (None, "pl_exec.c"),
    ],
)
def test_a_message_a_database_function_raised_is_withheld_whatever_its_class(
    context: str | None, source: str
) -> None:
    for state in ("42501", "40001", "0A000", "55000"):
        text = describe_postgres_error(_Refused(state, context, "customer Secret-77", source))
        assert f"(SQLSTATE {state})" in text and "Secret" not in text
        assert "message withheld" in text
    # the server's own message of the same class is kept: it names objects
    kept = describe_postgres_error(_Refused("42501", None, "permission denied for table t"))
    assert kept.endswith("permission denied for table t")


@pytest.mark.parametrize(
    ("context", "named"),
    [
        ('COPY t, line 2, column v: "2023-13-45 secret"', 'column "v"'),
        ("COPY t, line 2, column v", 'column "v"'),  # binary COPY quotes no value
        ('COPY t, line 7, column a: b: "secret"', 'column "a"'),  # cut short, never the value
        ('COPY "x, line 1, column y", line 3, column v: "secret"', 'column "y", line 3'),
        ('COPY t, line 2: "secret, line 3, column z: w"', None),  # a row, not a column
        ("PL/pgSQL function f() line 3 at RAISE", None),
        (None, None),
    ],
)
def test_a_data_error_names_the_copy_column_but_never_the_value(
    context: str | None, named: str | None
) -> None:
    text = describe_postgres_error(_Refused("22008", context, 'date/time "secret" out of range'))
    assert text.startswith("_Refused (SQLSTATE 22008)") and "secret" not in text
    assert (named in text) if named else ("column" not in text)


@pytest.mark.parametrize(
    ("message", "setting"),
    [
        (
            'connection to server at "h", port 5432 failed: server does not support SSL, but SSL '
            "was required",
            "sslmode",
        ),
        (
            'connection to server at "h", port 5432 failed: SSL error: certificate verify failed',
            "sslrootcert",
        ),
        (
            'connection to server at "h", port 5432 failed: server certificate for "db" does not '
            'match host name "h"',
            "host",
        ),
        ('connection to server at "h", port 5432 failed: Connection refused', None),
    ],
)
def test_a_tls_setting_the_server_can_never_satisfy_is_a_setting_problem(
    message: str, setting: str | None
) -> None:
    from dpone.credentials.dsn_settings import postgres_setting_problem

    found = postgres_setting_problem(message)
    assert (found.split(" ", 1)[0] if found else None) == setting


class _Unloadable(Exception):
    """psycopg's DataError for a value it cannot load: no SQLSTATE, the value quoted."""

    sqlstate = None
    diag = SimpleNamespace(
        constraint_name=None,
        column_name=None,
        datatype_name=None,
        message_primary=None,
        context=None,
    )


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        ("timestamp too large (after year 10K): 'infinity'", "timestamp too large"),
        ("date too small (before year 1): '0044-03-15 BC'", "date too small"),
        ("can't parse time '24:00:00': hour must be in 0..23", "24:00 or later"),
        ("PostgreSQL text fields cannot contain NUL (0x00) bytes", None),
    ],
)
def test_a_value_python_cannot_load_is_described_without_the_value(
    message: str, kept: str | None
) -> None:
    text = describe_postgres_error(_Unloadable(message))
    assert text.startswith("_Unloadable")
    assert "'infinity'" not in text and "BC'" not in text and "'24:00:00'" not in text
    assert (kept in text) if kept else (text == "_Unloadable")
