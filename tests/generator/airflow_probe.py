#!/usr/bin/env python3
"""Print, as JSON, what real Airflow builds from generated DAG files (runs INSIDE an Airflow venv).

    <airflow-venv>/bin/python tests/generator/airflow_probe.py DAG.py [DAG2.py ...]

Complements tests/airflow/harness/inspect_dag.py (whose helpers it reuses) with what the generator
adds beyond the reference shape: per task the whole pod as the Kubernetes API would receive it
(sanitised JSON, for the pod options), the operator-level pod options (connection, in_cluster,
startup timeout, finish action), the task arguments (retries, retry_delay, owner, ...), the DAG's
``max_active_runs``, ``schedule`` and ``start_date``, and the env of EVERY map index (pod env for
the kubernetes flavour, ``env_vars`` after Airflow's task-time rendering step for the subprocess
flavour). Standard library + Airflow only.

No cluster runs here: the hook's ``is_in_cluster`` (read for one pod label) answers the operator's
own ``in_cluster`` instead of loading an in-cluster configuration.
"""

from __future__ import annotations

import json
import os
import sys

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "airflow", "harness")
sys.path.insert(0, os.path.abspath(HARNESS))

import inspect_dag as harness  # noqa: E402

TASK_OPTIONS = (
    "retry_delay",
    "retry_exponential_backoff",
    "max_retry_delay",
    "execution_timeout",
    "owner",
    "queue",
    "priority_weight",
)


def _pod(op):
    import inspect
    from unittest import mock

    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from kubernetes.client import ApiClient

    harness.render(op)
    kwargs = {}
    if "dry_run" in inspect.signature(op.build_pod_request_obj).parameters:
        kwargs["dry_run"] = True
    in_cluster = property(lambda hook: bool(op.in_cluster))
    with mock.patch.object(KubernetesHook, "is_in_cluster", in_cluster):
        pod = op.build_pod_request_obj(**kwargs)
    return ApiClient().sanitize_for_serialization(pod)


def _seconds(value):
    return value.total_seconds() if hasattr(value, "total_seconds") else value


def _task_options(op) -> dict:
    return {name: _seconds(getattr(op, name, None)) for name in TASK_OPTIONS}


def _concrete(op) -> dict:
    if harness.is_kpo(op):
        pod = _pod(op)
        container = pod["spec"]["containers"][0]
        env = {v["name"]: v.get("value") for v in container.get("env", []) if "value" in v}
        action = op.on_finish_action
        return {
            "env": env,
            "resources": container.get("resources"),
            "retries": op.retries,
            "task_options": _task_options(op),
            "pod": pod,
            "operator": {
                "kubernetes_conn_id": op.kubernetes_conn_id,
                "in_cluster": op.in_cluster,
                "startup_timeout_seconds": op.startup_timeout_seconds,
                "on_finish_action": getattr(action, "value", action),
                "pod_template_file": op.pod_template_file,
                "hook_conn_id": op.hook.conn_id,
            },
        }
    harness.render(op)
    facts = {
        "env": dict(op.env_vars),
        "command": list(op.command),
        "retries": op.retries,
        "task_options": _task_options(op),
    }
    if hasattr(op, "airflow_connections"):  # DponeConnectionsSubprocessOperator only
        facts["airflow_connections"] = dict(op.airflow_connections)
    return facts


def probe(folder: str) -> dict:
    bag = harness.make_dagbag(folder)
    out: dict = {
        "import_errors": {os.path.basename(k): str(v) for k, v in bag.import_errors.items()}
    }
    dags = {}
    for dag_id, dag in sorted(bag.dags.items()):
        tasks = {}
        for tid, task in sorted(dag.task_dict.items()):
            concrete = {k: _concrete(op) for k, op in harness.concrete_tasks(task, None)}
            tasks[tid] = {"summary": harness.task_summary(task), "concrete": concrete}
        dags[dag_id] = {
            "max_active_runs": dag.max_active_runs,
            "catchup": dag.catchup,
            "start_date": dag.start_date.isoformat() if dag.start_date else None,
            "tags": sorted(dag.tags or []),
            "tasks": tasks,
        }
    out["dags"] = dags
    return out


def control(values: list[str]) -> list[dict]:
    """What a DAG's Jinja environment makes of each value when a field IS rendered (the control)."""
    import datetime

    from airflow import DAG

    env = DAG(
        "dpone_control", schedule=None, start_date=datetime.datetime(2024, 1, 1)
    ).get_template_env()
    out = []
    for value in values:
        try:
            got = env.from_string(value).render()
            out.append({"unchanged": got == value, "rendered": got})
        except Exception as exc:
            out.append({"unchanged": False, "error": type(exc).__name__})
    return out


def main(argv: list[str]) -> int:
    import shutil

    home = harness.setup_airflow_home()
    # the connection the pod_options golden (and the template-field matrix) name
    os.environ["AIRFLOW_CONN_KUBERNETES_BATCH"] = '{"conn_type": "kubernetes"}'
    folder = os.path.join(home, "dags")
    for path in argv:
        shutil.copy(path, folder)
    with harness.quiet_output():
        facts = probe(folder)
        if os.environ.get("DPONE_PROBE_CONTROL"):
            facts["control"] = control(json.loads(os.environ["DPONE_PROBE_CONTROL"]))
    import airflow

    facts["airflow_version"] = airflow.__version__
    json.dump(facts, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
