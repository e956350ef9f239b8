"""The hand-written reference DAGs (tests/airflow/reference/) on real Airflow 2.10.5, 2.11.2, 3.2.2, 3.3.2.

These files are the exact shape `dpone generate` renders. Per Airflow version (each in its own cached
venv, see conftest.py) the harness proves: the file parses with no import error and its own code does
no I/O; the runtime task is a MappedOperator with one input per literal env dict, the pool,
max_active_tis_per_dag and map_index_template are kept (also through serialization); hooks are wired
around it; the pod (or process env) built for map index k carries exactly the ORIGINAL values of
literal dict k, hostile values included (the operators render no template field; a control with
rendering on shows what Jinja would have altered); the runtime operator's inline outcome
validation fails the task on the sync and the deferrable path, without Airflow retries when the
result's error is not retryable. A dag.test()
smoke runs the subprocess flavour (and the kubernetes flavour with the pod launch stubbed) on 2.10.5
and 3.3.2: one failing mapped item fails alone, the Grid labels are rendered.

Run: .venv/bin/python -m pytest tests/airflow -m airflow
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import reference_data as rd
from hostile_values import HOSTILE_CORPUS, PLAIN_CORPUS
from reference_data import AIRFLOW_VERSIONS, EXPECTED_PROVIDER, SMOKES

REF = rd.REFERENCE_DAGS
REFERENCE = Path(__file__).resolve().parent / "reference"
SECRETS = {"DPONE_CONN_WAREHOUSE": {"secret": "dpone-conn-warehouse", "key": "dsn"}}
SMOKE_VERSIONS = rd.smoke_versions()
STDLIB = set(sys.stdlib_module_names)
AIRFLOW_CORE_IMPORTS = {
    "airflow",
    "airflow.exceptions",
    "airflow.sdk",
    "airflow.sdk.exceptions",
    "airflow.models.baseoperator",
}


# ---------------------------------------------------------------------------------------------
# static checks of the files (project venv, no Airflow)


def _tasks_in_source(path) -> dict[str, dict]:
    """task_id -> {"env_vars": literal, "mapped": bool, "kwargs": {name: literal}} from the AST."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: dict[str, dict] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "expand":
            partial = func.value
            kw = {k.arg: k.value for k in partial.keywords}
            task_id = ast.literal_eval(kw["task_id"])
            expand = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            out[task_id] = {
                "mapped": True,
                "env_vars": expand["env_vars"],
                "kwargs": {k: _literal(v) for k, v in kw.items()},
            }
        elif any(k.arg == "task_id" for k in node.keywords) and not (
            isinstance(func, ast.Attribute) and func.attr == "partial"
        ):
            kw = {k.arg: k.value for k in node.keywords}
            out[ast.literal_eval(kw["task_id"])] = {
                "mapped": False,
                "env_vars": ast.literal_eval(kw["env_vars"]) if "env_vars" in kw else None,
                "kwargs": {k: _literal(v) for k, v in kw.items()},
            }
    return out


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def test_reference_set_matches_reference_data():
    assert sorted(p.name for p in REFERENCE.glob("*.py")) == sorted(REF)


@pytest.mark.parametrize("name", sorted(REF))
def test_reference_imports_only_airflow_kubernetes_and_stdlib(name):
    tree = ast.parse((REFERENCE / name).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module]
        else:
            continue
        for mod in modules:
            top = mod.split(".")[0]
            ok = (
                top in STDLIB
                or mod in AIRFLOW_CORE_IMPORTS
                or mod.startswith("airflow.providers.cncf.kubernetes.")
                or mod == "kubernetes.client"  # the provider's own dependency (pod models)
            )
            assert ok, f"{name} imports {mod}"


