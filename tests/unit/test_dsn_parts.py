"""A DSN as its driver reads it: libpq's own parser for Postgres, the URL parser for MySQL and
MSSQL. Secrets are registered as the driver splits them; lineage names come only from validated
parts, and a DSN whose parts could hold a credential gets the neutral name."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
from dpone.credentials.dsn_parts import driver_secrets, server_parts
from dpone.credentials.redaction import forget_registered_secrets, redact_text
from dpone.observability.exporting import ExportWorker, export_budget
from dpone.observability.lineage import DatasetName, dataset_name, settings_problem
from dpone.observability.metrics import export_millis
from dpone.observability.metrics import settings_problem as metrics_problem


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    forget_registered_secrets()
    yield
    forget_registered_secrets()


@pytest.mark.parametrize(
    ("dsn", "want"),
    [
        (
            "postgresql://user:Leak/TailSecret@host:5432/db",
            DatasetName("postgres://unknown", ".raw.ev"),
        ),
        ("postgresql://user:Head@TailSecret@host/db", DatasetName("postgres://unknown", ".raw.ev")),
        ("postgresql://user:a?Secret1@host/db", DatasetName("postgres://host:5432", "db.raw.ev")),
        (
            "postgresql://user:a#Secret1@host:6432/db",
            DatasetName("postgres://host:6432", "db.raw.ev"),
        ),
        ("postgresql://user:5432/Secret1@host/db", DatasetName("postgres://unknown", ".raw.ev")),
        ("postgresql://user:bad%zzSecret@host/db", DatasetName("postgres://unknown", ".raw.ev")),
        ("mysql://u:a%2FSecret1@my.host/shop", DatasetName("mysql://my.host:3306", "raw.ev")),
    ],
)
def test_names_come_from_validated_driver_parts(dsn: str, want: DatasetName) -> None:
    got = dataset_name(dsn, "raw", "ev")
    assert got == want
    for secret in ("Secret", "Leak", "user:", "u:"):
        assert secret not in got.namespace + got.name


@pytest.mark.parametrize(
    ("dsn", "leaked"),
    [
        # libpq connects to the host "TailSecret@host": its error quotes that name
        (
            "postgresql://user:Head@TailSecret@host/db",
            'could not translate host name "TailSecret@host"',
        ),
        # libpq reads the user as the host and the password's head as the port
        ("postgresql://user:Leak/TailSecret@host/db", 'invalid integer value "Leak" for port'),
        ("postgresql://user:p@ss@host/db", 'could not translate host name "ss@host"'),
        ("postgresql://user:a?Qsecret@host/db", "password Qsecret"),
        ("mysql://u:" + quote("x/@:?#%Msecret", safe="") + "@h/db", "x/@:?#%Msecret"),
    ],
)
def test_redaction_knows_the_secret_as_the_driver_splits_it(dsn: str, leaked: str) -> None:
    from dpone.credentials.connections import register_dsn

    register_dsn(dsn)
    text = redact_text(f"connection failed: {leaked}")
    for piece in ("TailSecret", "Leak", "ss@", "Qsecret", "Msecret"):
        assert piece not in text, text


def test_driver_secrets_of_a_clean_dsn_are_its_password_only() -> None:
    assert driver_secrets("postgresql://u:Plain0Pw@h:5432/db") >= {"Plain0Pw"}
    assert server_parts("postgresql://u:Plain0Pw@h:5432/db", "postgres") is not None


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"OPENLINEAGE_URL": "not a url"}, "OPENLINEAGE_URL"),
        ({"OPENLINEAGE_URL": "ftp://x"}, "OPENLINEAGE_URL"),
        ({"OPENLINEAGE__TRANSPORT__TYPE": "bogus"}, "OPENLINEAGE__TRANSPORT__TYPE='bogus'"),
        (
            {"OPENLINEAGE_URL": "http://x", "OPENLINEAGE__TRANSPORT__TIMEOUT": "0"},
            "OPENLINEAGE__TRANSPORT__TIMEOUT",
        ),
        ({"OPENLINEAGE_CONFIG": "/nonexistent/ol.yml"}, "OPENLINEAGE_CONFIG"),
        ({"OPENLINEAGE__TRANSPORT__TYPE": "http"}, "OPENLINEAGE__TRANSPORT__URL"),
        (
            {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": "x y"},
            "OPENLINEAGE__TRANSPORT__URL",
        ),
    ],
)
def test_lineage_settings_problems_name_the_setting(env: dict[str, str], names: str) -> None:
    problem = settings_problem({"HOME": "/nonexistent", **env}, cwd="/nonexistent")
    assert problem is not None and names in problem


def test_good_lineage_settings_have_no_problem() -> None:
    env = {"HOME": "/nonexistent", "OPENLINEAGE_URL": "https://marquez:5000"}
    assert settings_problem(env, cwd="/nonexistent") is None
    assert settings_problem({**env, "OPENLINEAGE__TRANSPORT__TYPE": "kafka"}) is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "nan"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "-1"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent.pem"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
    ],
)
def test_metrics_settings_problems_name_the_variable(variable: str, value: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", variable: value}
    problem = metrics_problem(env)
    assert problem is not None and problem.startswith(variable)
    assert f"={value}" not in problem  # the value is not echoed


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_METRIC_EXPORT_INTERVAL", "-5"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "1.5"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "0"),
    ],
)
def test_a_bad_export_interval_or_timeout_is_named_and_the_default_used(
    variable: str, value: str
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", variable: value}
    assert metrics_problem(env) is None  # metrics stay on
    values, problems = export_millis(env)
    assert values[variable] in (60_000, 30_000)
    assert len(problems) == 1 and problems[0].startswith(variable)
    assert f"={value}" not in problems[0]  # the value is not echoed


def test_the_budget_is_a_warning_when_bad_and_bounds_the_wait() -> None:
    said: list[str] = []
    assert export_budget({"DPONE_EXPORT_BUDGET_S": "abc"}, said.append) == 3.0
    assert export_budget({"DPONE_EXPORT_BUDGET_S": "0.2"}, said.append) == 0.2
    assert len(said) == 1 and "DPONE_EXPORT_BUDGET_S" in said[0]
    import threading
    import time

    release = threading.Event()
    worker = ExportWorker(0.2, said.append)
    worker.submit("test", "hanging send", lambda: release.wait(10))
    started = time.monotonic()
    worker.drain()
    assert time.monotonic() - started < 1.0
    assert "unfinished" in said[-1]
    started = time.monotonic()
    worker.submit("test", "second send", lambda: None)
    worker.drain()  # the budget is spent: no more waiting
    assert time.monotonic() - started < 0.1
    release.set()


def test_a_failing_send_is_one_warning_per_exporter() -> None:
    said: list[str] = []
    worker = ExportWorker(2.0, said.append)

    def fail() -> None:
        raise ConnectionError("refused")

    for _ in range(3):
        worker.submit("OpenLineage", "START event", fail)
    worker.drain()
    assert len(said) == 1 and said[0].startswith("OpenLineage: could not send the START event")


def test_a_malformed_ledger_dsn_is_never_quoted() -> None:
    from dpone.errors import DponeError
    from dpone.ledger.postgres import connection_info

    with pytest.raises(DponeError) as caught:
        connection_info("postgresql://etl:Qz9secret%zz@db.host/app", "dpone-test")
    message = caught.value.message
    assert caught.value.code == "DPONE_CONFIG_INVALID"
    assert "malformed" in message
    for piece in ("Qz9secret", "etl", "db.host", "postgresql://"):
        assert piece not in message, message
