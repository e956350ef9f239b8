#!/usr/bin/env python3
"""Print, as JSON, what real Airflow builds from generated DAG files (runs INSIDE an Airflow venv).

    <airflow-venv>/bin/python tests/generator/airflow_probe.py DAG.py [DAG2.py ...]

Complements tests/airflow/harness/inspect_dag.py (whose helpers it reuses) with what the generator
adds beyond the reference shape: per task the pod's container ``resources`` as the Kubernetes API
would receive them (sanitised JSON), ``retries``, the DAG's ``max_active_runs``, ``schedule`` and
``start_date``, and the env of EVERY map index (pod env for the kubernetes flavour, rendered
``env_vars`` for the subprocess flavour). Standard library + Airflow only.
"""

from __future__ import annotations

import json
import os
import sys

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "airflow", "harness")
sys.path.insert(0, os.path.abspath(HARNESS))

import inspect_dag as harness  # noqa: E402


def _pod(op):
    import inspect

    from kubernetes.client import ApiClient

    harness.render(op)
    kwargs = {}
    if "dry_run" in inspect.signature(op.build_pod_request_obj).parameters:
        kwargs["dry_run"] = True
    pod = op.build_pod_request_obj(**kwargs)
    return ApiClient().sanitize_for_serialization(pod)


def _concrete(op) -> dict:
    if harness.is_kpo(op):
        pod = _pod(op)
        container = pod["spec"]["containers"][0]
        env = {v["name"]: v.get("value") for v in container.get("env", []) if "value" in v}
        return {"env": env, "resources": container.get("resources"), "retries": op.retries}
    harness.render(op)
    return {"env": dict(op.env_vars), "command": list(op.command), "retries": op.retries}


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


def main(argv: list[str]) -> int:
    import shutil

    home = harness.setup_airflow_home()
    folder = os.path.join(home, "dags")
    for path in argv:
        shutil.copy(path, folder)
    with harness.quiet_output():
        facts = probe(folder)
    import airflow

    facts["airflow_version"] = airflow.__version__
    json.dump(facts, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
