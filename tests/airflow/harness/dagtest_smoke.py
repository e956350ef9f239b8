#!/usr/bin/env python3
"""Run dpone DAG files with ``dag.test()`` in a throwaway Airflow home and print JSON facts.

Runs INSIDE an Airflow virtual environment::

    <airflow-venv>/bin/python tests/airflow/harness/dagtest_smoke.py A.py:1 B.py:2 C.py [--stub-kpo]
        [--out facts.json]

``FILE:K`` makes the mapped item with ``item_index`` K fail; all files share one process and one DB.

* A fresh sqlite metadata DB (``airflow db migrate``) in a temp AIRFLOW_HOME whose dags folder holds
  copies of the files (3.x ``dag.test()`` parses the dags folder).
* subprocess flavour: a stand-in ``dpone`` executable is put first on PATH, so the reference DAG runs
  UNCHANGED. It writes a dpone.run-result.v1 to DPONE_XCOM_PATH with status "failed" (and exits 1) for
  the mapped item whose ``item_index`` is the file's K, "passed" otherwise, and echoes its argv
  and every DPONE_* variable it received into the result (so the test sees the env byte-for-byte).
* kubernetes flavour (``--stub-kpo``): the provider's pod launch (``execute_sync``) is replaced by a
  stub that builds the real pod request for the real task-time-rendered operator, computes the same
  result from the pod's env, and hands it back through ``extract_xcom``: the DAG's operator subclass
  (its ``execute`` / ``extract_xcom`` overrides and result validation) runs unchanged.
* ``dag.test()`` does not raise on task failure on 3.x: task-instance states, ``rendered_map_index``
  and return-value XComs are read back from the metadata DB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

T0 = time.monotonic()

SHIM = r"""#!{python}
import json, os, sys
item = json.loads(os.environ.get("DPONE_AIRFLOW_MAPPING_ITEM") or "{{}}")
fail = str(item.get("item_index")) == os.environ.get("DPONE_TEST_FAIL_ITEM", "-")
print("dpone stand-in:", " ".join(sys.argv[1:]), "item", item.get("item_index"), flush=True)
result = {{
    "schema": "dpone.run-result.v1",
    "status": "failed" if fail else "passed",
    "error": {{"code": "DPONE_TEST_INJECTED", "message": "injected failure"}} if fail else None,
    "argv": sys.argv[1:],
    "env": {{k: v for k, v in os.environ.items()
            if k.startswith("DPONE_") and k not in ("DPONE_XCOM_PATH", "DPONE_TEST_FAIL_ITEM")}},
}}
if os.environ.get("DPONE_XCOM_PATH"):
    with open(os.environ["DPONE_XCOM_PATH"], "w", encoding="utf-8") as fh:
        json.dump(result, fh)
