"""Template-field matrix: hostile catalog strings reach the pod or process byte for byte on real
Airflow 2.10.5, 2.11.2, 3.2.2 and 3.3.2 (marker: airflow).

A project generated here puts one hostile value (``{{ 7*7 }}``, ``{% raw %}``, an unclosed ``{#``,
backslashes, quotes) into every catalog field that lands in an operator argument Airflow would
render if it were a template field: the image, ``airflow.command``, ``catalog_path`` (an argument
of ``dpone run``), hook commands, env values, annotations, a volume mount path, a toleration
value, the pod template file's path, owner and queue; one kubernetes and one subprocess workload
per value. airflow_probe.py builds the pod of every map index and hook (``build_pod_request_obj``)
or the process arguments and env; each must equal what the catalog says. A control renders the
same values through the DAG's Jinja environment, showing what a rendered field would have become.

The figures go to docs/validation-report.md ("Template-field matrix").
Run: .venv/bin/pytest tests/generator/test_template_fields_matrix.py -m airflow
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dpone_generator.build import build
from generator_support import ROOT
from pod_expectations import pod_option_problems

VERSIONS = ("2.10.5", "2.11.2", "3.2.2", "3.3.2")
PROBE = ROOT / "tests" / "generator" / "airflow_probe.py"
pytestmark = pytest.mark.airflow

# name -> hostile value; the image takes it without whitespace (an image reference has none).
HOSTILE = {
    "expr": "{{ 7*7 }}",
    "raw": "{% raw %}x{% endraw %}",
    "comment": "{# unclosed",
    "backslash": "a\\b\\\\c\\n",
    "quotes": 'it\'s "quoted"',
}
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: p
    source: {connection: wh, table: {schema: raw, name: t}}
    sink: {connection: wh, table: {schema: mart, name: t}, keys: [id], strategy: {mode: backfill}}
    backfill:
      chunk: {column: d, type: date, start: 2024-01-01, end: 2024-01-05, step: 2}
    state: {backend: audit_schema, connection: wh, require_distributed_lock: true}
"""
POD_TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  labels: {from-template: "yes"}
spec:
  containers:
    - name: base
"""


def _q(value: str) -> str:
    """A YAML double-quoted scalar of ``value`` (JSON strings are valid YAML)."""
    return json.dumps(value)


def _project(folder: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The catalog, and per workload what its fields must be where they land."""
    (folder / "m.yaml").write_text(MANIFEST, encoding="utf-8")
    lines = ["schema: dpone.workload-catalog.v1", "workloads:"]
    expected: dict[str, dict[str, Any]] = {}
    for name, value in HOSTILE.items():
        template = folder / f"tpl {value}.yaml"
        template.write_text(POD_TEMPLATE, encoding="utf-8")
        for flavour in ("kubernetes", "subprocess"):
            workload = f"{flavour[0]}_{name}"
            want: dict[str, Any] = {
                "flavour": flavour,
                "catalog_path": f"/app/{value}/workloads.yaml",
                "command": ["dpone", value],
                "hook": ["sh", "-c", f"echo {value}"],
                "env": value,
                "owner": value,
                "queue": value,
            }
            lines += [
                f"  {workload}:",
                "    manifest: m.yaml",
                "    airflow:",
                f"      flavour: {flavour}",
                f"      catalog_path: {_q(want['catalog_path'])}",
                f"      command: {json.dumps(want['command'])}",
                f"      pre_hooks: [{{name: echo, command: {json.dumps(want['hook'])}}}]",
                f"      env: {{HOSTILE: {_q(value)}}}",
                f"      owner: {_q(value)}",
                f"      queue: {_q(value)}",
                "      mapping: {mode: visible, max_items: 10, max_active: 2, pool: dpone_t}",
            ]
            if flavour == "kubernetes":
                want["image"] = "reg.example.com/x:" + value.replace(" ", "")
                want["pod"] = {
                    "annotations": {"example.com/hostile": value},
                    "volume_mounts": [{"name": "scratch", "mountPath": f"/mnt/{value}"}],
                    "volumes": [{"name": "scratch", "emptyDir": {}}],
                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": value}],
                    "pod_template_file": str(template),
                }
                lines += [
                    f"      image: {_q(want['image'])}",
                    "      namespace: dpone",
                    "      secrets: [{connection: wh, secret: dpone-conn-wh, key: dsn}]",
                    "      pod:",
                    *(f"        {key}: {json.dumps(val)}" for key, val in want["pod"].items()),
                ]
            expected[workload] = want
    catalog = folder / "workloads.yaml"
    catalog.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return catalog, expected


