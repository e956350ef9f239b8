#!/usr/bin/env python3
"""Drive a generated dpone DAG with real Airflow; runs INSIDE an Airflow virtual environment.

    <airflow-venv>/bin/python airflow_e2e.py dagtest   --home H --dag-file F --out facts.json
                                                       [--local-pods]
    <airflow-venv>/bin/python airflow_e2e.py taskstest --home H --dag-id D --task-id T
                                                       --run-id R --map-index K --out facts.json
    <airflow-venv>/bin/python airflow_e2e.py clearrun  (same options as taskstest)

``H`` is a throwaway AIRFLOW_HOME kept between calls of one test (sqlite metadata DB, a dags
folder holding only the DAG under test, since 3.x ``dag.test()`` parses the whole folder).

dagtest: ``dag.test()`` in this process, then the facts read back from the metadata DB: every task
instance (state, map index, rendered label) and every return-value XCom. 3.x ``dag.test()`` does
not raise when a task fails, so states are read, never inferred.

taskstest: ``airflow tasks test D T R --map-index K`` as a real CLI process (re-runs exactly one
mapped task instance of the existing DAG run), then that instance's state and XCom. 2.x records
the XCom but not the state in test mode; 3.x records both.

clearrun: clear exactly one mapped task instance (Airflow's clear_task_instances), then run it
again with its state recorded (2.x ``tasks run --local``, 3.x ``tasks test``).

The dpone tasks are real: the DAG's subprocess operator runs the project venv's ``dpone run``
with the worker's environment (DPONE_CONN_*, DPONE_EVIDENCE_DIR set by the caller).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
import warnings


def airflow_env(home: str) -> dict[str, str]:
    dags = os.path.join(home, "dags")
    return {
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": dags,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    }


def _airflow_cli(*args: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "airflow", *args], check=False, capture_output=True, text=True
    )
    if r.returncode != 0:
        raise SystemExit(
            f"airflow {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )


def prepare(home: str, pools: str | None) -> dict[str, float]:
    """A migrated metadata DB; the pools file `dpone generate` wrote, imported with the real
    `airflow pools import` (dag.test() ignores pools, `airflow tasks test` on 2.x does not)."""
    os.makedirs(os.path.join(home, "dags"), exist_ok=True)
    os.environ.update(airflow_env(home))
    facts: dict[str, float] = {}
    if not os.path.exists(os.path.join(home, "airflow.db")):
        t = time.monotonic()
        _airflow_cli("db", "migrate")
        facts["db_migrate_seconds"] = round(time.monotonic() - t, 2)
        if pools:
            _airflow_cli("pools", "import", pools)
    return facts


def xcom_value(xcom_cls, row):
    # 2.x deserializes on load (row.value is the object); 3.x keeps the stored JSON
    if isinstance(row.value, (bytes, str)):
        value = xcom_cls.deserialize_value(row)
    else:
        value = row.value
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def read_run(dag_id: str, run_id: str, map_index: int | None = None) -> dict:
    import airflow.models.xcom as xmod
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    xcom_cls = getattr(xmod, "XComModel", None) or xmod.XCom
    facts: dict = {}
    with create_session() as session:
        query = select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id
        )
        if map_index is not None:
            query = query.where(TaskInstance.map_index == map_index)
        facts["task_instances"] = sorted(
            (
                {
                    "task_id": ti.task_id,
                    "map_index": ti.map_index,
                    "state": str(getattr(ti.state, "value", ti.state)),
                    "try_number": ti.try_number,
                    "rendered_map_index": ti.rendered_map_index,
                }
                for ti in session.scalars(query).all()
            ),
            key=lambda d: (d["task_id"], d["map_index"]),
        )
        xquery = select(xcom_cls).where(
            xcom_cls.dag_id == dag_id,
            xcom_cls.run_id == run_id,
            xcom_cls.key == "return_value",
        )
        if map_index is not None:
            xquery = xquery.where(xcom_cls.map_index == map_index)
        facts["xcom"] = {
            f"{row.task_id}[{row.map_index}]": xcom_value(xcom_cls, row)
            for row in session.scalars(xquery).all()
        }
    return facts


# A kubeconfig that reaches no cluster: the operator builds its pod request with a client, never
# sends it (the local pods below run instead).
UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: "https://127.0.0.1:9"}
contexts:
- name: none
  context: {cluster: none, user: none, namespace: dpone}
current-context: none
users:
- name: none
  user: {token: none}
"""