@pytest.mark.parametrize("name", sorted(REF))
def test_reference_literals_are_the_originals(name):
    """Each literal env dict and argument is the original value: nothing is encoded for Jinja."""
    spec = REF[name]
    tasks = _tasks_in_source(REFERENCE / name)
    assert sorted(tasks) == sorted(spec["tasks"])
    runtime = tasks["dpone_run"]
    assert runtime["mapped"] is spec["mapped"]
    if spec["mapped"]:
        assert runtime["env_vars"] == spec["runtime_envs"]
    else:
        assert runtime["env_vars"] == spec["runtime_envs"][0]
    for hook, env in spec["hook_envs"].items():
        assert tasks[hook]["env_vars"] == env
    if spec["flavour"] == "kubernetes":
        assert runtime["kwargs"]["arguments"] == rd.KPO_RUN_ARGS
    else:
        assert runtime["kwargs"]["command"] == rd.SUBPROCESS_RUN_COMMAND


# ---------------------------------------------------------------------------------------------
# per Airflow version (harness facts)


def _facts(reference_facts, version) -> dict:
    facts = reference_facts[version]
    assert "harness_error" not in facts, facts.get("harness_error")
    return facts


def _dag(facts, name) -> dict:
    f = facts["files"][name]
    assert list(f["dags"]) == [REF[name]["dag_id"]], (f["import_errors"], list(f["dags"]))
    return f["dags"][REF[name]["dag_id"]]


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_environment_versions(reference_facts, version):
    facts = _facts(reference_facts, version)
    assert facts["airflow_version"] == version
    assert facts["provider_version"] == EXPECTED_PROVIDER[version]
    assert facts["python"].startswith("3.11.")


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_parse_is_clean_and_io_free(reference_facts, version):
    facts = _facts(reference_facts, version)
    for name in REF:
        f = facts["files"][name]
        guard = f["io_guard"]
        assert f["import_errors"] == {}, name
        assert guard["exec_error"] is None, (name, guard["exec_error"])
        assert guard["violations"] == [], (name, guard["violations"][:5])
        assert guard["warnings"] == [], (name, guard["warnings"])
        _dag(facts, name)


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_dag_shape_and_serialization(reference_facts, version):
    facts = _facts(reference_facts, version)
    for name, spec in REF.items():
        dag = _dag(facts, name)
        tasks = dag["tasks"]
        assert sorted(tasks) == sorted(spec["tasks"]), name
        order = spec["tasks"]  # a chain: pre >> runtime >> post
        for i, tid in enumerate(order):
            assert tasks[tid]["upstream"] == ([order[i - 1]] if i else []), (name, tid)
            assert tasks[tid]["downstream"] == ([order[i + 1]] if i + 1 < len(order) else []), (
                name,
                tid,
            )
        run = tasks["dpone_run"]
        assert run["task_type"] == spec["runtime_class"], name
        assert run["is_mapped"] is spec["mapped"], name
        if spec["mapped"]:
            assert run["expand_keys"] == ["env_vars"]
            assert run["expand_length"] == len(spec["runtime_envs"])
            assert run["pool"] == "dpone_backfill"
            assert run["max_active_tis_per_dag"] == 8
            assert run["map_index_template"] == "{{ dpone_item_label }}"
        for tid in spec["hook_envs"]:
            assert tasks[tid]["is_mapped"] is False
            want = "DponePodOperator" if spec["flavour"] == "kubernetes" else spec["runtime_class"]
            assert tasks[tid]["task_type"] == want
        assert "serialized_error" not in dag, dag.get("serialized_error")
        keys = (
            "task_type",
            "is_mapped",
            "pool",
            "max_active_tis_per_dag",
            "map_index_template",
            "expand_length",
            "upstream",
            "downstream",
        )
        for tid, t in tasks.items():
            s = dag["serialized"][tid]
            assert {k: s.get(k) for k in keys} == {k: t.get(k) for k in keys}, (name, tid)


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_pod_env_is_the_original_byte_for_byte(reference_facts, version):
    facts = _facts(reference_facts, version)
    checked = 0
    for name, spec in REF.items():
        dag = _dag(facts, name)
        for tid, t in dag["tasks"].items():
            if tid == "dpone_run":
                expected = dict(enumerate(spec["runtime_envs"]))
                concrete = {int(k) if k != "-" else 0: c for k, c in t["concrete"].items()}
            else:
                expected = {0: spec["hook_envs"][tid]}
                concrete = {0: t["concrete"]["-"]}
            assert sorted(concrete) == sorted(expected), (name, tid)
            for k, c in concrete.items():
                assert "error" not in c, (name, tid, k, c.get("error"))
                assert c["env"] == expected[k], (name, tid, k, _diff(expected[k], c["env"]))
                checked += 1
                if spec["flavour"] == "kubernetes":
                    assert c["secrets"] == SECRETS
                    assert c["namespace"] == "dpone"
                    if tid == "dpone_run":
                        assert c["cmds"] == ["dpone"]
                        assert c["args"] == rd.KPO_RUN_ARGS
                        assert c["containers"] == ["base", "airflow-xcom-sidecar"]
                elif tid == "dpone_run":
                    assert c["command"] == rd.SUBPROCESS_RUN_COMMAND
    assert checked == sum(len(s["runtime_envs"]) + len(s["hook_envs"]) for s in REF.values())


