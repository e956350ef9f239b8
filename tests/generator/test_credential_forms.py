"""Credential forms in generated DAG files, built by real Airflow: per-field secret projection and
secret files on the kubernetes flavour, Airflow Connections resolved at execute (never at parse)
on the subprocess flavour, and the forms a flavour cannot honour (an Airflow Connection on
kubernetes, a Kubernetes secret on subprocess, a credential in any string the file would carry)
refused where they are written, in one pass with the workload's other problems."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from dpone_generator.build import build
from dpone_generator.check import catalog_problems

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "generator" / "airflow_probe.py"
EXECUTE = ROOT / "tests" / "generator" / "credential_probe.py"
VERSIONS = ("2.10.5", "3.3.2")
PASSWORD = "Af-conn/@:?#%pw"

MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: p
    source: {connection: src, table: {schema: raw, name: t}}
    sink: {connection: wh, table: {schema: mart, name: t}, keys: [id], strategy: {mode: backfill}}
    backfill:
      chunk: {column: d, type: date, start: 2024-01-01, end: 2024-01-05, step: 2}
    state: {backend: audit_schema, connection: wh, require_distributed_lock: true}
"""
CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  k8s:
    manifest: m.yaml
    airflow:
      image: reg.example.com/dpone:1
      secrets:
        - {connection: wh, secret: wh-dsn, key: dsn-without-password}
        - {connection: wh, secret: wh-password, key: password, field: password}
        - {connection: src, secret: src-parts, key: scheme, field: scheme}
        - {connection: src, secret: src-parts, key: host, field: host}
        - {connection: src, secret: src-parts, key: user, field: user}
        - {connection: src, secret: src-parts, key: dbname, field: dbname}
      secret_files:
        - {connection: src, field: password, path: /var/run/secrets/src/password}
      pod:
        volumes: [{name: src-pw, secret: {secretName: src-password}}]
        volume_mounts: [{name: src-pw, mountPath: /var/run/secrets/src, readOnly: true}]
  local:
    manifest: m.yaml
    airflow:
      flavour: subprocess
      command: [{python}, -c, {script}]
      airflow_connections:
        - {connection: src, conn_id: dpone_src}
      secret_files:
        - {connection: wh, path: /run/secrets/wh-dsn}
  local_mapped:
    manifest: m.yaml
    airflow:
      flavour: subprocess
      pre_hooks: [{name: echo, command: [echo, hi]}]
      airflow_connections:
        - {connection: src, conn_id: dpone_src}
        - {connection: wh, conn_id: dpone_wh}
      mapping: {mode: visible, max_items: 10, max_active: 2, pool: dpone_t}
