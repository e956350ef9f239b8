"""Connections from parts: a DSN without password plus the password from its own variable or
file, any part from a file re-read at each resolve, and the driver reading back exactly the parts
(a password with / @ : ? # % included)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dpone import errors
from dpone.credentials import redaction
from dpone.credentials.connections import require_connections, resolve_dsn
from dpone.credentials.dsn_parts import _url_view
from dpone.errors import DponeError
from psycopg.conninfo import conninfo_to_dict

HARD = "p/@:?#%&=;' x}"


@pytest.fixture(autouse=True)
def _forget() -> None:
    redaction.forget_registered_secrets()


def test_separate_password_reaches_libpq_unchanged() -> None:
    env = {
        "DPONE_CONN_WH": "postgresql://app@db.example:6432/sales?application_name=x",
        "DPONE_CONN_WH_PASSWORD": HARD,
    }
    info = conninfo_to_dict(resolve_dsn("wh", env))
    assert info["password"] == HARD
    assert (info["host"], info["port"], info["dbname"], info["user"]) == (
        "db.example",
        "6432",
        "sales",
        "app",
    )
    assert info["application_name"] == "x"


@pytest.mark.parametrize("scheme", ["mysql", "mssql"])
def test_separate_password_reaches_the_url_connectors_unchanged(scheme: str) -> None:
    env = {
        "DPONE_CONN_WH": f"{scheme}://app@db.example:3306/sales",
        "DPONE_CONN_WH_PASSWORD": HARD,
    }
    view = _url_view(resolve_dsn("wh", env))
    assert view is not None and view["password"] == HARD and view["host"] == "db.example"


def test_password_file_is_read_again_at_each_resolve(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("first-Secret/1\n", encoding="utf-8")  # kubectl --from-file keeps a newline
    env = {
        "DPONE_CONN_WH": "postgresql://app@127.0.0.1/test",
        "DPONE_CONN_WH_PASSWORD_FILE": str(secret),
    }
    assert conninfo_to_dict(resolve_dsn("wh", env))["password"] == "first-Secret/1"
    secret.write_text("second-Secret@2", encoding="utf-8")  # rotated in place
    assert conninfo_to_dict(resolve_dsn("wh", env))["password"] == "second-Secret@2"
    shown = redaction.redact_text("a: first-Secret/1 b: second-Secret@2")
    assert "first-Secret" not in shown and "second-Secret" not in shown


def test_every_part_from_its_own_variable_or_file(tmp_path: Path) -> None:
    (tmp_path / "host").write_text("db.internal", encoding="utf-8")
    (tmp_path / "dsn").write_text("postgresql://ignored@h/d", encoding="utf-8")
    env = {
        "DPONE_CONN_WH_SCHEME": "postgresql",
        "DPONE_CONN_WH_HOST_FILE": str(tmp_path / "host"),
        "DPONE_CONN_WH_PORT": "5433",
        "DPONE_CONN_WH_USER": "loader",
        "DPONE_CONN_WH_PASSWORD": "pw-Field#9",
        "DPONE_CONN_WH_DBNAME": "sales",
    }
    info = conninfo_to_dict(resolve_dsn("wh", env))
    assert info == {
        "host": "db.internal",
        "port": "5433",
        "user": "loader",
        "password": "pw-Field#9",
        "dbname": "sales",
    }
    whole = {"DPONE_CONN_WH_FILE": str(tmp_path / "dsn")}
    assert resolve_dsn("wh", whole) == "postgresql://ignored@h/d"
    assert "postgresql://ignored@h/d" not in redaction.redact_text("dsn postgresql://ignored@h/d")


def test_assembled_dsn_and_password_are_redacted() -> None:
    env = {"DPONE_CONN_WH": "postgresql://app@db/x", "DPONE_CONN_WH_PASSWORD": "Rotated-Pw/@:1"}
    dsn = resolve_dsn("wh", env)
    text = redaction.redact_text(f"failed: {dsn} with Rotated-Pw/@:1 and Rotated-Pw%2F%40%3A1")
    assert "Rotated-Pw" not in text


def test_parts_without_a_dsn_or_scheme_are_refused() -> None:
    with pytest.raises(DponeError) as caught:
        resolve_dsn("wh", {"DPONE_CONN_WH_PASSWORD": "secret-Pw1"})
    assert caught.value.code == errors.CONNECTION_MISSING
    assert "DPONE_CONN_WH_SCHEME" in str(caught.value) and "secret-Pw1" not in str(caught.value)


def test_missing_or_empty_file_is_refused_without_its_content(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n", encoding="utf-8")
    for path in (tmp_path / "nothing", empty):
        env = {"DPONE_CONN_WH": "postgresql://a@h/d", "DPONE_CONN_WH_PASSWORD_FILE": str(path)}
        with pytest.raises(DponeError) as caught:
            resolve_dsn("wh", env)
        assert caught.value.code == errors.CONNECTION_MISSING
        assert "DPONE_CONN_WH_PASSWORD_FILE" in str(caught.value)


@pytest.mark.parametrize("kind", ["fifo", "folder", "device", "too large"])
def test_a_file_that_is_no_credential_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """A pipe used to block the run before its signal handlers could end it; /dev/zero was read
    until memory ran out."""
    import os
    import threading

    path = tmp_path / "password"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path = Path("/dev/zero")
    else:
        path.write_bytes(b"x" * (64 * 1024 + 1))
    env = {"DPONE_CONN_WH": "postgresql://a@h/d", "DPONE_CONN_WH_PASSWORD_FILE": str(path)}
    outcome: list[BaseException] = []

    def resolve() -> None:
        try:
            resolve_dsn("wh", env)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=resolve, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "reading the file blocked"
    (caught,) = outcome
    assert isinstance(caught, DponeError) and caught.code == errors.CONNECTION_MISSING
    assert "DPONE_CONN_WH_PASSWORD_FILE" in str(caught)


def test_parts_for_odbc_and_scheme_beside_dsn_are_refused() -> None:
    cases = [
        {"DPONE_CONN_WH": "odbc://DRIVER={x};SERVER=h", "DPONE_CONN_WH_PASSWORD": "secret-Pw1"},
        {"DPONE_CONN_WH": "postgresql://a@h/d", "DPONE_CONN_WH_SCHEME": "mysql"},
        {"DPONE_CONN_WH": "postgresql://a@h/d", "DPONE_CONN_WH_PORT": "54x"},
    ]
    for env in cases:
        with pytest.raises(DponeError) as caught:
            resolve_dsn("wh", env)
        assert caught.value.code == errors.CONFIG_INVALID
        assert "secret-Pw1" not in str(caught.value)


def test_require_connections_counts_every_form(tmp_path: Path) -> None:
    env = {
        "DPONE_CONN_A_FILE": str(tmp_path / "a"),
        "DPONE_CONN_B_SCHEME": "postgresql",
        "DPONE_CONN_C": "postgresql://x@h/d",
    }
    require_connections(["a", "b", "c"], env)
    with pytest.raises(DponeError) as caught:
        require_connections(["a", "d"], env)
    assert "DPONE_CONN_D" in str(caught.value)


def test_a_socket_folder_or_host_list_in_the_base_is_kept_as_written() -> None:
    for base, host in (
        ("postgresql://app@%2Fvar%2Frun%2FPG/db", "/var/run/PG"),
        ("postgresql://app@h1:5432,h2:5433/db", "h1,h2"),
    ):
        env = {"DPONE_CONN_WH": base, "DPONE_CONN_WH_PASSWORD": "Sock-Pw/@1"}
        info = conninfo_to_dict(resolve_dsn("wh", env))
        assert (info["host"], info["password"], info["dbname"]) == (host, "Sock-Pw/@1", "db")