def install_local_pods(home: str) -> None:
    """kubernetes flavour without a cluster: the provider's pod launch (``execute_sync``) runs the
    pod's container command (the real ``dpone``) as a local process with the pod's env, and the
    result it writes is handed back through ``extract_xcom``, as the XCom sidecar hands back
    /airflow/xcom/return.json; a non-zero exit fails like a failed pod, after the XCom was read
    (the provider's order). The DAG's operator subclass runs unchanged around it."""
    import tempfile

    kubeconfig = os.path.join(home, "kubeconfig")
    with open(kubeconfig, "w", encoding="utf-8") as fh:
        fh.write(UNREACHABLE_KUBECONFIG)
    # before the kubernetes client is imported: it reads KUBECONFIG once, at import
    os.environ["KUBECONFIG"] = kubeconfig
    os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = '{"conn_type": "kubernetes"}'
    from airflow.exceptions import AirflowException
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator as KPO

    pending: dict[int, object] = {}

    def local_execute_sync(self, context):
        pod = self.build_pod_request_obj(context)
        container = pod.spec.containers[0]
        env = {v.name: v.value for v in container.env or [] if v.value_from is None}
        argv = list(container.command or []) + list(container.args or [])
        with tempfile.TemporaryDirectory(prefix="dpone-pod-") as tmp:
            xcom = os.path.join(tmp, "return.json")
            done = subprocess.run(
                argv,
                env={**os.environ, **env, "DPONE_XCOM_PATH": xcom},
                capture_output=True,
                text=True,
                check=False,
            )
            for line in (done.stdout + done.stderr).splitlines():
                self.log.info("pod: %s", line)
            if os.path.exists(xcom):
                with open(xcom, encoding="utf-8") as fh:
                    pending[id(self)] = json.load(fh)
        result = self.extract_xcom(pod=pod) if self.do_xcom_push else None
        if done.returncode != 0:
            raise AirflowException(f"Pod {pod.metadata.name} returned a failure.")
        return result

    def local_extract_xcom(self, pod, **kwargs):
        return pending.pop(id(self), None)

    KPO.execute_sync = local_execute_sync
    KPO.extract_xcom = local_extract_xcom


def cmd_dagtest(args: argparse.Namespace) -> dict:
    facts = prepare(args.home, args.pools)
    if args.local_pods:
        install_local_pods(args.home)
    dags = os.path.join(args.home, "dags")
    for name in os.listdir(dags):
        os.remove(os.path.join(dags, name))
    shutil.copy(args.dag_file, dags)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import airflow

        try:
            from airflow.dag_processing.dagbag import DagBag
        except ImportError:
            from airflow.models.dagbag import DagBag
    facts["airflow_version"] = airflow.__version__
    kwargs = {"dag_folder": dags}
    if "include_examples" in inspect.signature(DagBag.__init__).parameters:
        kwargs["include_examples"] = False
    bag = DagBag(**kwargs)
    facts["import_errors"] = {os.path.basename(k): v for k, v in bag.import_errors.items()}
    if facts["import_errors"]:
        return facts
    (dag,) = bag.dags.values()
    mapped = dag.get_task(args.task_id) if args.task_id else None
    if mapped is not None and hasattr(mapped, "expand_input"):
        facts["parsed_items"] = len(mapped.expand_input.value["env_vars"])
        facts["parsed_pool"] = mapped.partial_kwargs.get("pool", getattr(mapped, "pool", None))
        facts["parsed_max_active_tis_per_dag"] = mapped.partial_kwargs.get("max_active_tis_per_dag")
    t = time.monotonic()
    dr = dag.test()
    facts["dag_test_seconds"] = round(time.monotonic() - t, 2)
    facts["run_id"] = dr.run_id
    facts["dag_run_state"] = str(getattr(dr.state, "value", dr.state))
    facts.update(read_run(dag.dag_id, dr.run_id))
    return facts


