"""`dpone generate` as a user meets it: exit codes, error lines, JSON, help, generator-only rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dpone.cli import main as dpone_main
from dpone_generator.cli import generate_command, main_generate
from projects import project


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_dpone_entry_point_dispatches_generate(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project(here / "p", {"alpha": ""})
    assert dpone_main(["generate", "p/workloads.yaml", "--out", "dags"]) == 0
    assert "dpone generate: dags: 3 written, 0 unchanged, 0 removed" in capsys.readouterr().out
    assert dpone_main(["generate", "p/workloads.yaml", "--out", "dags", "--check"]) == 0


def test_help_shows_an_example_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main_generate(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: dpone generate" in out
    assert "dpone generate golden/summary_365_into_40/workloads.yaml --out dags/" in out
    assert "exit codes: 0" in out


def test_missing_out_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main_generate(["catalog.yaml"])
    assert exc.value.code == 2


def test_every_error_is_printed_at_once_as_file_line_col(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project(
        here / "p",
        {"alpha": "pre_hooks:\n  - {name: a, command: [x]}\n  - {name: a, command: [y]}"},
    )
    catalog = here / "p" / "workloads.yaml"
    text = catalog.read_text(encoding="utf-8").replace(
        "    image: registry.example.com/dpone-runtime:0.1.0\n", ""
    )
    catalog.write_text(text, encoding="utf-8")
    assert generate_command("p/workloads.yaml", "dags", check=False) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(
        "p/workloads.yaml:8:3: DPONE_GENERATE_IMAGE_REQUIRED: workload 'alpha'"
    )
    assert lines[1].startswith(
        "p/workloads.yaml:13:18: DPONE_CATALOG_INVALID: workload 'alpha': pre_hooks name 'a'"
    )
    assert lines[-1] == "dpone generate: 2 error(s); nothing was written"
    assert not (here / "dags").exists()


def test_json_format_prints_the_error_list(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project(here / "p", {"alpha": "env: {DPONE_AIRFLOW_MAPPING_ITEM: x}"})
    assert main_generate(["p/workloads.yaml", "--out", "dags", "--format", "json"]) == 2
    errors = json.loads(capsys.readouterr().out)
    assert [e["code"] for e in errors] == ["DPONE_AIRFLOW_PROVIDER_OWNED_ENV"]
    assert errors[0]["schema"] == "dpone.error.v1"
    assert (errors[0]["file"], errors[0]["line"]) == ("p/workloads.yaml", 12)


@pytest.mark.parametrize(
    "key",
    ["DPONE_AIRFLOW_MAPPING_ITEM", "DPONE_AIRFLOW_RUN_IDENTITY", "DPONE_AIRFLOW_MAPPING_LABEL"],
)
def test_provider_owned_env_is_rejected_before_anything_is_written(
    here: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    project(here / "p", {"alpha": f"env: {{{key}: forged}}"})
    assert generate_command("p/workloads.yaml", "dags", check=False) == 2
    err = capsys.readouterr().err
    assert f"DPONE_AIRFLOW_PROVIDER_OWNED_ENV: workload 'alpha': airflow.env.{key} is owned" in err
    assert not (here / "dags").exists()


@pytest.mark.parametrize(
    "key",
    [
        "PGPASSWORD",
        "MYSQL_PWD",
        "AWS_SESSION_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "OPENLINEAGE_API_KEY",
        "warehouse_password",
    ],
)
def test_a_variable_named_as_a_secret_is_refused_with_its_value_unshown(
    here: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    project(here / "p", {"alpha": f"env: {{{key}: hunter2-not-shown}}"})
    assert generate_command("p/workloads.yaml", "dags", check=False) == 2
    err = capsys.readouterr().err
    assert (
        f"DPONE_AIRFLOW_ENV_CREDENTIAL: workload 'alpha': airflow.env.{key} names a secret" in err
    )
    assert "hunter2" not in err
    assert not (here / "dags").exists()


@pytest.mark.parametrize(
    "env",
    [
        "{OTEL_EXPORTER_OTLP_HEADERS: 'authorization=Bearer hunter2-not-shown'}",
        "{OTEL_EXPORTER_OTLP_METRICS_HEADERS: 'x-team=a, api-key=hunter2-not-shown'}",
    ],
)
def test_an_otlp_header_list_with_a_credential_is_refused(
    here: Path, env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    project(here / "p", {"alpha": f"env: {env}"})
    assert generate_command("p/workloads.yaml", "dags", check=False) == 2
    err = capsys.readouterr().err
    assert "DPONE_AIRFLOW_ENV_CREDENTIAL" in err and "hunter2" not in err


@pytest.mark.parametrize(
    "env",
    [
        "{PGPASSWORD: ''}",  # empty: nothing to leak
        "{TOKEN_URL: 'https://auth.example.com/token', VAULT_SECRET_PATH: kv/etl}",
        "{OTEL_EXPORTER_OTLP_HEADERS: 'x-team=finance'}",
        "{PGPASSFILE: /var/run/secrets/pgpass, KEY_COLUMN: id}",
    ],
)
def test_variables_that_only_mention_a_secret_are_kept(here: Path, env: str) -> None:
    project(here / "p", {"alpha": f"env: {env}"})
    assert generate_command("p/workloads.yaml", "dags", check=False) == 0


def test_json_format_on_success_lists_files(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project(here / "p", {"alpha": ""})
    assert main_generate(["p/workloads.yaml", "--out", "dags", "--format", "json"]) == 0
    written = json.loads(capsys.readouterr().out)["written"]
    assert written == [".dpone-owner", "alpha.py", "dpone_pools.json"]
    assert main_generate(["p/workloads.yaml", "--out", "dags", "--check", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["up_to_date"] is True
    assert doc["unchanged"] == [".dpone-owner", "alpha.py", "dpone_pools.json"]


def test_kubernetes_workload_needs_a_secret_for_every_connection(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project(here / "p", {"alpha": "secrets: []"})
    assert generate_command("p/workloads.yaml", "dags", check=False) == 2
    err = capsys.readouterr().err
    assert (
        "DPONE_CATALOG_INVALID: workload 'alpha': process 'alpha' uses connection 'warehouse'"
        in err
    )
    assert err.count("uses connection") == 1  # one error per connection


def test_subprocess_workload_needs_no_image_and_no_secret(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project(here / "p", {"alpha": "flavour: subprocess\nsecrets: []"})
    text = (here / "p" / "workloads.yaml").read_text(encoding="utf-8")
    (here / "p" / "workloads.yaml").write_text(
        text.replace("    image: registry.example.com/dpone-runtime:0.1.0\n", "")
    )
    assert generate_command("p/workloads.yaml", "dags", check=False) == 0
    source = (here / "dags" / "alpha.py").read_text(encoding="utf-8")
    assert "DponeRuntimeSubprocessOperator(" in source and "KubernetesPodOperator" not in source
    assert "Connections come from the worker's environment: DPONE_CONN_WAREHOUSE." in source


def test_dag_ids_differing_only_in_case_conflict(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project(here / "p", {"alpha": "dag_id: Orders", "beta": "dag_id: orders"})
    assert generate_command("p/workloads.yaml", "dags", check=False) == 2
    assert "DPONE_GENERATE_CONFLICT: workload 'beta': dag_id 'orders' differs from 'Orders'" in (
        capsys.readouterr().err
    )


def test_absolute_catalog_path_is_written_relative(here: Path) -> None:
    project(here / "p", {"alpha": ""})
    assert generate_command(str(here / "p" / "workloads.yaml"), "dags", check=False) == 0
    assert "# catalog: p/workloads.yaml\n" in (here / "dags" / "alpha.py").read_text(
        encoding="utf-8"
    )
    assert generate_command("./p/../p/workloads.yaml", "dags", check=True) == 0


@pytest.mark.parametrize(
    "value",
    ["abc", "-1", "0", "65", "99999999999999999999", "2.5", "\u0663", "9" * 5000],
    ids=lambda value: repr(value[:24]),
)
def test_a_malformed_generate_jobs_value_is_refused_before_anything_is_written(
    here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    project(here / "p", {"alpha": ""})
    monkeypatch.setenv("DPONE_GENERATE_JOBS", value)
    assert main_generate(["p/workloads.yaml", "--out", "dags", "--format", "json"]) == 2
    errors = json.loads(capsys.readouterr().out)
    assert [e["code"] for e in errors] == ["DPONE_CONFIG_INVALID"]
    assert "DPONE_GENERATE_JOBS" in errors[0]["message"]
    assert not (here / "dags").exists()


@pytest.mark.parametrize("value", ["", " ", "1", " 3 ", "64"])
def test_a_blank_or_bounded_generate_jobs_value_generates(
    here: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    project(here / "p", {"alpha": ""})
    monkeypatch.setenv("DPONE_GENERATE_JOBS", value)
    assert main_generate(["p/workloads.yaml", "--out", "dags"]) == 0


def test_a_broken_workload_entry_hides_no_other_workloads_problems(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schema problem inside one workload's entry (or an unknown top-level key) leaves every
    other workload planned and checked: its policy's and its window's problems come out too."""
    project(
        here / "p",
        {
            "alpha": "mapping: {mode: summary, max_items: 300}",
            "beta": "bogus: 1",
            "gamma": "",
        },
    )
    gamma = here / "p" / "gamma.yaml"
    gamma.write_text(
        gamma.read_text(encoding="utf-8").replace("end: 2024-01-11", "end: 2024-01-01")
    )
    catalog = here / "p" / "workloads.yaml"
    catalog.write_text(catalog.read_text(encoding="utf-8") + "extra_top_level: 1\n")
    assert dpone_main(["check", "p/workloads.yaml"]) == 1
    lines = capsys.readouterr().err.splitlines()
    codes = sorted(line.split(": ")[1] for line in lines[:-1])
    assert codes == [
        "DPONE_AIRFLOW_MAPPING_POLICY_INVALID",  # alpha's max_items
        "DPONE_BACKFILL_PLAN_INVALID",  # gamma's zero-length window
        "DPONE_CATALOG_INVALID",  # beta's unknown field
        "DPONE_CATALOG_INVALID",  # the unknown top-level key
    ], lines
    assert lines[-1] == "dpone check: 4 error(s) in p/workloads.yaml"
    assert generate_command("p/workloads.yaml", "dags", check=False) == 2
    assert not (here / "dags").exists()


def test_a_problem_in_the_defaults_stops_before_planning(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What every workload shares is not guessed: only the catalog's and manifests' own
    problems are reported until the defaults are clean (docs/cli.md says so)."""
    project(here / "p", {"alpha": "mapping: {mode: summary, max_items: 300}"})
    catalog = here / "p" / "workloads.yaml"
    text = catalog.read_text(encoding="utf-8")
    catalog.write_text(text.replace("    namespace: data\n", "    namespace: data\n    bogus: 1\n"))
    assert dpone_main(["check", "p/workloads.yaml"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "defaults.airflow.bogus: unknown field" in lines[0], lines