def _clean_env() -> dict[str, str]:
    prefixes = ("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DPONE_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("dpone-template-matrix")
    catalog, expected = _project(folder)
    built = build(str(catalog))
    assert not built.errors, [str(e) for e in built.errors]
    out = folder / "dags"
    out.mkdir()
    files = []
    for file in built.files:
        if file.name.endswith(".py"):
            (out / file.name).write_text(file.text, encoding="utf-8")
            files.append(str(out / file.name))
    paths = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "airflow_envs.py"),
            "--versions",
            ",".join(VERSIONS),
            "--jobs",
            "2",
            "--print-paths",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert paths.returncode == 0, paths.stderr[-4000:]
    pythons: dict[str, str] = json.loads(paths.stdout)
    env = _clean_env() | {"DPONE_PROBE_CONTROL": json.dumps(list(HOSTILE.values()))}

    def probe(version: str) -> dict[str, Any]:
        done = subprocess.run(
            [pythons[version], str(PROBE), *files],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            cwd=str(folder),
            check=False,
        )
        assert done.returncode == 0, done.stderr[-6000:]
        facts: dict[str, Any] = json.loads(done.stdout)
        return facts

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        facts = dict(zip(VERSIONS, pool.map(probe, VERSIONS), strict=True))
    return {"expected": expected, "facts": facts, "dags": {d.workload: d for d in built.dags}}


def _field_checks(want: dict[str, Any], one: dict[str, Any], hook: bool) -> dict[str, bool]:
    """field -> whether what the pod / process received equals the catalog's value."""
    run_args = ["run", "--catalog", want["catalog_path"]]
    checks = {
        "env": one["env"].get("HOSTILE") == want["env"],
        "owner": one["task_options"]["owner"] == want["owner"],
        "queue": one["task_options"]["queue"] == want["queue"],
    }
    if want["flavour"] == "kubernetes":
        container = one["pod"]["spec"]["containers"][0]
        argv = [*container["command"], *(container.get("args") or [])]
        checks["image"] = container["image"] == want["image"]
        options = dict(want["pod"])
        checks["pod_template_file"] = (
            one["operator"]["pod_template_file"] == options.pop("pod_template_file")
            and one["pod"]["metadata"]["labels"].get("from-template") == "yes"
        )
        for name, problem in (
            (n, pod_option_problems({n: v}, one["pod"], {})) for n, v in options.items()
        ):
            checks[name] = problem == []
    else:
        argv = one["command"]
    if hook:
        checks["hook command"] = argv == want["hook"]
    else:
        checks["command"] = argv[: len(want["command"])] == want["command"]
        checks["catalog_path"] = argv[len(want["command"]) :][:3] == run_args
    return checks


@pytest.mark.parametrize("version", VERSIONS)
def test_every_hostile_value_reaches_the_pod_or_process_as_written(
    matrix: dict[str, Any], version: str
) -> None:
    facts = matrix["facts"][version]
    assert facts["import_errors"] == {}
    checked = 0
    wrong: list[tuple[str, str, str]] = []
    for workload, want in matrix["expected"].items():
        dag = matrix["dags"][workload]
        tasks = facts["dags"][dag.dag_id]["tasks"]
        for task_id, task in tasks.items():
            for index, one in task["concrete"].items():
                assert "error" not in one, (workload, task_id, index, one.get("error"))
                for field, ok in _field_checks(want, one, task_id.startswith("pre_")).items():
                    checked += 1
                    if not ok:
                        wrong.append((workload, f"{task_id}[{index}]", field))
    assert wrong == []
    # per value: kubernetes 10 fields in the hook + 11 in each of 2 map indexes, subprocess 4 + 5 x 2
    assert checked == len(HOSTILE) * ((10 + 11 * 2) + (4 + 5 * 2))
    print(f"\n{version}: {checked} field values checked, 0 altered")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_control_shows_what_rendering_would_have_done(
    matrix: dict[str, Any], version: str
) -> None:
    control = dict(zip(HOSTILE, matrix["facts"][version]["control"], strict=True))
    assert control["expr"] == {"unchanged": False, "rendered": "49"}
    assert control["raw"] == {"unchanged": False, "rendered": "x"}
    assert control["comment"]["error"] == "TemplateSyntaxError"
    assert control["backslash"]["unchanged"] and control["quotes"]["unchanged"]