def _diff(want: dict, got: dict) -> dict:
    return {
        k: (repr(want.get(k))[:80], repr(got.get(k))[:80])
        for k in sorted(set(want) | set(got))
        if want.get(k) != got.get(k)
    }


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_no_value_is_rendered_and_the_control_shows_why(reference_facts, version):
    """Every hostile value reaches the pod / process unchanged through dpone's operators; the same
    operator with ``env_vars`` rendered (the control) alters or breaks the Jinja-looking ones."""
    facts = _facts(reference_facts, version)
    corpus = dict(HOSTILE_CORPUS) | {f"PLAIN_{i:02d}": v for i, v in enumerate(PLAIN_CORPUS)}
    for name in ("kubernetes_env_fidelity.py", "subprocess_env_fidelity.py"):
        probe = _dag(facts, name)["tasks"]["dpone_run"]["raw_probe"]
        assert sorted(probe) == sorted(corpus)
        for var, result in probe.items():
            assert result["dpone"] == {"unchanged": True, "rendered": None}, (name, var, result)
        for i in range(len(PLAIN_CORPUS)):
            assert probe[f"PLAIN_{i:02d}"]["control"]["unchanged"], (name, i)
        control = {var: r["control"] for var, r in probe.items()}
        assert control["DPONE_T_JINJA_EXPR"]["unchanged"] is False
        assert control["DPONE_T_CRLF"]["rendered"] == "line1\nline2"
        assert control["DPONE_T_TRAILING_NL"]["rendered"] == "trailing"
        assert "TemplateSyntaxError" in control["DPONE_T_JINJA_COMMENT"]["error"]


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_runtime_outcome_validation(reference_facts, version):
    facts = _facts(reference_facts, version)
    label0 = rd.mapping_items()[0][1]

    def failed(check, *needles, final=False):
        want = "DponeRunNotRetryableError" if final else "DponeRunOutcomeError"
        assert check.get("raised") == want, check
        assert check["is_airflow_exception"] is True
        assert check["is_fail_exception"] is final, check
        for needle in needles:
            assert needle in check["message"], (needle, check["message"])

    for name, label in (("kubernetes_summary.py", label0), ("kubernetes_internal.py", "dpone_run")):
        oc = _dag(facts, name)["tasks"]["dpone_run"]["outcome_checks"]
        assert oc["defers_to"] == ["trigger_reentry"] and oc["kpo_has_execute_complete"] is False
        assert oc["overrides"] == ["execute", "extract_xcom", "trigger_reentry"]
        for case in ("sync_passed", "deferred_passed_returns_none", "deferred_passed_returns_xcom"):
            assert oc[case]["returned"]["status"] == "passed", (case, oc[case])
            assert oc[case]["label"] == label
        for case in (
            "sync_failed",
            "deferred_failed",
            "sync_pod_failed_with_result",
            "deferred_pod_failed_with_result",
        ):
            failed(oc[case], "'failed'", "DPONE_BACKFILL_CHUNK_LEASE_LOST")
        failed(oc["sync_no_result"], "no dpone.run-result.v1 result")
        for case in (
            "sync_failed_final",
            "sync_pod_failed_final",
            "deferred_failed_final",
            "deferred_pod_failed_final",
        ):
            failed(oc[case], "DPONE_PACK_MISMATCH", "not retryable", final=True)

    oc = _dag(facts, "subprocess_summary.py")["tasks"]["dpone_run"]["outcome_checks"]
    assert oc["passed"]["returned"]["status"] == "passed" and oc["passed"]["label"] == label0
    failed(oc["failed"], "'failed'", "DPONE_STUB", "exit code 0")
    failed(oc["failed_final"], "DPONE_STUB", "not retryable", final=True)
    failed(oc["nonzero_exit"], "exit code 3")
    failed(oc["no_result"], "no dpone.run-result.v1 result")
    assert oc["hook_ok"] == {"returned": None, "label": label0}
    assert oc["hook_nonzero_exit"]["message"] == "command exited with code 3"


