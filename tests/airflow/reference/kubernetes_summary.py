"""dpone reference DAG: kubernetes flavour, summary mode (3 mapped items), pre/post hooks.

Hand-written reference of the file shape `dpone generate` renders for the kubernetes flavour; parsed,
mapped, serialized and turned into pods by Airflow 2.10.5, 2.11.2, 3.2.2 and 3.3.2 in
tests/airflow/test_reference_dags.py. Env values are written as the original strings:
the operators render no template field, so every value reaches the pod or process as written.
"""

# ruff: noqa: UP017 (datetime.UTC needs Python 3.11; Airflow 2.x workers may run 3.9/3.10)
from __future__ import annotations

import datetime
import inspect
import json

import airflow
from airflow import DAG
from airflow.exceptions import AirflowException

try:
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # Airflow 2.x
    from airflow.exceptions import AirflowFailException

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


try:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.providers.cncf.kubernetes.secret import Secret
    from kubernetes.client import models as k8s
except ImportError as exc:
    raise _dpone_unsupported("the cncf.kubernetes provider's KubernetesPodOperator") from exc


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


# The pod options dpone writes in a pod manifest's form, and the kubernetes.client model each
# becomes: the pod operator takes these models (or, for some, dicts of the models' own names).
POD_MODELS = {
    "tolerations": "list[V1Toleration]",
    "affinity": "V1Affinity",
    "image_pull_secrets": "list[V1LocalObjectReference]",
    "volumes": "list[V1Volume]",
    "volume_mounts": "list[V1VolumeMount]",
    "env_from": "list[V1EnvFromSource]",
    "security_context": "V1PodSecurityContext",
    "container_security_context": "V1SecurityContext",
}


def _dpone_k8s(value, kind):
    """A pod-manifest value (camelCase keys) as the kubernetes.client model `kind` names.

    Unknown keys fail the import: the API client would drop them silently.
    """
    if value is None or kind in ("str", "int", "bool", "float", "object", "date", "datetime"):
        return value
    if kind.startswith("list["):
        return [_dpone_k8s(item, kind[5:-1]) for item in value]
    if kind.startswith(("dict(", "dict[")):  # kubernetes < 35: dict(str, X); later: dict[str, X]
        inner = kind[5:-1].split(", ", 1)[1]
        return {key: _dpone_k8s(item, inner) for key, item in value.items()}
    model = getattr(k8s, kind)
    attrs = {key: attr for attr, key in model.attribute_map.items()}
    unknown = sorted(set(value) - set(attrs))
    if unknown:
        raise ValueError(f"{kind} has no field {unknown[0]!r}")
    return model(
        **{attrs[k]: _dpone_k8s(v, model.openapi_types[attrs[k]]) for k, v in value.items()}
    )


class DponePodOperator(KubernetesPodOperator):
    """A pod whose every argument reaches Kubernetes as written: nothing is rendered by Jinja.

    dpone writes literal values only, so no template field is needed; without rendering no
    catalog string (image, commands, env, labels, annotations, ...) can be altered at task time.
    Pod options given in a pod manifest's form become the operator's kubernetes.client models.
    """

    template_fields = ()
    template_ext = ()

    def __init__(self, **kwargs):
        for name, kind in POD_MODELS.items():
            if isinstance(kwargs.get(name), (dict, list)):
                kwargs[name] = _dpone_k8s(kwargs[name], kind)
        super().__init__(**kwargs)


class DponeRuntimeOperator(DponePodOperator):
    """Runs `dpone run` in a pod; the task fails unless the pod's result has status "passed".

    The result is the pod's XCom (dpone.run-result.v1). It is checked on the synchronous path
    (`execute`) and on the deferrable completion path (`trigger_reentry`, the method the pod operator
    defers to in cncf.kubernetes 10.10.0 and 10.25.0). Both paths read the XCom through
    `extract_xcom`, where it is captured: 10.10.0's `trigger_reentry` does not return it.
    A result whose error is not retryable fails the task without Airflow retries.
    The item's label (DPONE_AIRFLOW_MAPPING_LABEL) goes to the context for `map_index_template`.
    The Airflow run it serves (DPONE_AIRFLOW_CONTEXT) joins the pod's env at execute time.
    """

    def execute(self, context):
        self._dpone_prepare(context)
        try:
            result = super().execute(context)
        except AirflowException as exc:
            self._dpone_reraise(exc)
            raise
        return self._dpone_outcome(result)

    def trigger_reentry(self, context, event):
        self._dpone_prepare(context)
        try:
            result = super().trigger_reentry(context, event)
        except AirflowException as exc:
            self._dpone_reraise(exc)
            raise
        return self._dpone_outcome(result)

    def extract_xcom(self, pod, **kwargs):
        self._dpone_result = super().extract_xcom(pod, **kwargs)
        return self._dpone_result

    def _dpone_prepare(self, context):
        self._dpone_result = None
        self._dpone_context = context
        env = self.env_vars or ()
        if isinstance(env, dict):
            label = env.get(LABEL_ENV)
        else:
            label = next((var.value for var in env if var.name == LABEL_ENV), None)
        context["dpone_item_label"] = label or self.task_id
        value = _dpone_airflow_context(context)
        if isinstance(env, dict):
            self.env_vars = {**env, CONTEXT_ENV: value}
        else:
            kept = [var for var in env if var.name != CONTEXT_ENV]
            self.env_vars = [*kept, k8s.V1EnvVar(name=CONTEXT_ENV, value=value)]

    def _dpone_outcome(self, result):
        if result is None:
            result = self._dpone_result
        problem = _dpone_result_problem(result)
        if problem:
            _dpone_push_result(self._dpone_context, result)
            raise _dpone_failure(result, problem)
        return result

    def _dpone_reraise(self, exc):
        if isinstance(exc, (DponeRunOutcomeError, DponeRunNotRetryableError)):
            return
        if self._dpone_result is None:
            return
        problem = _dpone_result_problem(self._dpone_result)
        if problem:
            _dpone_push_result(self._dpone_context, self._dpone_result)
            raise _dpone_failure(self._dpone_result, f"{problem} ({exc})") from exc