"""
#: the child: report (as its run result) whether it got the Connection's URI, never the URI
CHILD = (
    "import json, os; from urllib.parse import unquote, urlsplit;"
    "url = urlsplit(os.environ.get('DPONE_CONN_SRC', ''));"
    "ok = unquote(url.password or '') == os.environ['DPONE_PROBE_PASSWORD'];"
    "json.dump({'schema': 'dpone.run-result.v1', 'status': 'passed', 'got_password': ok,"
    " 'wh_file': os.environ.get('DPONE_CONN_WH_FILE')}, open(os.environ['DPONE_XCOM_PATH'], 'w'))"
)


def _python_envs() -> dict[str, str]:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "airflow_envs.py"),
            "--versions",
            ",".join(VERSIONS),
            "--jobs",
            "1",
            "--print-paths",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    pythons: dict[str, str] = json.loads(done.stdout)
    return pythons


def _clean_env() -> dict[str, str]:
    prefixes = ("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DPONE_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("dpone-credentials")
    (folder / "m.yaml").write_text(MANIFEST, encoding="utf-8")
    catalog = CATALOG.replace("{python}", json.dumps("python3")).replace(
        "{script}", json.dumps(CHILD)
    )
    (folder / "workloads.yaml").write_text(catalog, encoding="utf-8")
    built = build(str(folder / "workloads.yaml"))
    assert not built.errors, [str(e) for e in built.errors]
    out = folder / "dags"
    out.mkdir()
    texts = {}
    for file in built.files:
        if file.name.endswith(".py"):
            (out / file.name).write_text(file.text, encoding="utf-8")
            texts[file.name] = file.text
    return {"folder": folder, "out": out, "texts": texts}


def test_the_generated_files_hold_no_secret_and_name_each_form(generated: dict[str, Any]) -> None:
    k8s, local = generated["texts"]["k8s.py"], generated["texts"]["local.py"]
    assert 'Secret("env", "DPONE_CONN_WH_PASSWORD", "wh-password", "password")' in k8s
    assert '"DPONE_CONN_SRC_PASSWORD_FILE": "/var/run/secrets/src/password"' in k8s
    assert "DponeConnectionsSubprocessOperator" not in k8s
    assert (
        '"DPONE_CONN_SRC": "dpone_src"' in local and "DponeConnectionsSubprocessOperator" in local
    )
    assert '"DPONE_CONN_WH_FILE": "/run/secrets/wh-dsn"' in local


def test_the_subprocess_docstring_says_where_each_connection_comes_from(
    generated: dict[str, Any],
) -> None:
    """An Airflow Connection or a file is named as the source; the one-line "worker's
    environment" form stays for DAGs that use neither (golden files unchanged)."""
    local, mapped = generated["texts"]["local.py"], generated["texts"]["local_mapped.py"]
    assert "Connections come from the worker's environment" not in local + mapped
    assert (
        "Connections:\n"
        '- DPONE_CONN_SRC: the Airflow Connection "dpone_src", resolved when the task runs\n'
        '- DPONE_CONN_WH: read from the file "/run/secrets/wh-dsn" at each connect\n"""'
    ) in local
    assert (
        "Connections:\n"
        '- DPONE_CONN_SRC: the Airflow Connection "dpone_src", resolved when the task runs\n'
        '- DPONE_CONN_WH: the Airflow Connection "dpone_wh", resolved when the task runs\n"""'
    ) in mapped
    for text in (local, mapped):
        docstring = text.split('"""')[1]
        assert "worker's environment" not in docstring


def test_a_path_cannot_end_the_docstring(tmp_path: Path) -> None:
    """A secret file's path is JSON-quoted in the docstring: quotes, backslashes and non-ASCII
    characters stay inside it and the file parses to the path as written."""
    import ast

    path = '/run/x"""y\\\\z/\u00e9'
    (tmp_path / "m.yaml").write_text(MANIFEST, encoding="utf-8")
    catalog = (
        "schema: dpone.workload-catalog.v1\nworkloads:\n  local:\n    manifest: m.yaml\n"
        "    airflow:\n      flavour: subprocess\n      secret_files:\n"
        f"        - {{connection: wh, path: {json.dumps(path)}}}\n"
    )
    (tmp_path / "workloads.yaml").write_text(catalog, encoding="utf-8")
    built = build(str(tmp_path / "workloads.yaml"))
    assert not built.errors, [str(e) for e in built.errors]
    (text,) = [f.text for f in built.files if f.name == "local.py"]
    docstring = ast.get_docstring(ast.parse(text))
    assert docstring is not None
    assert f'- DPONE_CONN_WH: read from the file "{path}" at each connect' in docstring
    assert "- DPONE_CONN_SRC: the worker's environment" in docstring


