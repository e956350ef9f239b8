"""Errors name the right thing and the right fix, through the real `dpone` executable against the
real Postgres: a DSN setting that can never connect is DPONE_CONFIG_INVALID (exit 3, not
retryable) naming the setting and never the DSN, while an unreachable server stays the retryable
DPONE_CONNECTION_FAILED; a failure on the target (read back by the preflight or `dpone verify`)
names the target and is the sink's code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone import errors

DPONE = Path(sys.executable).with_name("dpone")

pytestmark = pytest.mark.postgres

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  cfg:
    manifest: cfg.yaml
    airflow: {{flavour: subprocess}}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: copy
    source: {{connection: src, table: {{schema: {s}, name: src}}}}
    sink:
      connection: dst
      table: {{schema: {s}, name: dst}}
      keys: [id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: d, type: date, start: 2023-01-01, end: 2023-01-05}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: led, schema: {s}_audit, require_distributed_lock: true}}
"""


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[dict[str, Any]]:
    schema = "cfg_" + uuid.uuid4().hex[:10]
    role = f"{schema}_reader"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.src (id int PRIMARY KEY, d date NOT NULL, v int)")
        conn.execute(
            f"INSERT INTO {schema}.src SELECT g, date '2023-01-01' + (g % 4), g "
            "FROM generate_series(1, 40) g"
        )
        conn.execute(f"CREATE TABLE {schema}.dst (id int PRIMARY KEY, d date NOT NULL, v int)")
        conn.execute(f"CREATE INDEX ON {schema}.dst (d)")
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT ON {schema}.src TO {role}")  # not the target
    (tmp_path / "workloads.yaml").write_text(CATALOG.format(), encoding="utf-8")
    (tmp_path / "cfg.yaml").write_text(MANIFEST.format(s=schema), encoding="utf-8")
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    url = (
        f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
        f"{info.get('port', '5432')}/{info['dbname']}"
    )
    yield {"catalog": tmp_path / "workloads.yaml", "url": url, "role": role, "schema": schema}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")
        conn.execute(f"DROP ROLE IF EXISTS {role}")


def dpone(
    command: str, project: dict[str, Any], env_extra: dict[str, str] | None = None, **conns: str
) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update(env_extra or {})
    url = project["url"]
    env.update({"DPONE_CONN_SRC": url, "DPONE_CONN_DST": url, "DPONE_CONN_LED": url})
    env.update({f"DPONE_CONN_{name.upper()}": dsn for name, dsn in conns.items()})
    argv = [str(DPONE), command, "--catalog", str(project["catalog"]), "--workload", "cfg"]
    if command == "run":
        argv.append("--no-progress")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stderr


def last_error(stderr: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])
    return record


def with_query(url: str, query: str) -> str:
    return f"{url}?{query}"


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("sslmode=bogus", "sslmode"),
        ("gssencmode=sometimes", "gssencmode"),
        ("target_session_attrs=whatever", "target_session_attrs"),
        ("options=-c%20no_such_setting%3D1", "'no_such_setting'"),
        ("options=-c%20statement_timeout%3Dabc", "'statement_timeout'"),
        ("options=bogus", "use -c name=value"),
        ("sslmode=verify-full&sslrootcert=/nonexistent/dpone/ca.pem", "sslrootcert"),
        ("sslmode=require", "offers no TLS"),  # the test server runs without TLS (checked)
        ("connect_timeout=abc", "connect_timeout"),  # read by psycopg before libpq runs
    ],
)
@pytest.mark.parametrize("side", ["src", "dst", "led"])
def test_a_dsn_setting_that_can_never_connect_is_a_configuration_error(
    project: dict[str, Any], query: str, named: str, side: str
) -> None:
    if query == "sslmode=require":
        with psycopg.connect(project["url"]) as conn:
            assert conn.execute("SHOW ssl").fetchone() == ("off",)
    dsn = with_query(project["url"], query)
    code, stderr = dpone("run", project, **{side: dsn})
    record = last_error(stderr)
    assert record["code"] == errors.CONFIG_INVALID and record["retryable"] is False, stderr
    assert code == 3
    assert named in record["message"]
    who = {"src": "source 'src'", "dst": "target 'dst'", "led": "the ledger database"}[side]
    assert record["message"].startswith(who), record["message"]
    value = query.split("=", 1)[1]
    assert project["url"] not in stderr and value not in stderr  # never the DSN or the value