sys.exit(1 if fail else 0)
"""


def stub_result(env: dict, argv: list, fail_item: str) -> tuple[dict, bool]:
    item = json.loads(env.get("DPONE_AIRFLOW_MAPPING_ITEM") or "{}")
    fail = str(item.get("item_index")) == fail_item
    return (
        {
            "schema": "dpone.run-result.v1",
            "status": "failed" if fail else "passed",
            "error": (
                {"code": "DPONE_TEST_INJECTED", "message": "injected failure"} if fail else None
            ),
            "argv": argv,
            "env": {k: v for k, v in env.items() if k.startswith("DPONE_")},
        },
        fail,
    )


FAIL_ITEM = {"value": "-"}  # item_index that fails, for the DAG under test


def install_kpo_stub() -> None:
    from airflow.exceptions import AirflowException
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator as KPO

    pending: dict[int, dict] = {}

    def fake_execute_sync(self, context):
        pod = self.build_pod_request_obj(context)
        container = pod.spec.containers[0]
        env = {v.name: v.value for v in container.env or [] if v.value_from is None}
        argv = list(container.command or []) + list(container.args or [])
        result, fail = stub_result(env, argv, FAIL_ITEM["value"])
        self.log.info("stub pod %s: %s", pod.metadata.name, result["status"])
        pending[id(self)] = result
        xcom = self.extract_xcom(pod=pod) if self.do_xcom_push else None
        if fail:
            raise AirflowException(f"Pod {pod.metadata.name} returned a failure.")
        return xcom

    def fake_extract_xcom(self, pod, **kwargs):
        return pending.pop(id(self), None)

    KPO.execute_sync = fake_execute_sync
    KPO.extract_xcom = fake_extract_xcom


def xcom_value(xcom_cls, row):
    # 2.x deserializes on load (row.value is the object); 3.x keeps the stored JSON
    if isinstance(row.value, (bytes, str)):
        return xcom_cls.deserialize_value(row)
    return row.value


def run_one(dag, fail_item: str) -> dict:
    import airflow.models.xcom as xmod
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    FAIL_ITEM["value"] = fail_item
    os.environ["DPONE_TEST_FAIL_ITEM"] = fail_item  # read by the stand-in `dpone`
    facts: dict = {}
    t = time.monotonic()
    dr = dag.test()
    facts["dag_test_seconds"] = round(time.monotonic() - t, 2)
    facts["dag_run_state"] = str(getattr(dr.state, "value", dr.state)) if dr else None
    xcom_cls = getattr(xmod, "XComModel", None) or xmod.XCom
    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == dr.run_id
            )
        ).all()
        facts["task_instances"] = sorted(
            (
                {
                    "task_id": ti.task_id,
                    "map_index": ti.map_index,
                    "state": str(getattr(ti.state, "value", ti.state)),
                    "rendered_map_index": ti.rendered_map_index,
                }
                for ti in tis
            ),
            key=lambda d: (d["task_id"], d["map_index"]),
        )
        rows = session.scalars(
            select(xcom_cls).where(
                xcom_cls.dag_id == dag.dag_id,
                xcom_cls.run_id == dr.run_id,
                xcom_cls.key == "return_value",
            )
        ).all()
        facts["xcom"] = {
            f"{row.task_id}[{row.map_index}]": xcom_value(xcom_cls, row) for row in rows
        }
    return facts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "dag_files",
        nargs="+",
        metavar="DAG.py[:FAIL_ITEM]",
        help="DAG files, each optionally with the item_index that must fail",
    )
    ap.add_argument("--stub-kpo", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    runs = []
    for spec in args.dag_files:
        path, _, fail = spec.partition(":")
        runs.append((os.path.abspath(path), fail or "-"))

    home = tempfile.mkdtemp(prefix="dpone-af-dagtest-")
    dags = os.path.join(home, "dags")
    bindir = os.path.join(home, "bin")
    os.makedirs(dags)
    os.makedirs(bindir)
    for path, _ in runs:
        shutil.copy(path, dags)
    shim = os.path.join(bindir, "dpone")
    with open(shim, "w") as fh:
        fh.write(SHIM.format(python=sys.executable))
    os.chmod(shim, 0o755)
    kubeconfig = os.path.join(home, "kubeconfig")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from inspect_dag import DUMMY_KUBECONFIG

    with open(kubeconfig, "w") as fh:
        fh.write(DUMMY_KUBECONFIG)
    os.environ.update(
        AIRFLOW_HOME=home,
        AIRFLOW__CORE__DAGS_FOLDER=dags,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="True",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
        AIRFLOW_CONN_KUBERNETES_DEFAULT='{"conn_type": "kubernetes"}',
        KUBECONFIG=kubeconfig,
        PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
    )
    facts: dict = {"runs": {}}
    try:
        t = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            check=False,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise SystemExit(f"airflow db migrate failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        facts["db_migrate_seconds"] = round(time.monotonic() - t, 2)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import airflow

            try:
                from airflow.dag_processing.dagbag import DagBag
            except ImportError:
                from airflow.models.dagbag import DagBag
        facts["airflow_version"] = airflow.__version__
        if args.stub_kpo:
            install_kpo_stub()

        import inspect

        kwargs = {"dag_folder": dags}
        if "include_examples" in inspect.signature(DagBag.__init__).parameters:
            kwargs["include_examples"] = False
        bag = DagBag(**kwargs)
        facts["import_errors"] = {os.path.basename(k): v for k, v in bag.import_errors.items()}
        by_file = {os.path.basename(d.fileloc): d for d in bag.dags.values()}
        for path, fail in runs:
            name = os.path.basename(path)
            if name not in by_file:
                facts["runs"][name] = {"error": f"no DAG parsed from {name}"}
                continue
            facts["runs"][name] = run_one(by_file[name], fail)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    facts["total_seconds"] = round(time.monotonic() - T0, 2)
    text = json.dumps(facts, indent=1, sort_keys=True, ensure_ascii=False, default=repr)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