@pytest.mark.airflow
@pytest.mark.parametrize("version", VERSIONS)
def test_kubernetes_pod_gets_one_secret_key_per_field(
    generated: dict[str, Any], version: str
) -> None:
    python = _python_envs()[version]
    done = subprocess.run(
        [python, str(PROBE), str(generated["out"] / "k8s.py")],
        capture_output=True,
        text=True,
        timeout=900,
        env=_clean_env(),
        cwd=str(generated["folder"]),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    facts = json.loads(done.stdout)
    assert facts["import_errors"] == {}
    tasks = facts["dags"]["k8s"]["tasks"]
    pod = next(iter(tasks["run_p"]["concrete"].values()))["pod"]
    container = pod["spec"]["containers"][0]
    refs = {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container["env"]
        if "valueFrom" in e
    }
    assert refs == {
        "DPONE_CONN_WH": ("wh-dsn", "dsn-without-password"),
        "DPONE_CONN_WH_PASSWORD": ("wh-password", "password"),
        "DPONE_CONN_SRC_SCHEME": ("src-parts", "scheme"),
        "DPONE_CONN_SRC_HOST": ("src-parts", "host"),
        "DPONE_CONN_SRC_USER": ("src-parts", "user"),
        "DPONE_CONN_SRC_DBNAME": ("src-parts", "dbname"),
    }
    plain = {e["name"]: e.get("value") for e in container["env"] if "value" in e}
    assert plain["DPONE_CONN_SRC_PASSWORD_FILE"] == "/var/run/secrets/src/password"
    assert {"mountPath": "/var/run/secrets/src", "name": "src-pw", "readOnly": True} in container[
        "volumeMounts"
    ]


@pytest.mark.airflow
@pytest.mark.parametrize("version", VERSIONS)
def test_mapped_tasks_and_hooks_take_the_connection_ids(
    generated: dict[str, Any], version: str
) -> None:
    python = _python_envs()[version]
    done = subprocess.run(
        [python, str(PROBE), str(generated["out"] / "local_mapped.py")],
        capture_output=True,
        text=True,
        timeout=900,
        env=_clean_env(),
        cwd=str(generated["folder"]),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    facts = json.loads(done.stdout)
    assert facts["import_errors"] == {}
    tasks = facts["dags"]["local_mapped"]["tasks"]
    assert set(tasks) == {"pre_echo", "run_p"}
    assert len(tasks["run_p"]["concrete"]) == 2  # both map indexes built from the partial
    ids = {"DPONE_CONN_SRC": "dpone_src", "DPONE_CONN_WH": "dpone_wh"}
    for task in ("pre_echo", "run_p"):  # the hook and every mapped runtime task
        for facts in tasks[task]["concrete"].values():
            assert facts["airflow_connections"] == ids, task
    text = generated["texts"]["local_mapped.py"]
    # written once, in the task arguments both tasks expand
    assert text.count('"airflow_connections": {') == 1
    assert text.count('"DPONE_CONN_SRC": "dpone_src"') == 1
    assert text.count("**TASK_ARGS,") == 2


@pytest.mark.airflow
@pytest.mark.parametrize("version", VERSIONS)
def test_subprocess_resolves_the_airflow_connection_at_execute_only(
    generated: dict[str, Any], version: str
) -> None:
    python = _python_envs()[version]
    uri = f"postgres://loader:{quote(PASSWORD, safe='')}@db.example:5432/sales"
    # The child compares the Connection's password with DPONE_PROBE_PASSWORD and reports a bool.
    done = subprocess.run(
        [python, str(EXECUTE), str(generated["out"]), "local", "run_p", uri],
        capture_output=True,
        text=True,
        timeout=900,
        env=_clean_env() | {"DPONE_PROBE_PASSWORD": PASSWORD},
        cwd=str(generated["folder"]),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["import_errors"] == {}  # parsed with no AIRFLOW_CONN_DPONE_SRC defined
    result = facts["result"]
    assert result["status"] == "passed" and result["wh_file"] == "/run/secrets/wh-dsn"
    assert result["got_password"] is True
    for channel in (done.stdout, done.stderr):
        assert PASSWORD not in channel and quote(PASSWORD, safe="") not in channel


def test_kubernetes_refuses_an_airflow_connection_located(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(MANIFEST, encoding="utf-8")
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  k8s:\n"
        "    manifest: m.yaml\n"
        "    airflow:\n"
        "      image: reg.example.com/dpone:1\n"
        "      secrets: [{connection: wh, secret: wh, key: dsn}]\n"
        "      airflow_connections:\n"
        "        - {connection: src, conn_id: dpone_src}\n"
        "        - {connection: wh, conn_id: dpone_wh}\n",
        encoding="utf-8",
    )
    built = build(str(tmp_path / "workloads.yaml"))
    shown = [str(e) for e in built.errors]
    pod_spec = [s for s in shown if "pod spec" in s]
    assert len(pod_spec) == 2, shown
    assert all("DPONE_CATALOG_INVALID" in s for s in pod_spec)
    assert any(":9:" in s for s in pod_spec) and any(":10:" in s for s in pod_spec), pod_spec
    assert any("gives the dsn of connection 'wh' again" in s for s in shown), shown
    assert any("airflow.secrets has no entry" in s and "'src'" in s for s in shown), shown
    _, checked = catalog_problems(str(tmp_path / "workloads.yaml"))  # `dpone check` refuses too
    assert sorted(str(e) for e in checked) == sorted(shown)


def test_a_connection_named_like_a_part_of_another_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(MANIFEST.replace("connection: src", "connection: wh_host"))
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  local:\n"
        "    manifest: m.yaml\n"
        "    airflow: {flavour: subprocess}\n",
        encoding="utf-8",
    )
    shown = [str(e) for e in build(str(tmp_path / "workloads.yaml")).errors]
    assert len(shown) == 1 and "DPONE_CONN_WH_HOST would be read as a part of 'wh'" in shown[0]
    assert "workloads.yaml:3:" in shown[0], shown


@pytest.mark.parametrize("other", ["wh_password_file", "WH_SCHEME_FILE", "wh_file"])
def test_a_connection_named_like_a_parts_file_of_another_is_refused(
    tmp_path: Path, other: str
) -> None:
    # Regression: DPONE_CONN_WH_PASSWORD_FILE (another connection's DSN) was read as wh's file
    (tmp_path / "m.yaml").write_text(MANIFEST.replace("connection: src", f"connection: {other}"))
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  local:\n"
        "    manifest: m.yaml\n"
        "    airflow: {flavour: subprocess}\n",
        encoding="utf-8",
    )
    shown = [str(e) for e in build(str(tmp_path / "workloads.yaml")).errors]
    assert len(shown) == 1, shown
    assert f"DPONE_CONN_{other.upper()} would be read as a part of 'wh'" in shown[0]


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        (
            "[{connection: wh, secret: a, key: dsn}, {connection: WH, secret: b, key: dsn}]",
            "gives the dsn of connection 'WH' again",
        ),
        (
            "[{connection: wh, secret: a, key: dsn}, "
            "{connection: wh, secret: a, key: s, field: scheme}]",
            "gives the scheme of connection 'wh' beside its dsn",
        ),
    ],
    ids=["same-part-other-case", "scheme-beside-dsn"],
)
def test_secrets_a_pod_cannot_honour_are_refused(tmp_path: Path, entries: str, needle: str) -> None:
    # Regression: both passed check and generate; the pod then got one of two values silently,
    # or every run failed with DPONE_CONFIG_INVALID
    (tmp_path / "m.yaml").write_text(MANIFEST.replace("connection: src", "connection: wh"))
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  k8s:\n"
        "    manifest: m.yaml\n"
        "    airflow:\n"
        "      image: reg.example.com/dpone:1\n"
        f"      secrets: {entries}\n",
        encoding="utf-8",
    )
    shown = [str(e) for e in build(str(tmp_path / "workloads.yaml")).errors]
    assert len(shown) == 1 and needle in shown[0], shown
    assert "DPONE_CATALOG_INVALID" in shown[0] and "workloads.yaml:7:" in shown[0], shown


