"""A secret in a DSN's query parameters never leaves the process: real `dpone run` processes on a
SQLite DSN carrying ``?password=`` or ``?key=`` (SQLCipher's), with OpenLineage and OTLP metrics
sent to a receiver that keeps every byte. Lineage names the file path only, and redaction knows
a secret-named parameter in every DSN form (no database server needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from dpone.credentials.redaction import redact_text, register_dsn, secret_parameter
from dpone.observability.lineage import DatasetName, dataset_name

from .receiver import receiver
from .sqliteproject import sqlite_project, sqlite_run

SECRET = "Zs3cretQ1"


@pytest.mark.parametrize("parameter", ["password", "key", "passphrase", "cipher_key"])
def test_a_secret_query_parameter_of_a_sqlite_dsn_reaches_no_output(
    tmp_path: Path, parameter: str
) -> None:
    """Regression: START/FAIL named the dataset ``/path/demo.db?password=Zs3cretQ1/raw_orders``;
    with ``?key=`` the value was also in stderr, the result file and the evidence."""
    project = sqlite_project(tmp_path)
    xcom, evidence = tmp_path / "xcom.json", tmp_path / "evidence"
    with receiver() as (url, got):
        done = sqlite_run(
            project,
            {
                "DPONE_CONN_DEMO": f"{project['dsn']}?{parameter}={SECRET}",
                "OPENLINEAGE_URL": url,
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
                "DPONE_XCOM_PATH": str(xcom),
                "DPONE_EVIDENCE_DIR": str(evidence),
            },
        )
    assert SECRET not in done.stdout + done.stderr, done.stderr
    assert xcom.is_file() and SECRET not in xcom.read_text()
    written = [path for path in evidence.rglob("*") if path.is_file()]
    assert written and not any(SECRET.encode() in path.read_bytes() for path in written)
    assert got.posts and not any(SECRET.encode() in body for _, _, body in got.posts)
    events = [json.loads(body) for path, _, body in got.posts if path == "/api/v1/lineage"]
    assert [e["eventType"] for e in events][:1] == ["START"] and len(events) == 2, events
    path = os.path.realpath(project["database"])
    for event in events:
        datasets = [(d["namespace"], d["name"]) for d in event["inputs"] + event["outputs"]]
        assert datasets == [("file", f"{path}/raw_orders"), ("file", f"{path}/orders")], datasets


@pytest.mark.parametrize(
    "dsn",
    [
        f"sqlite:///data/demo.db?key={SECRET}",
        f"sqlite:///data/demo.db?mode=ro&passphrase={SECRET}#frag",
        f"mysql://etl@db/app?ssl_key=/k.pem&password={SECRET}",
        f"postgresql://etl@db/app?auth_token={SECRET}",
        f"mssql://etl@db/app?driver=x&client_secret={SECRET}",
        f"odbc://DRIVER={{x}};SERVER=db;KEY={SECRET}",
        f"sqlite:///data/demo.db?k%65y={SECRET}",
    ],
)
def test_a_secret_named_parameter_is_registered_in_every_dsn_form(dsn: str) -> None:
    register_dsn(dsn)
    assert SECRET not in redact_text(f"cannot open {dsn.split('://', 1)[1]!r}: {SECRET}")


def test_which_parameter_names_hold_a_secret() -> None:
    """The names dpone already treats as secret (SECRET_KEYS, a variable's secret last words),
    plus the encryption keys; other parameters stay readable in messages."""
    for name in ("key", "KEY", "password", "sslpassword", "passphrase", "token", "secret"):
        assert secret_parameter(name), name
    for name in ("auth_token", "client_secret", "api_key", "ssl_key", "pass%77ord", "k%65y"):
        assert secret_parameter(name), name
    for name in ("mode", "sslmode", "cache", "application_name", "keys", "keyspace", "driver"):
        assert not secret_parameter(name), name
    # the scrubber still reads "key=value" in a message as words, not as a secret
    assert redact_text("must be key=value pairs") == "must be key=value pairs"


def test_a_sqlite_dataset_is_named_by_its_file_path_only(tmp_path: Path) -> None:
    path = os.path.realpath(tmp_path / "demo.db")
    for tail in ("?password=x1", f"?key={SECRET}", "?mode=ro#frag", "#x"):
        got = dataset_name(f"sqlite:///{path}{tail}", None, "orders")
        assert got == DatasetName("file", f"{path}/orders"), tail
    # a path that still reads as holding a secret is not exported at all
    got = dataset_name(f"sqlite://etl:{SECRET}@host/demo.db", None, "orders")
    assert got == DatasetName("file", "unknown/orders")
