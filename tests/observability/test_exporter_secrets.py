"""The exporters' own secrets and outputs, in real `dpone run` processes against a receiver that
keeps every byte: an API key quoted back by the HTTP library, a malformed resource attribute,
an environment-variables facet and a file transport pointed at stderr never put a secret or an
event on dpone's output, and each is one warning naming the setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .receiver import receiver
from .runproject import PASSWORD, dpone_run

pytestmark = pytest.mark.postgres

KEY = "Lineage-Api-Key-5531"


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("dpone: warning:")]


def test_an_api_key_the_http_library_refuses_is_named_not_quoted(
    project: dict[str, Any],
) -> None:
    """A key created with `echo` ends in a newline; requests refused the header at each send and
    quoted it (masked): now the variable is named before any send, its value never."""
    with receiver() as (url, got):
        done = dpone_run(project, {"OPENLINEAGE_URL": url, "OPENLINEAGE_API_KEY": KEY + "\n"})
    assert done.returncode == 1, done.stderr  # the project's CHECK fails one chunk
    assert KEY not in done.stdout + done.stderr
    warnings = _warnings(done.stderr)
    assert len(warnings) == 1, done.stderr
    assert "OPENLINEAGE_API_KEY holds a character an HTTP header cannot carry" in warnings[0]
    assert got.posts == []  # what the warning says: this run emits no lineage


def test_a_malformed_resource_attribute_is_named_not_quoted(project: dict[str, Any]) -> None:
    secret = "Resource-Secret-8812"
    with receiver() as (url, got):
        done = dpone_run(
            project,
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
                "OTEL_RESOURCE_ATTRIBUTES": f"db.password:{secret}",
            },
        )
    assert secret not in done.stdout + done.stderr
    warnings = _warnings(done.stderr)
    assert len(warnings) == 1 and "OTEL_RESOURCE_ATTRIBUTES must be key=value" in warnings[0]
    assert "this run exports no metrics" in warnings[0]
    assert got.posts == []  # what the warning says happened


def test_an_otlp_header_name_with_a_space_is_named_not_quoted(project: dict[str, Any]) -> None:
    secret = "Header-Secret-4471"
    with receiver() as (url, got):
        done = dpone_run(
            project,
            {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_HEADERS": f"x y={secret}"},
        )
    assert secret not in done.stdout + done.stderr
    warnings = _warnings(done.stderr)
    assert len(warnings) == 1 and "OTEL_EXPORTER_OTLP_HEADERS must be name=value" in warnings[0]
    assert got.posts == []


def test_the_environment_variables_facet_is_never_sent(project: dict[str, Any]) -> None:
    with receiver() as (url, got):
        done = dpone_run(
            project,
            {
                "OPENLINEAGE_URL": url,
                "OPENLINEAGE_API_KEY": KEY,
                "OPENLINEAGE__FACETS__ENVIRONMENT_VARIABLES": '["OPENLINEAGE_API_KEY", "DPONE_CONN_WH"]',
            },
        )
    warnings = _warnings(done.stderr)
    assert any("environment_variables facet" in w for w in warnings), done.stderr
    events = [json.loads(body) for path, _, body in got.posts if body]
    assert [e["eventType"] for e in events] == ["START", "FAIL"], events
    for body in (body for _, _, body in got.posts):
        assert KEY.encode() not in body and PASSWORD.encode() not in body
        assert b"environmentVariables" not in body


@pytest.mark.parametrize("path", ["/dev/stderr", "/dev/stdout"])
def test_a_file_transport_on_dpones_own_output_is_refused(
    project: dict[str, Any], path: str
) -> None:
    done = dpone_run(
        project,
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "file",
            "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": path,
            "OPENLINEAGE__TRANSPORT__APPEND": "true",
        },
    )
    assert "eventType" not in done.stdout + done.stderr
    warnings = _warnings(done.stderr)
    assert len(warnings) == 1 and "log_file_path is this process's stdout" in warnings[0]


def test_a_console_transport_inside_a_composite_is_refused(
    project: dict[str, Any], tmp_path: Path
) -> None:
    config = tmp_path / "openlineage.yml"
    config.write_text("transport: {type: composite, transports: {c: {type: console}}}\n")
    done = dpone_run(project, {"OPENLINEAGE_CONFIG": str(config)})
    assert "eventType" not in done.stdout + done.stderr
    warnings = _warnings(done.stderr)
    assert len(warnings) == 1 and "console transport" in warnings[0], done.stderr