def cmd_taskstest(args: argparse.Namespace) -> dict:
    facts = prepare(args.home, None)
    argv = [sys.executable, "-m", "airflow", "tasks", "test", args.dag_id, args.task_id]
    argv += [args.run_id, "--map-index", str(args.map_index)]
    t = time.monotonic()
    r = subprocess.run(argv, check=False, capture_output=True, text=True, env=os.environ.copy())
    facts["tasks_test_seconds"] = round(time.monotonic() - t, 2)
    facts["returncode"] = r.returncode
    facts["output_tail"] = (r.stdout + "\n" + r.stderr)[-6000:]
    facts.update(read_run(args.dag_id, args.run_id, args.map_index))
    return facts


def _ti_states(dag_id: str, run_id: str, task_id: str) -> dict[int, str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return {
            ti.map_index: str(getattr(ti.state, "value", ti.state))
            for ti in session.scalars(
                select(TaskInstance).where(
                    TaskInstance.dag_id == dag_id,
                    TaskInstance.run_id == run_id,
                    TaskInstance.task_id == task_id,
                )
            ).all()
        }


def cmd_clearrun(args: argparse.Namespace) -> dict:
    """Clear ONE mapped task instance the way Airflow's clear does (clear_task_instances), then
    run it again with its state recorded: `airflow tasks run --local` on 2.x, `airflow tasks
    test` on 3.x (which records state there; 3.x has no `tasks run`)."""
    facts = prepare(args.home, None)
    import airflow
    from airflow.models.taskinstance import TaskInstance, clear_task_instances
    from airflow.utils.session import create_session
    from sqlalchemy import select

    major = int(airflow.__version__.split(".")[0])
    facts["states_before_clear"] = _ti_states(args.dag_id, args.run_id, args.task_id)
    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == args.dag_id,
                TaskInstance.run_id == args.run_id,
                TaskInstance.task_id == args.task_id,
                TaskInstance.map_index == args.map_index,
            )
        ).all()
        assert len(tis) == 1, tis
        kwargs = {}
        if "dag" in inspect.signature(clear_task_instances).parameters:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from airflow.models.dagbag import DagBag
            bag = DagBag(dag_folder=os.path.join(args.home, "dags"), include_examples=False)
            kwargs["dag"] = bag.get_dag(args.dag_id)
        clear_task_instances(list(tis), session, **kwargs)
        session.commit()
    facts["states_after_clear"] = _ti_states(args.dag_id, args.run_id, args.task_id)
    verb = ["run"] if major < 3 else ["test"]
    argv = [sys.executable, "-m", "airflow", "tasks", *verb, args.dag_id, args.task_id]
    argv += [args.run_id, "--map-index", str(args.map_index)]
    if major < 3:
        argv.append("--local")
    facts["rerun_command"] = " ".join(argv[2:])
    t = time.monotonic()
    r = subprocess.run(argv, check=False, capture_output=True, text=True, env=os.environ.copy())
    facts["rerun_seconds"] = round(time.monotonic() - t, 2)
    facts["returncode"] = r.returncode
    facts["output_tail"] = (r.stdout + "\n" + r.stderr)[-6000:]
    facts["states_after_rerun"] = _ti_states(args.dag_id, args.run_id, args.task_id)
    facts.update(read_run(args.dag_id, args.run_id, args.map_index))
    return facts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    dt = sub.add_parser("dagtest")
    dt.add_argument("--home", required=True)
    dt.add_argument("--dag-file", required=True)
    dt.add_argument("--task-id")
    dt.add_argument("--pools", help="a pools file to import (airflow pools import)")
    dt.add_argument(
        "--local-pods", action="store_true", help="kubernetes flavour: run each pod's command here"
    )
    dt.add_argument("--out", required=True)
    tt = sub.add_parser("taskstest")
    tt.add_argument("--home", required=True)
    tt.add_argument("--dag-id", required=True)
    tt.add_argument("--task-id", required=True)
    tt.add_argument("--run-id", required=True)
    tt.add_argument("--map-index", type=int, required=True)
    tt.add_argument("--out", required=True)
    cr = sub.add_parser("clearrun")
    for name in ("--home", "--dag-id", "--task-id", "--run-id", "--out"):
        cr.add_argument(name, required=True)
    cr.add_argument("--map-index", type=int, required=True)
    args = ap.parse_args(argv)
    commands = {"dagtest": cmd_dagtest, "taskstest": cmd_taskstest, "clearrun": cmd_clearrun}
    facts = commands[args.command](args)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(facts, fh, indent=1, sort_keys=True, default=repr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
