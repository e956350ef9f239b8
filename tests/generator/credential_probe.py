#!/usr/bin/env python3
"""Run INSIDE an Airflow venv: parse a generated DAG file with no Airflow Connection defined (the
parse must not look one up), then define it (AIRFLOW_CONN_<ID>, Airflow's environment secrets
backend) and execute the runtime task; print what the child process saw and what came back.

    <airflow-venv>/bin/python tests/generator/credential_probe.py DAG_FOLDER DAG_ID TASK_ID URI
"""

from __future__ import annotations

import json
import os
import sys

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "airflow", "harness")
sys.path.insert(0, os.path.abspath(HARNESS))

import inspect_dag as harness  # noqa: E402


def main(folder: str, dag_id: str, task_id: str, uri: str) -> int:
    bag = harness.make_dagbag(folder)
    errors = {os.path.basename(k): str(v) for k, v in bag.import_errors.items()}
    op = bag.dags[dag_id].task_dict[task_id]
    os.environ["AIRFLOW_CONN_DPONE_SRC"] = uri  # defined only after the parse
    result = op.execute({})
    print(json.dumps({"import_errors": errors, "result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
