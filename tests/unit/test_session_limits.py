"""Session limits (issue 9): defaults, validation of the variables, the Postgres settings."""

from __future__ import annotations

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.lifecycle.session_limits import VARIABLES, session_limits


def test_defaults_end_a_silent_peer_within_a_minute() -> None:
    limits = session_limits({})
    assert limits.dead_peer_s <= 60
    settings = dict(limits.postgres_settings(150000))
    assert settings["idle_in_transaction_session_timeout"] == "60000ms"
    assert settings["tcp_keepalives_idle"] == "20"
    assert settings["tcp_user_timeout"] == "50000ms"
    assert settings["client_connection_check_interval"] == "10000ms"
    client = limits.libpq_client()
    assert client["keepalives"] == "1" and client["tcp_user_timeout"] == "50000"


def test_servers_before_14_get_no_connection_check() -> None:
    names = [name for name, _ in session_limits({}).postgres_settings(130012)]
    assert "client_connection_check_interval" not in names


def test_zero_disables_the_statement_timeout() -> None:
    settings = dict(session_limits({"DPONE_DB_STATEMENT_TIMEOUT": "0"}).postgres_settings(150000))
    assert settings["statement_timeout"] == "0"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e309", "ten", "0x10"])
@pytest.mark.parametrize("variable", [v.env for v in VARIABLES if v.minimum > 0])
def test_bad_values_are_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(DponeError) as refused:
        session_limits({variable: value})
    assert refused.value.code == errors.CONFIG_INVALID
    assert variable in refused.value.message
