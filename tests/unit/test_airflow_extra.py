"""An Airflow Connection whose extra holds a number or a boolean reaches dpone as a URI with
``?__extra__=<JSON>`` (``Connection.get_uri``): its scalar entries become the query parameters
they stand for, a nested one is refused naming its key, and a parameter libpq does not know is
named in the refusal instead of masked."""

from __future__ import annotations

from pathlib import Path

import pytest
from dpone import errors
from dpone.credentials import redaction
from dpone.credentials.connections import resolve_dsn
from dpone.errors import DponeError
from psycopg.conninfo import conninfo_to_dict

#: what ``Connection.get_uri()`` returns (Airflow 2.10.5 and 3.3.2 alike) for login ``app``,
#: password ``p/@:?#%w``, host ``db.example``, port 6432, schema ``sales`` and the extra
#: ``{"sslmode": "disable", "connect_timeout": 5, "keepalives": true}``
AIRFLOW_URI = (
    "postgres://app:p%2F%40%3A%3F%23%25w@db.example:6432/sales?__extra__=%7B%22sslmode%22%3A+"
    "%22disable%22%2C+%22connect_timeout%22%3A+5%2C+%22keepalives%22%3A+true%7D"
)
#: the same without password or schema (Airflow then writes ``/?``)
AIRFLOW_URI_BARE = "postgres://app@db.example/?__extra__=%7B%22connect_timeout%22%3A+5%7D"


def _packed(extra: str, dsn: str = "postgres://app@db.example/sales") -> str:
    from urllib.parse import urlencode

    return dsn + ("&" if "?" in dsn else "?") + urlencode({"__extra__": extra})


def test_a_packed_extra_becomes_query_parameters_libpq_reads() -> None:
    info = conninfo_to_dict(resolve_dsn("wh", {"DPONE_CONN_WH": AIRFLOW_URI}))
    assert info == {
        "user": "app",
        "password": "p/@:?#%w",
        "host": "db.example",
        "port": "6432",
        "dbname": "sales",
        "sslmode": "disable",
        "connect_timeout": "5",
        "keepalives": "1",  # libpq's yes/no options are integers
    }


def test_a_packed_extra_combines_with_a_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret/@pw\n", encoding="utf-8")
    env = {"DPONE_CONN_WH": AIRFLOW_URI_BARE, "DPONE_CONN_WH_PASSWORD_FILE": str(secret)}
    info = conninfo_to_dict(resolve_dsn("wh", env))
    assert (info["password"], info["connect_timeout"], info["host"]) == (
        "s3cret/@pw",
        "5",
        "db.example",
    )
    assert "s3cret/@pw" not in redaction.redact_text(f"failed: {info['password']}")


def test_other_schemes_keep_json_booleans_and_null_is_left_out() -> None:
    dsn = resolve_dsn(
        "m",
        {"DPONE_CONN_M": _packed('{"ssl_verify_cert": false, "x": null}', "mysql://u@h:3306/d")},
    )
    assert dsn == "mysql://u@h:3306/d?ssl_verify_cert=false"


def test_a_secret_in_the_extra_is_registered_for_redaction() -> None:
    dsn = resolve_dsn("wh", {"DPONE_CONN_WH": _packed('{"sslpassword": "k3y-Secret", "port": 1}')})
    assert conninfo_to_dict(dsn)["sslpassword"] == "k3y-Secret"
    assert "k3y-Secret" not in redaction.redact_text("key k3y-Secret")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ('{"sslmode": "disable", "options": {"a": 1}}', "holds 'options' as a JSON object"),
        ('{"hosts": ["a", "b"]}', "holds 'hosts' as a JSON list"),
        ('["sslmode"]', "is not a JSON object"),
        ("{not json", "is not a JSON object"),
    ],
)
def test_a_nested_or_unreadable_extra_is_refused_naming_the_key(extra: str, fragment: str) -> None:
    with pytest.raises(DponeError) as caught:
        resolve_dsn("wh", {"DPONE_CONN_WH": _packed(extra)})
    assert caught.value.code == errors.CONFIG_INVALID
    assert fragment in caught.value.message and "connection 'wh'" in caught.value.message


def test_a_key_set_twice_is_refused() -> None:
    given = _packed('{"sslmode": "disable"}', "postgres://u@h/d?sslmode=require")
    with pytest.raises(DponeError, match="sets 'sslmode', which the URI also sets"):
        resolve_dsn("wh", {"DPONE_CONN_WH": given})


def test_a_dsn_without_a_packed_extra_is_unchanged() -> None:
    dsn = "postgresql://u:p%2B@h/d?application_name=a+b&sslmode=disable"
    assert resolve_dsn("wh", {"DPONE_CONN_WH": dsn}) == dsn


def test_an_unknown_parameter_is_named_not_masked() -> None:
    """An extra libpq does not know (Airflow's PostgresHook reads ``cursor``, libpq does not) is
    refused naming the parameter; its value stays out of the message."""
    from dpone.connectors.postgres import PgConnection
    from dpone.ledger.postgres import connection_info

    dsn = resolve_dsn("wh", {"DPONE_CONN_WH": _packed('{"cursor": "dictcursor", "n": 1}')})
    with pytest.raises(DponeError) as ledger:
        connection_info(dsn, "dpone-ledger")
    with pytest.raises(DponeError) as connector:
        PgConnection(dsn, "table t").get()
    for caught in (ledger, connector):
        assert caught.value.code == errors.CONFIG_INVALID
        assert "'cursor' is not a connection parameter libpq knows" in caught.value.message
        assert "dictcursor" not in caught.value.message