# ---------------------------------------------------------------------------------------------
# dag.test() smoke


@pytest.mark.airflow
@pytest.mark.parametrize("smoke", sorted(SMOKES))
@pytest.mark.parametrize("version", SMOKE_VERSIONS)
def test_dag_test_smoke(smoke_facts, version, smoke):
    all_facts = smoke_facts[version]
    assert "harness_error" not in all_facts, all_facts.get("harness_error")
    assert all_facts["airflow_version"] == version
    assert all_facts["import_errors"] == {}
    name, fail = SMOKES[smoke]
    spec = REF[name]
    facts = all_facts["runs"][name]
    assert "error" not in facts, facts
    states = {(ti["task_id"], ti["map_index"]): ti for ti in facts["task_instances"]}
    labels = [label for _, label in rd.mapping_items()]
    for k, env in enumerate(spec["runtime_envs"]):
        ti = states[("dpone_run", k)]
        assert ti["state"] == ("failed" if k == fail else "success"), ti
        assert ti["rendered_map_index"] == labels[k], ti
        result = facts["xcom"][f"dpone_run[{k}]"]
        assert result["status"] == ("failed" if k == fail else "passed")
        if k == fail:
            assert result["error"]["code"] == "DPONE_TEST_INJECTED"
        # the Airflow run, added at execute time by the operators the templates copy (the
        # summary references; the env-fidelity ones keep the older operator code)
        received = dict(result["env"])
        raw = received.pop("DPONE_AIRFLOW_CONTEXT", None)
        copied = "_dpone_airflow_context" in (REFERENCE / name).read_text(encoding="utf-8")
        assert (raw is not None) == copied, (name, raw)
        context = (
            json.loads(raw)
            if raw is not None
            else {
                "task_id": "dpone_run",
                "map_index": k,
                "try_number": 1,
                "run_id": "-",
                "schema": "dpone.airflow-context.v1",
            }
        )
        assert (context["task_id"], context["map_index"], context["try_number"]) == (
            "dpone_run",
            k,
            1,
        ), context
        assert context["run_id"] and context["schema"] == "dpone.airflow-context.v1", context
        # what the process / pod received, after the real task-time rendering
        assert received == {n: v for n, v in env.items() if n.startswith("DPONE_")}, _diff(
            env, result["env"]
        )
        want_argv = (
            rd.KPO_RUN_ARGS if spec["flavour"] == "subprocess" else ["dpone", *rd.KPO_RUN_ARGS]
        )
        assert result["argv"] == want_argv
    hooks = list(spec["hook_envs"])
    assert states[(hooks[0], -1)]["state"] == "success"
    if len(hooks) > 1:
        post = states[(hooks[1], -1)]["state"]
        assert post == ("upstream_failed" if fail is not None else "success")
    assert facts["dag_run_state"] == ("failed" if fail is not None else "success")
