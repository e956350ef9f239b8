"""dpone reference DAG: subprocess flavour, summary mode (3 mapped items), pre/post hooks.

Hand-written reference of the file shape `dpone generate` renders for the subprocess flavour (LocalExecutor
/ Celery workers, end-to-end tests without a cluster); proven on Airflow 2.10.5, 2.11.2, 3.2.2 and 3.3.2
by tests/airflow/test_reference_dags.py. Env values are written as the original strings:
the operators render no template field, so every value reaches the pod or process as written.
"""

# ruff: noqa: UP017 (datetime.UTC needs Python 3.11; Airflow 2.x workers may run 3.9/3.10)
from __future__ import annotations

import datetime
import inspect
import json
import os
import shlex
import signal
import subprocess
import tempfile

import airflow
from airflow import DAG
from airflow.exceptions import AirflowException

try:
    from airflow.sdk import BaseOperator
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # Airflow 2.x
    from airflow.exceptions import AirflowFailException
    from airflow.models.baseoperator import BaseOperator

RESULT_SCHEMA = "dpone.run-result.v1"
LABEL_ENV = "DPONE_AIRFLOW_MAPPING_LABEL"
CONTEXT_ENV = "DPONE_AIRFLOW_CONTEXT"
CONTEXT_SCHEMA = "dpone.airflow-context.v1"
SUPPORTED_AIRFLOW = "2.10.5, 2.11.x, 3.2.x and 3.3.x"
# retry_exponential_backoff=true means "double the delay": a flag on Airflow 2, a multiplier on 3.
EXPONENTIAL_BACKOFF = 2.0 if int(airflow.__version__.split(".")[0]) >= 3 else True


def _dpone_unsupported(missing):
    """The import error (DPONE_AIRFLOW_MAPPING_UNSUPPORTED) of an Airflow this file cannot run on."""
    return ImportError(
        f"DPONE_AIRFLOW_MAPPING_UNSUPPORTED: this dpone DAG file needs {missing}, which Airflow "
        f"{airflow.__version__} lacks; it runs on Airflow {SUPPORTED_AIRFLOW} "
        "(dpone docs/compatibility.md)"
    )


def _dpone_require_mapping(operator):
    """Fail the import unless `operator` maps (partial/expand) and labels map indexes."""
    base = next((c for c in operator.__mro__ if c.__name__ == "BaseOperator"), None)
    if not callable(getattr(operator, "partial", None)):
        raise _dpone_unsupported("dynamic task mapping (partial/expand)")
    if base is None or "map_index_template" not in inspect.signature(base.__init__).parameters:
        raise _dpone_unsupported("map_index_template")


class DponeRunOutcomeError(AirflowException):
    """The dpone run result is missing or its status is not "passed"; Airflow may retry."""


class DponeRunNotRetryableError(AirflowFailException):
    """The dpone run failed with an error another attempt cannot cure: no Airflow retry."""


def _dpone_result_problem(result):
    """None when `result` is a passed dpone.run-result.v1, else why not (status and error code)."""
    if not isinstance(result, dict) or result.get("schema") != RESULT_SCHEMA:
        return f"dpone run returned no {RESULT_SCHEMA} result (got {type(result).__name__})"
    status = result.get("status")
    if status == "passed":
        return None
    error = result.get("error") if isinstance(result.get("error"), dict) else {}
    message = str(error.get("message") or "")[:500]
    return f"dpone run status {status!r}, error {error.get('code')!r}: {message}"


def _dpone_failure(result, problem):
    """The exception that fails the task: retries only when dpone does not say they cannot help."""
    error = result.get("error") if isinstance(result, dict) else None
    if isinstance(error, dict) and error.get("retryable") is False:
        return DponeRunNotRetryableError(f"{problem} (not retryable)")
    return DponeRunOutcomeError(problem)


def _dpone_push_result(context, result):
    """Keep a failed run's result as the task's XCom too (the task raises instead of returning it)."""
    ti = context.get("ti") if context else None
    if ti is not None and isinstance(result, dict):
        ti.xcom_push(key="return_value", value=result)