def _built_and_checked(folder: Path, catalog: str, manifest: str = MANIFEST) -> list[str]:
    """What `dpone generate` refuses (nothing built), asserted equal to what `dpone check` does."""
    (folder / "m.yaml").write_text(manifest, encoding="utf-8")
    (folder / "workloads.yaml").write_text(catalog, encoding="utf-8")
    built = build(str(folder / "workloads.yaml"))
    assert built.files == ()
    shown = [str(e) for e in built.errors]
    _, checked = catalog_problems(str(folder / "workloads.yaml"))
    assert [str(e) for e in checked] == shown
    return shown


@pytest.mark.parametrize(
    ("entry", "variable"),
    [
        ("{connection: wh, secret: wh-pw, key: password, field: password}", "WH_PASSWORD"),
        ("{connection: wh, secret: wh-dsn, key: dsn}", "WH"),
    ],
    ids=["password", "dsn"],
)
def test_subprocess_refuses_a_kubernetes_secret_located(
    tmp_path: Path, entry: str, variable: str
) -> None:
    # Regression: accepted, then dropped from the DAG file: the task had no DPONE_CONN_WH...
    shown = _built_and_checked(
        tmp_path,
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  local:\n"
        "    manifest: m.yaml\n"
        "    airflow:\n"
        "      flavour: subprocess\n"
        "      airflow_connections: [{connection: src, conn_id: dpone_src}]\n"
        "      secrets:\n"
        f"        - {entry}\n",
    )
    assert len(shown) == 1, shown
    assert shown[0].startswith(
        f"{tmp_path}/workloads.yaml:9:11: DPONE_CATALOG_INVALID: workload 'local': "
        "airflow.secrets[0] ("
    ), shown
    assert "cannot be honoured on the subprocess flavour" in shown[0]
    assert f"set DPONE_CONN_{variable} in the worker's environment" in shown[0]
    assert "airflow.airflow_connections" in shown[0] and "airflow.secret_files" in shown[0]


