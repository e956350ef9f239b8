"""Where each catalog pod option and task argument must appear in what Airflow builds.

``pod_option_problems`` compares the options of a planned DAG file with one pod as the Kubernetes
API would receive it (``airflow_probe.py``: ``build_pod_request_obj`` then the API client's
sanitising) plus the operator attributes that never reach the pod spec (the connection, the
in-cluster flag, the startup timeout, the finish action). Nested values must come back in their
manifest form exactly as the catalog wrote them: that is the proof that the operator turned them
into the right kubernetes.client models.
"""

from __future__ import annotations

from typing import Any

# pod option -> (where in the sanitised pod, key); "container" is the base container.
POD_PLACES: dict[str, tuple[str, str]] = {
    "service_account_name": ("spec", "serviceAccountName"),
    "node_selector": ("spec", "nodeSelector"),
    "tolerations": ("spec", "tolerations"),
    "affinity": ("spec", "affinity"),
    "image_pull_secrets": ("spec", "imagePullSecrets"),
    "image_pull_policy": ("container", "imagePullPolicy"),
    "volumes": ("spec", "volumes"),
    "volume_mounts": ("container", "volumeMounts"),
    "env_from": ("container", "envFrom"),
    "security_context": ("spec", "securityContext"),
    "container_security_context": ("container", "securityContext"),
    "priority_class_name": ("spec", "priorityClassName"),
    "termination_grace_period": ("spec", "terminationGracePeriodSeconds"),
    "labels": ("metadata", "labels"),
    "annotations": ("metadata", "annotations"),
}
OPERATOR_OPTIONS = (
    "kubernetes_conn_id",
    "in_cluster",
    "startup_timeout_seconds",
    "on_finish_action",
    "pod_template_file",
)
SECONDS = frozenset({"retry_delay", "max_retry_delay", "execution_timeout"})
XCOM_VOLUME = "xcom"  # the operator's own volume for the XCom sidecar


def _without_xcom(items: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [item for item in items or [] if item.get("name") != XCOM_VOLUME]


def pod_option_problems(
    options: dict[str, Any], pod: dict[str, Any], operator: dict[str, Any]
) -> list[str]:
    """Every pod option that is missing from, or different in, the built pod (empty: all there)."""
    problems: list[str] = []
    base = pod["spec"]["containers"][0]
    places = {"spec": pod["spec"], "container": base, "metadata": pod["metadata"]}
    for name, want in options.items():
        if name in OPERATOR_OPTIONS:
            got = operator.get(name)
        elif name in POD_PLACES:
            where, key = POD_PLACES[name]
            got = places[where].get(key)
            if name in ("volumes", "volume_mounts"):
                got = _without_xcom(got)
            elif name in ("labels", "annotations"):
                got = {k: v for k, v in (got or {}).items() if k in want}
        else:
            problems.append(f"{name}: no expectation for this option")
            continue
        if got != want:
            problems.append(f"{name}: catalog {want!r}, pod {got!r}")
    if (
        "kubernetes_conn_id" in options
        and operator.get("hook_conn_id") != options["kubernetes_conn_id"]
    ):
        problems.append(f"kubernetes_conn_id: the hook uses {operator.get('hook_conn_id')!r}")
    return problems


def task_option_problems(
    options: dict[str, Any], got: dict[str, Any], airflow_major: int
) -> list[str]:
    """Every task argument the operator does not carry as the catalog says (seconds as numbers)."""
    problems: list[str] = []
    for name, want in options.items():
        expected: Any = want
        if name == "retry_exponential_backoff" and want is True:
            expected = 2.0 if airflow_major >= 3 else True  # a multiplier on 3, a flag on 2
        if got.get(name) != expected or type(got.get(name)) is not type(expected):
            if not (name in SECONDS and float(got.get(name) or -1) == float(want)):
                problems.append(f"{name}: catalog {want!r}, task {got.get(name)!r}")
    return problems