def _dpone_airflow_context(context):
    """The Airflow run this task serves (DPONE_AIRFLOW_CONTEXT), read from the task context at
    execute time (never rendered by Jinja): compact JSON the runtime validates and records."""
    ti = context.get("ti") or context.get("task_instance")

    def moment(name):
        value = context.get(name)
        return value.isoformat() if hasattr(value, "isoformat") else None

    map_index = getattr(ti, "map_index", None)
    document = {
        "schema": CONTEXT_SCHEMA,
        "dag_id": getattr(ti, "dag_id", None),
        "task_id": getattr(ti, "task_id", None),
        "run_id": context.get("run_id") or getattr(ti, "run_id", None),
        "try_number": getattr(ti, "try_number", None),
        "map_index": map_index if isinstance(map_index, int) else -1,
        "logical_date": moment("logical_date"),
        "data_interval_start": moment("data_interval_start"),
        "data_interval_end": moment("data_interval_end"),
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


class DponeRuntimeSubprocessOperator(BaseOperator):
    """Runs `command` as a local process with `env_vars` added to the worker's environment.

    With `validate_result` (the dpone runtime task) the process gets DPONE_XCOM_PATH, a temporary
    file to write its dpone.run-result.v1 to; the task fails unless the process exits 0 and the
    result has status "passed" (without Airflow retries when its error is not retryable), and the
    result is returned (XCom). Hooks run with `validate_result=False`: only the exit code counts.
    Output is streamed to the task log. Nothing is rendered by Jinja: the command and env reach
    the process exactly as written.
    """

    template_fields = ()
    template_ext = ()

    def __init__(self, *, command, env_vars=None, validate_result=True, **kwargs):
        super().__init__(**kwargs)
        self.command = list(command)
        self.env_vars = dict(env_vars or {})
        self.validate_result = validate_result

    def execute(self, context):
        context["dpone_item_label"] = self.env_vars.get(LABEL_ENV) or self.task_id
        with tempfile.TemporaryDirectory(prefix="dpone-xcom-") as tmp:
            env = {**os.environ, **self.env_vars}
            env[CONTEXT_ENV] = _dpone_airflow_context(context)
            xcom_path = os.path.join(tmp, "return.json")
            if self.validate_result:
                env["DPONE_XCOM_PATH"] = xcom_path
            returncode = self._dpone_run(env)
            result = self._dpone_read(xcom_path) if self.validate_result else None
        if not self.validate_result:
            if returncode != 0:
                raise AirflowException(f"command exited with code {returncode}")
            return None
        problem = _dpone_result_problem(result)
        if problem or returncode != 0:
            _dpone_push_result(context, result)
            raise _dpone_failure(result, f"{problem or 'dpone run'} (exit code {returncode})")
        return result

    def _dpone_run(self, env):
        self.log.info("Running: %s", shlex.join(self.command))
        with subprocess.Popen(
            self.command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="backslashreplace",
            start_new_session=True,
        ) as proc:
            self._dpone_proc = proc
            for line in proc.stdout:
                self.log.info("%s", line.rstrip("\n"))
            return proc.wait()

    def _dpone_read(self, path):
        try:
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise DponeRunOutcomeError(f"unreadable {RESULT_SCHEMA} result: {exc}") from exc

    def on_kill(self):
        proc = getattr(self, "_dpone_proc", None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)


_dpone_require_mapping(DponeRuntimeSubprocessOperator)


with DAG(
    dag_id="dpone_ref_subprocess_summary",
    schedule=None,
    start_date=datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
    catchup=False,
    tags=["dpone", "w"],
) as dag:
    pre_migrate = DponeRuntimeSubprocessOperator(
        task_id="pre_migrate",
        command=["/bin/sh", "-c", "echo pre-migrate hook"],
        validate_result=False,
        env_vars={
            "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_subprocess_summary","flavour":"subprocess","image":null,"pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
            "DPONE_CATALOG": "/app/catalog/workloads.yaml",
            "DPONE_LOG_FORMAT": "json",
        },
    )
    runtime = DponeRuntimeSubprocessOperator.partial(
        task_id="dpone_run",
        command=[
            "dpone",
            "run",
            "--catalog",
            "/app/catalog/workloads.yaml",
            "--workload",
            "w",
            "--process",
            "p",
        ],
        pool="dpone_backfill",
        max_active_tis_per_dag=8,
        map_index_template="{{ dpone_item_label }}",
    ).expand(
        env_vars=[
            {
                "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_subprocess_summary","flavour":"subprocess","image":null,"pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
                "DPONE_CATALOG": "/app/catalog/workloads.yaml",
                "DPONE_LOG_FORMAT": "json",
                "DPONE_AIRFLOW_MAPPING_ITEM": '{"backfill_plan_hash":"sha256:3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d","chunks_count":10,"first_chunk_index":1,"item_index":0,"last_chunk_index":10,"mapping_plan_fingerprint":"sha256:2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e","mode":"summary","schema":"dpone.airflow-mapping-item.v1"}',
                "DPONE_AIRFLOW_MAPPING_LABEL": "item 0: chunks 1-10 (2024-01-01 .. 2024-01-11)",
            },
            {
                "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_subprocess_summary","flavour":"subprocess","image":null,"pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
                "DPONE_CATALOG": "/app/catalog/workloads.yaml",
                "DPONE_LOG_FORMAT": "json",
                "DPONE_AIRFLOW_MAPPING_ITEM": '{"backfill_plan_hash":"sha256:3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d","chunks_count":10,"first_chunk_index":11,"item_index":1,"last_chunk_index":20,"mapping_plan_fingerprint":"sha256:2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e","mode":"summary","schema":"dpone.airflow-mapping-item.v1"}',
                "DPONE_AIRFLOW_MAPPING_LABEL": "item 1: chunks 11-20 (2024-01-11 .. 2024-01-21)",
            },
            {
                "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_subprocess_summary","flavour":"subprocess","image":null,"pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
                "DPONE_CATALOG": "/app/catalog/workloads.yaml",
                "DPONE_LOG_FORMAT": "json",
                "DPONE_AIRFLOW_MAPPING_ITEM": '{"backfill_plan_hash":"sha256:3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d","chunks_count":10,"first_chunk_index":21,"item_index":2,"last_chunk_index":30,"mapping_plan_fingerprint":"sha256:2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e","mode":"summary","schema":"dpone.airflow-mapping-item.v1"}',
                "DPONE_AIRFLOW_MAPPING_LABEL": "item 2: chunks 21-30 (2024-01-21 .. 2024-01-31)",
            },
        ]
    )
    post_notify = DponeRuntimeSubprocessOperator(
        task_id="post_notify",
        command=["/bin/sh", "-c", "echo post-notify hook"],
        validate_result=False,
        env_vars={
            "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_subprocess_summary","flavour":"subprocess","image":null,"pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
            "DPONE_CATALOG": "/app/catalog/workloads.yaml",
            "DPONE_LOG_FORMAT": "json",
        },
    )

    pre_migrate >> runtime >> post_notify