def test_a_catalog_mixes_flavours_under_defaults_secrets(tmp_path: Path) -> None:
    """defaults.airflow.secrets are for the pods: a subprocess workload that takes the same
    connection from an Airflow Connection gives no part twice, and its file names no secret."""
    (tmp_path / "m.yaml").write_text(MANIFEST, encoding="utf-8")
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\n"
        "defaults:\n"
        "  airflow:\n"
        "    image: reg.example.com/dpone:1\n"
        "    secrets:\n"
        "      - {connection: wh, secret: wh-dsn, key: dsn}\n"
        "      - {connection: src, secret: src-dsn, key: dsn}\n"
        "workloads:\n"
        "  pods:\n"
        "    manifest: m.yaml\n"
        "  local:\n"
        "    manifest: m.yaml\n"
        "    airflow:\n"
        "      flavour: subprocess\n"
        "      airflow_connections: [{connection: wh, conn_id: dpone_wh}]\n",
        encoding="utf-8",
    )
    built = build(str(tmp_path / "workloads.yaml"))
    assert not built.errors, [str(e) for e in built.errors]
    texts = {f.name: f.text for f in built.files}
    assert 'Secret("env", "DPONE_CONN_WH", "wh-dsn", "dsn")' in texts["pods.py"]
    assert "Secret" not in texts["local.py"] and "wh-dsn" not in texts["local.py"]
    assert "- DPONE_CONN_SRC: the worker's environment" in texts["local.py"]


def test_an_inherited_airflow_connection_is_refused_where_defaults_holds_it(
    tmp_path: Path,
) -> None:
    # Regression: located at the workload's first airflow key (its tags: line)
    shown = _built_and_checked(
        tmp_path,
        "schema: dpone.workload-catalog.v1\n"
        "defaults:\n"
        "  airflow:\n"
        "    image: reg.example.com/dpone:1\n"
        "    secrets:\n"
        "      - {connection: wh, secret: wh, key: dsn}\n"
        "      - {connection: src, secret: src, key: dsn}\n"
        "    airflow_connections:\n"
        "      - {connection: wh, conn_id: dpone_wh}\n"
        "workloads:\n"
        "  k8s:\n"
        "    manifest: m.yaml\n"
        "    airflow:\n"
        "      tags: [a]\n",
    )
    where = f"{tmp_path}/workloads.yaml:9:9: DPONE_CATALOG_INVALID: workload 'k8s': "
    assert shown == [
        where + "defaults.airflow.airflow_connections[0] (connection 'wh') cannot be honoured "
        "on the kubernetes flavour: the operator would write the Airflow Connection's password "
        "into the pod spec, where anyone who can read the pod sees it; project it from a "
        "Kubernetes secret with airflow.secrets (a whole DSN, or one key per field) or mount it "
        "and name the file in airflow.secret_files",
        where + "defaults.airflow.airflow_connections[0] gives the dsn of connection 'wh' again "
        "(first in defaults.airflow.secrets[0]); give each part of a connection once",
    ]


