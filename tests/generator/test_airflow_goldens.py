"""Every golden DAG file on real Airflow 2.10.5, 2.11.2, 3.2.2 and 3.3.2 (marker: airflow).

Per version, in the cached venvs of scripts/airflow_envs.py: the reference harness
(tests/airflow/harness/inspect_dag.py) proves the file parses without import errors or I/O, the
tasks are wired pre-hooks >> processes >> post-hooks, mapped tasks keep their inputs, pool,
max_active_tis_per_dag and label template (also after serialization), and the runtime operator's
inline outcome validation works; airflow_probe.py proves that the pod (or process) of EVERY map
index, and of every hook, receives exactly the original env values the generator planned, with the
catalog's resources, retries, task arguments and every pod option (airflow.pod) where Kubernetes
reads it. Run: .venv/bin/pytest tests/generator -m airflow
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from dpone.packing.pack import load_and_compile
from dpone_generator.dagspec import DagFile, dag_file
from generator_support import GOLDEN, HARNESS, ROOT
from pod_expectations import pod_option_problems, task_option_problems

VERSIONS = ("2.10.5", "2.11.2", "3.2.2", "3.3.2")
PROBE = ROOT / "tests" / "generator" / "airflow_probe.py"
pytestmark = pytest.mark.airflow


def _clean_env() -> dict[str, str]:
    prefixes = ("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DPONE_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def _run(cmd: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=900, env=_clean_env(), cwd=cwd, check=False
    )


def _golden_files() -> list[Path]:
    return sorted(GOLDEN.glob("*/expected/*.py"))


def _facts_for(python: str) -> dict[str, Any]:
    files = [str(p) for p in _golden_files()]
    with tempfile.TemporaryDirectory(prefix="dpone-gen-af-") as tmp:
        out = os.path.join(tmp, "facts.json")
        harness = _run(
            [
                python,
                str(HARNESS / "inspect_dag.py"),
                *files,
                "--indexes",
                "0,1",
                "--outcome",
                "--out",
                out,
            ],
            tmp,
        )
        assert harness.returncode == 0 and os.path.exists(out), harness.stderr[-6000:]
        with open(out, encoding="utf-8") as fh:
            facts: dict[str, Any] = json.load(fh)
        probe = _run([python, str(PROBE), *files], tmp)
        assert probe.returncode == 0, probe.stderr[-6000:]
        facts["probe"] = json.loads(probe.stdout)
    return facts


@pytest.fixture(scope="session")
def airflow_facts() -> dict[str, dict[str, Any]]:
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "airflow_envs.py"),
        "--versions",
        ",".join(VERSIONS),
    ]
    built = subprocess.run(
        [*cmd, "--jobs", "2", "--print-paths"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if built.returncode != 0:
        pytest.fail(f"building the Airflow venvs failed:\n{built.stderr[-6000:]}")
    paths: dict[str, str] = json.loads(built.stdout)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {v: pool.submit(_facts_for, paths[v]) for v in VERSIONS}
        return {v: f.result() for v, f in futures.items()}


def _planned() -> dict[str, tuple[str, DagFile]]:
    """file name -> (golden case, the DagFile the generator planned for it)."""
    out: dict[str, tuple[str, DagFile]] = {}
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        for catalog in sorted(GOLDEN.glob("*/workloads.yaml")):
            display = catalog.relative_to(ROOT).as_posix()
            _, packs, problems = load_and_compile(display)
            assert not problems
            for pack in packs:
                dag = dag_file(pack, display)
                out[dag.file_name] = (catalog.parent.name, dag)
    finally:
        os.chdir(cwd)
    return out


PLANNED = _planned()


@pytest.mark.parametrize("version", VERSIONS)
def test_parse_is_clean_wired_and_serializable(airflow_facts: dict[str, Any], version: str) -> None:
    facts = airflow_facts[version]
    assert facts["airflow_version"] == version
    assert set(facts["files"]) == set(PLANNED)
    for name, (_, dag) in PLANNED.items():
        file_facts = facts["files"][name]
        assert file_facts["import_errors"] == {}, (name, file_facts["import_errors"])
        guard = file_facts["io_guard"]
        assert guard["exec_error"] is None and guard["violations"] == [], (name, guard)
        dag_facts = file_facts["dags"][dag.dag_id]
        assert "serialized_error" not in dag_facts, dag_facts.get("serialized_error")
        order = list(dag.task_order)
        for view in (dag_facts["tasks"], dag_facts["serialized"]):
            assert sorted(view) == sorted(order), name
            for i, tid in enumerate(order):
                assert view[tid]["upstream"] == ([order[i - 1]] if i else []), (name, tid)
                assert view[tid]["downstream"] == (order[i + 1 : i + 2]), (name, tid)
            for task in dag.runtime_tasks:
                got = view[task.task_id]
                assert got["is_mapped"] is task.mapped, (name, task.task_id)
                if task.mapped:
                    assert got["expand_length"] == task.items_total
                    assert (got["pool"], got["max_active_tis_per_dag"]) == (
                        task.pool,
                        task.max_active,
                    )
                    assert got["map_index_template"] == "{{ dpone_item_label }}"


def _check_options(dag: DagFile, one: dict[str, Any], major: int, where: tuple[str, ...]) -> int:
    """Retries, task arguments and pod options of one concrete task; how many options were held."""
    pod_options, task_options = dict(dag.pod_options), dict(dag.task_options)
    assert one["retries"] == dag.retries, where
    assert task_option_problems(task_options, one["task_options"], major) == [], where
    if dag.flavour == "kubernetes":
        assert pod_option_problems(pod_options, one["pod"], one["operator"]) == [], where
        return len(task_options) + len(pod_options)
    return len(task_options)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_map_index_gets_the_planned_env_options_and_retries(
    airflow_facts: dict[str, Any], version: str
) -> None:
    probe = airflow_facts[version]["probe"]
    major = int(version.split(".", 1)[0])
    assert probe["import_errors"] == {}
    options_checked = 0
    for name, (_, dag) in PLANNED.items():
        got = probe["dags"][dag.dag_id]
        assert (got["max_active_runs"], got["catchup"]) == (1, False), name
        year, month, day = dag.start_date
        assert got["start_date"].startswith(f"{year:04d}-{month:02d}-{day:02d}T00:00:00")

        hooks = {h.task_id: h for h in (*dag.pre_hooks, *dag.post_hooks)}
        for task_id, hook in hooks.items():
            concrete = got["tasks"][task_id]["concrete"]["-"]
            assert concrete["env"] == dict(hook.env), (name, task_id)
            options_checked += _check_options(dag, concrete, major, (name, task_id))
            if dag.flavour == "kubernetes":
                assert concrete["pod"]["spec"]["containers"][0]["command"] == list(hook.command)
            else:
                assert concrete["command"] == list(hook.command)
        for task in dag.runtime_tasks:
            concrete = got["tasks"][task.task_id]["concrete"]
            envs = task.mapped_envs if task.mapped else (task.env,)
            keys = [str(i) for i in range(len(envs))] if task.mapped else ["-"]
            assert sorted(concrete, key=str) == sorted(keys, key=str), (name, task.task_id)
            for key, env in zip(keys, envs, strict=True):
                one = concrete[key]
                assert one["env"] == dict(env), (name, task.task_id, key)
                options_checked += _check_options(dag, one, major, (name, task.task_id, key))
                if dag.flavour == "kubernetes":
                    assert one["resources"] == (dag.resources or None), (name, key)
                    container = one["pod"]["spec"]["containers"][0]
                    assert container["image"] == dag.image
                    assert [*container["command"], *container["args"]] == [
                        *dag.command,
                        *task.arguments,
                    ]
                else:
                    assert one["command"] == [*dag.command, *task.arguments]
    # the pod_options golden alone: (19 pod options + 7 task arguments) x (1 hook + 12 map indexes)
    assert options_checked >= 26 * 13


@pytest.mark.parametrize("version", VERSIONS)
def test_runtime_tasks_validate_their_outcome(airflow_facts: dict[str, Any], version: str) -> None:
    facts = airflow_facts[version]
    for name, (_, dag) in PLANNED.items():
        tasks = facts["files"][name]["dags"][dag.dag_id]["tasks"]
        for task in dag.runtime_tasks:
            checks = tasks[task.task_id]["outcome_checks"]
            assert "error" not in checks, checks.get("error")
            if dag.flavour == "kubernetes":
                assert checks["sync_passed"]["returned"]["status"] == "passed"
                assert checks["deferred_passed_returns_none"]["returned"]["status"] == "passed"
                for case in ("sync_failed", "deferred_failed", "sync_no_result"):
                    assert checks[case]["raised"] == "DponeRunOutcomeError", (name, case)
                    assert checks[case]["is_fail_exception"] is False, (name, case)
                for case in (
                    "sync_failed_final",
                    "deferred_failed_final",
                    "deferred_pod_failed_final",
                ):
                    assert checks[case]["raised"] == "DponeRunNotRetryableError", (name, case)
                    assert checks[case]["is_fail_exception"] is True, (name, case)
            else:
                assert checks["passed"]["returned"]["status"] == "passed"
                for case in ("failed", "nonzero_exit", "no_result"):
                    assert checks[case]["raised"] == "DponeRunOutcomeError", (name, case)
                    assert checks[case]["is_fail_exception"] is False, (name, case)
                assert checks["failed_final"]["raised"] == "DponeRunNotRetryableError", name
                assert checks["failed_final"]["is_fail_exception"] is True, name


@pytest.mark.parametrize("version", ("2.10.5", "3.3.2"))
def test_airflow_pools_import_reads_every_pools_file(version: str, tmp_path: Path) -> None:
    """`airflow pools import` on a fresh metadata DB creates (then updates) every golden pool."""
    cmd = [sys.executable, str(ROOT / "scripts" / "airflow_envs.py"), "--versions", version]
    built = subprocess.run([*cmd, "--print-paths"], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    airflow = str(Path(json.loads(built.stdout)[version]).parent / "airflow")
    env = _clean_env() | {
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/airflow.db",
    }

    def airflow_cli(*args: str) -> str:
        done = subprocess.run(
            [airflow, *args], capture_output=True, text=True, env=env, timeout=600, check=False
        )
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
        return done.stdout

    airflow_cli("db", "migrate")
    expected: dict[str, dict[str, Any]] = {}
    for path in sorted(GOLDEN.glob("*/expected/dpone_pools.json")):
        expected.update(json.loads(path.read_text(encoding="utf-8")))
    merged = tmp_path / "all_pools.json"  # the same format; one CLI start instead of eight
    merged.write_text(json.dumps(expected), encoding="utf-8")
    airflow_cli("pools", "import", str(merged))
    airflow_cli("pools", "import", str(GOLDEN / "shared_pool" / "expected" / "dpone_pools.json"))
    listed = {p["pool"]: p for p in json.loads(airflow_cli("pools", "list", "-o", "json"))}
    for name, pool in expected.items():
        assert int(listed[name]["slots"]) == pool["slots"], name
        assert listed[name]["description"] == pool["description"]
        assert str(listed[name]["include_deferred"]) == "True"