@pytest.mark.parametrize("host", ["ip", "name"])
@pytest.mark.parametrize("port", ["abc", "99999"])
@pytest.mark.parametrize("side", ["src", "led"])
def test_a_bad_port_is_a_configuration_error(
    project: dict[str, Any], port: str, host: str, side: str
) -> None:
    """By an address or by a name (psycopg resolves a name with the port as a service first)."""
    url = project["url"].rsplit(":", 1)[0] + f":{port}/" + project["url"].rsplit("/", 1)[1]
    if host == "name":
        url = url.replace("@127.0.0.1:", "@localhost:")
    code, stderr = dpone("run", project, **{side: url})
    record = last_error(stderr)
    assert record["code"] == errors.CONFIG_INVALID and code == 3, stderr
    assert "port" in record["message"] and url not in stderr


@pytest.mark.parametrize(
    "shape",
    [
        "p/s@w:rd",  # libpq: host "postgres", port "p" (no userinfo read)
        "p@ss/w:rd",  # libpq: password "p", host "ss", the rest a database name
        "p@ss@w:rd",  # libpq: password "p", host "ss@w:rd@127.0.0.1"
    ],
)
@pytest.mark.parametrize("side", ["src", "led"])
def test_a_raw_slash_or_at_in_the_password_is_a_configuration_error_not_an_outage(
    project: dict[str, Any], shape: str, side: str
) -> None:
    """libpq splits the password at a raw ``/`` or a second ``@`` and tries another host or
    database than the one written: no retry can connect, so it is final, and says so."""
    password = shape + uuid.uuid4().hex[:6]
    url = f"postgresql://postgres:{password}@" + project["url"].split("@", 1)[1]
    code, stderr = dpone("run", project, **{side: url})
    record = last_error(stderr)
    assert record["code"] == errors.CONFIG_INVALID and code == 3, stderr
    assert "percent-encode" in record["message"] or "port" in record["message"], stderr
    for piece in (password, *re.split("[/@]", password)[1:], shape[:3]):
        assert len(piece) < 3 or piece not in stderr, piece


@pytest.mark.parametrize("side", ["dst", "led"])
def test_an_encoded_at_in_the_database_name_stays_an_outage(
    project: dict[str, Any], side: str
) -> None:
    """A percent-encoded '@' (a database named ``a@b``) is no password written raw: with the
    server down, the run is retried, never refused as a configuration error."""
    code, stderr = dpone("run", project, **{side: "postgresql://postgres@127.0.0.1:1/a%40b"})
    record = last_error(stderr)
    assert record["code"] == errors.CONNECTION_FAILED and record["retryable"] is True, stderr
    assert code == 4 and "password" not in record["message"], record["message"]


def test_an_unknown_host_stays_retryable_and_says_so(project: dict[str, Any]) -> None:
    code, stderr = dpone("run", project, dst="postgresql://postgres@dpone-nohost.invalid:5432/x")
    record = last_error(stderr)
    assert record["code"] == errors.CONNECTION_FAILED and record["retryable"] is True, stderr
    assert code == 4 and "(unknown host)" in record["message"], record["message"]
    assert "dpone-nohost" not in stderr


def test_a_missing_mysql_ssl_ca_is_a_configuration_error(project: dict[str, Any]) -> None:
    dsn = "mysql://root@127.0.0.1:3306/dpone_cfg?ssl_ca=/nonexistent/dpone/ca.pem"
    code, stderr = dpone("run", project, dst=dsn)
    record = last_error(stderr)
    assert record["code"] == errors.CONFIG_INVALID and code == 3, stderr
    assert record["message"].startswith("target 'dst'") and "'ssl_ca'" in record["message"]
    assert "/nonexistent/dpone/ca.pem" not in stderr