def test_an_inherited_secret_given_again_is_named_where_each_stands(tmp_path: Path) -> None:
    shown = _built_and_checked(
        tmp_path,
        "schema: dpone.workload-catalog.v1\n"
        "defaults:\n"
        "  airflow:\n"
        "    image: reg.example.com/dpone:1\n"
        "    secrets:\n"
        "      - {connection: src, secret: src, key: dsn}\n"
        "      - {connection: wh, secret: a, key: dsn}\n"
        "      - {connection: WH, secret: b, key: dsn}\n"
        "workloads:\n"
        "  k8s:\n"
        "    manifest: m.yaml\n",
    )
    assert len(shown) == 1 and ":8:9: DPONE_CATALOG_INVALID: " in shown[0], shown
    assert "defaults.airflow.secrets[2] gives the dsn of connection 'WH' again (first in " in (
        shown[0]
    )


def test_a_workload_whose_manifest_fails_still_gets_the_dag_rules(tmp_path: Path) -> None:
    """A manifest rule (clickhouse) and the credential form the flavour cannot honour are
    reported in one pass: the DAG rules need no plan."""
    clickhouse = MANIFEST.replace("backend: audit_schema", "backend: clickhouse")
    shown = _built_and_checked(
        tmp_path,
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  local:\n"
        "    manifest: m.yaml\n"
        "    airflow:\n"
        "      flavour: subprocess\n"
        "      secrets: [{connection: wh, secret: wh, key: dsn}]\n",
        clickhouse,
    )
    assert len(shown) == 2, shown
    assert "m.yaml:8:" in shown[0] and "state.backend clickhouse" in shown[0]
    assert "workloads.yaml:7:17: DPONE_CATALOG_INVALID" in shown[1]
    assert "cannot be honoured on the subprocess flavour" in shown[1]


@pytest.mark.parametrize("flavour", ["kubernetes", "subprocess"])
def test_a_credential_in_the_task_command_never_reaches_a_file_or_an_error(
    tmp_path: Path, flavour: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Regression: command [env, "PGPASSWORD=...", dpone] was written into the DAG file
    from dpone_generator.cli import generate_command

    secret = "hunter2secret"
    image = "      image: reg.example.com/dpone:1\n" if flavour == "kubernetes" else ""
    shown = _built_and_checked(
        tmp_path,
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  w:\n"
        "    manifest: m.yaml\n"
        "    airflow:\n"
        f"      flavour: {flavour}\n"
        + image
        + f'      command: [env, "PGPASSWORD={secret}", dpone]\n'
        f'      catalog_path: "postgresql://u:{secret}@h/db"\n'
        f"      secret_files: [{{connection: wh, path: /x?password={secret}}},"
        " {connection: src, path: /run/src}]\n",
    )
    credential = [s for s in shown if "DPONE_AIRFLOW_ENV_CREDENTIAL" in s]
    first = 8 if image else 7
    lines = [s.split(": DPONE_")[0].rsplit(":", 2)[1] for s in credential]
    assert lines == [str(first), str(first + 1), str(first + 2)]
    assert "airflow.command.1 sets PGPASSWORD" in credential[0]
    assert "airflow.catalog_path holds a connection string" in credential[1]
    assert "airflow.secret_files.0.path holds a connection string" in credential[2]
    out = tmp_path / "out"
    for output_format in ("text", "json"):
        assert generate_command(str(tmp_path / "workloads.yaml"), str(out), False, output_format)
        captured = capsys.readouterr()
        assert secret not in captured.out + captured.err and not out.exists()