_dpone_require_mapping(DponeRuntimeOperator)


with DAG(
    dag_id="dpone_ref_kubernetes_summary",
    schedule=None,
    start_date=datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
    catchup=False,
    tags=["dpone", "w"],
) as dag:
    pre_migrate = DponePodOperator(
        task_id="pre_migrate",
        name="dpone-pre-migrate",
        image="registry.example.com/dpone/runtime:1.4.2",
        namespace="dpone",
        secrets=[Secret("env", "DPONE_CONN_WAREHOUSE", "dpone-conn-warehouse", "dsn")],
        cmds=["/bin/sh", "-c", "echo pre-migrate hook"],
        env_vars={
            "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_kubernetes_summary","flavour":"kubernetes","image":"registry.example.com/dpone/runtime:1.4.2","pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
            "DPONE_CATALOG": "/app/catalog/workloads.yaml",
            "DPONE_LOG_FORMAT": "json",
        },
    )
    runtime = DponeRuntimeOperator.partial(
        task_id="dpone_run",
        name="dpone-run",
        image="registry.example.com/dpone/runtime:1.4.2",
        namespace="dpone",
        secrets=[Secret("env", "DPONE_CONN_WAREHOUSE", "dpone-conn-warehouse", "dsn")],
        cmds=["dpone"],
        arguments=[
            "run",
            "--catalog",
            "/app/catalog/workloads.yaml",
            "--workload",
            "w",
            "--process",
            "p",
        ],
        do_xcom_push=True,
        pool="dpone_backfill",
        max_active_tis_per_dag=8,
        map_index_template="{{ dpone_item_label }}",
    ).expand(
        env_vars=[
            {
                "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_kubernetes_summary","flavour":"kubernetes","image":"registry.example.com/dpone/runtime:1.4.2","pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
                "DPONE_CATALOG": "/app/catalog/workloads.yaml",
                "DPONE_LOG_FORMAT": "json",
                "DPONE_AIRFLOW_MAPPING_ITEM": '{"backfill_plan_hash":"sha256:3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d","chunks_count":10,"first_chunk_index":1,"item_index":0,"last_chunk_index":10,"mapping_plan_fingerprint":"sha256:2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e","mode":"summary","schema":"dpone.airflow-mapping-item.v1"}',
                "DPONE_AIRFLOW_MAPPING_LABEL": "item 0: chunks 1-10 (2024-01-01 .. 2024-01-11)",
            },
            {
                "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_kubernetes_summary","flavour":"kubernetes","image":"registry.example.com/dpone/runtime:1.4.2","pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
                "DPONE_CATALOG": "/app/catalog/workloads.yaml",
                "DPONE_LOG_FORMAT": "json",
                "DPONE_AIRFLOW_MAPPING_ITEM": '{"backfill_plan_hash":"sha256:3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d","chunks_count":10,"first_chunk_index":11,"item_index":1,"last_chunk_index":20,"mapping_plan_fingerprint":"sha256:2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e","mode":"summary","schema":"dpone.airflow-mapping-item.v1"}',
                "DPONE_AIRFLOW_MAPPING_LABEL": "item 1: chunks 11-20 (2024-01-11 .. 2024-01-21)",
            },
            {
                "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_kubernetes_summary","flavour":"kubernetes","image":"registry.example.com/dpone/runtime:1.4.2","pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
                "DPONE_CATALOG": "/app/catalog/workloads.yaml",
                "DPONE_LOG_FORMAT": "json",
                "DPONE_AIRFLOW_MAPPING_ITEM": '{"backfill_plan_hash":"sha256:3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d","chunks_count":10,"first_chunk_index":21,"item_index":2,"last_chunk_index":30,"mapping_plan_fingerprint":"sha256:2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e","mode":"summary","schema":"dpone.airflow-mapping-item.v1"}',
                "DPONE_AIRFLOW_MAPPING_LABEL": "item 2: chunks 21-30 (2024-01-21 .. 2024-01-31)",
            },
        ]
    )
    post_notify = DponePodOperator(
        task_id="post_notify",
        name="dpone-post-notify",
        image="registry.example.com/dpone/runtime:1.4.2",
        namespace="dpone",
        secrets=[Secret("env", "DPONE_CONN_WAREHOUSE", "dpone-conn-warehouse", "dsn")],
        cmds=["/bin/sh", "-c", "echo post-notify hook"],
        env_vars={
            "DPONE_AIRFLOW_RUN_IDENTITY": '{"dag_id":"dpone_ref_kubernetes_summary","flavour":"kubernetes","image":"registry.example.com/dpone/runtime:1.4.2","pack_fingerprint":"sha256:1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f","process":"p","schema":"dpone.airflow-run-identity.v1","workload":"w"}',
            "DPONE_CATALOG": "/app/catalog/workloads.yaml",
            "DPONE_LOG_FORMAT": "json",
        },
    )

    pre_migrate >> runtime >> post_notify