def test_an_unreachable_server_stays_retryable_and_names_the_target(
    project: dict[str, Any],
) -> None:
    code, stderr = dpone("run", project, dst="postgresql://postgres@127.0.0.1:1/x")
    record = last_error(stderr)
    assert record["code"] == errors.CONNECTION_FAILED and record["retryable"] is True, stderr
    assert code == 4 and record["message"].startswith("target 'dst'"), record["message"]


def test_verify_without_privileges_on_the_target_names_the_target(
    project: dict[str, Any],
) -> None:
    reader = f"postgresql://{project['role']}@{project['url'].split('@', 1)[1]}"
    code, stderr = dpone("verify", project, dst=reader)
    record = last_error(stderr)
    assert record["code"] == errors.SINK_FAILED, stderr
    assert record["message"].startswith("target 'dst'"), record["message"]
    assert "InsufficientPrivilege" in record["message"] and code == 1
    # the source, read by the same role, is still the source
    code, stderr = dpone("verify", project, src=reader, dst=project["url"])
    assert code == 1 and last_error(stderr)["code"] == errors.VERIFY_MISMATCH, stderr


@pytest.mark.parametrize(
    ("side", "dsn", "who"),
    [
        ("dst", "mysql://u:p@127.0.0.1:99999/db", "target 'dst' table"),
        ("dst", "mssql://u:p@[::1/db", "target 'dst' table"),
        ("src", "mysql://u:p@127.0.0.1:port/db", "source 'src' table"),
        ("led", "mssql://u:p@127.0.0.1:99999/db", "the ledger database"),
    ],
)
def test_a_malformed_dsn_of_any_kind_names_the_side_that_uses_it(
    project: dict[str, Any], side: str, dsn: str, who: str
) -> None:
    code, stderr = dpone("run", project, **{side: dsn})
    record = last_error(stderr)
    assert record["code"] == errors.CONFIG_INVALID and code == 3, stderr
    assert record["message"].startswith(who) and "malformed" in record["message"], record


@pytest.mark.parametrize(
    "dsn",
    [
        'postgresql://u:Pw1front"Pw1tail end@127.0.0.1:5432/db',
        'postgresql://u@127.0.0.1:5432/db?password=Pw1front%zz"Pw1tail',
    ],
)
@pytest.mark.parametrize("side", ["src", "led"])
def test_a_password_libpq_cannot_parse_leaves_no_piece_in_any_output(
    project: dict[str, Any], tmp_path: Path, dsn: str, side: str
) -> None:
    """libpq quotes the fragment it refuses, quotes inside it included; no piece of it, before
    or after such a quote, reaches stderr, the result or the evidence."""
    out = tmp_path / "out"
    env = {"DPONE_XCOM_PATH": str(out / "xcom.json"), "DPONE_EVIDENCE_DIR": str(out / "ev")}
    code, stderr = dpone("run", project, env, **{side: dsn})
    assert code == 3 and last_error(stderr)["code"] == errors.CONFIG_INVALID, stderr
    written = [stderr] + [p.read_text() for p in sorted(out.rglob("*")) if p.is_file()]
    assert len(written) >= 3, written  # stderr, the result and the evidence were all written
    for text in written:
        assert "Pw1front" not in text and "Pw1tail" not in text, text


@pytest.mark.parametrize(("side", "who"), [("dst", "target 'dst'"), ("led", "the ledger database")])
def test_an_odbc_driver_that_cannot_be_loaded_is_not_an_outage(
    project: dict[str, Any], side: str, who: str
) -> None:
    """The driver manager cannot load the driver the DSN names: installing it is the fix, no
    retry is (the real pyodbc and unixODBC; no SQL Server is needed to get this far)."""
    dsn = "mssql://u:p@127.0.0.1:1/x?driver=dpone-no-such-odbc-driver"
    code, stderr = dpone("run", project, **{side: dsn})
    record = last_error(stderr)
    assert record["code"] == errors.DRIVER_MISSING and record["retryable"] is False, stderr
    assert code == 3 and record["message"].startswith(who), record
