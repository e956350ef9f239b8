"""The values the hand-written reference DAGs in tests/airflow/reference/ carry.

The reference DAG files hold the original values as literals (their operators render no template
field); the matrix test checks both that the files' literals are exactly these values and that every
Airflow version hands them, byte-for-byte, to the pod / process. Standard library only.
"""

from __future__ import annotations

import datetime
import json
import os

from hostile_values import HOSTILE_CORPUS, PLAIN_CORPUS

AIRFLOW_VERSIONS = ("2.10.5", "2.11.2", "3.2.2", "3.3.2")
EXPECTED_PROVIDER = {
    "2.10.5": "10.10.0",
    "2.11.2": "10.25.0",
    "3.2.2": "10.25.0",
    "3.3.2": "10.25.0",
}
# dag.test() smokes: name -> (reference file, item_index of the mapped item that fails, or None).
SMOKES = {
    "subprocess": ("subprocess_summary.py", 1),
    "kubernetes-stubbed": ("kubernetes_summary.py", 2),
    "subprocess-env-fidelity": ("subprocess_env_fidelity.py", None),
}


def smoke_versions() -> tuple[str, ...]:
    """dag.test() on 3.2.2 costs about 1 min of CPU for the three smokes: 2.10.5 + 3.3.2 by
    default; DPONE_AIRFLOW_SMOKE_VERSIONS=2.10.5,2.11.2,3.2.2,3.3.2 runs all (all four pass)."""
    wanted = os.environ.get("DPONE_AIRFLOW_SMOKE_VERSIONS", "2.10.5,3.3.2").split(",")
    return tuple(v for v in AIRFLOW_VERSIONS if v in wanted)


PACK_FINGERPRINT = "sha256:" + "1f" * 32
MAPPING_PLAN_FINGERPRINT = "sha256:" + "2e" * 32
BACKFILL_PLAN_HASH = "sha256:" + "3d" * 32
IMAGE = "registry.example.com/dpone/runtime:1.4.2"
CATALOG_IN_IMAGE = "/app/catalog/workloads.yaml"


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def run_identity(dag_id: str, flavour: str) -> str:
    return canonical_json(
        {
            "schema": "dpone.airflow-run-identity.v1",
            "dag_id": dag_id,
            "workload": "w",
            "process": "p",
            "pack_fingerprint": PACK_FINGERPRINT,
            "flavour": flavour,
            "image": IMAGE if flavour == "kubernetes" else None,
        }
    )


def mapping_items(count: int = 3, chunks_per_item: int = 10) -> list[tuple[str, str]]:
    """(DPONE_AIRFLOW_MAPPING_ITEM, DPONE_AIRFLOW_MAPPING_LABEL) per item: daily chunks from 2024-01-01."""
    start = datetime.date(2024, 1, 1)
    out = []
    for i in range(count):
        first = i * chunks_per_item + 1
        last = first + chunks_per_item - 1
        item = {
            "schema": "dpone.airflow-mapping-item.v1",
            "mode": "summary",
            "mapping_plan_fingerprint": MAPPING_PLAN_FINGERPRINT,
            "backfill_plan_hash": BACKFILL_PLAN_HASH,
            "item_index": i,
            "first_chunk_index": first,
            "last_chunk_index": last,
            "chunks_count": chunks_per_item,
        }
        lo = start + datetime.timedelta(days=first - 1)
        hi = start + datetime.timedelta(days=last)
        label = f"item {i}: chunks {first}-{last} ({lo.isoformat()} .. {hi.isoformat()})"
        out.append((canonical_json(item), label))
    return out


def base_env(dag_id: str, flavour: str) -> dict[str, str]:
    return {
        "DPONE_AIRFLOW_RUN_IDENTITY": run_identity(dag_id, flavour),
        "DPONE_CATALOG": CATALOG_IN_IMAGE,
        "DPONE_LOG_FORMAT": "json",
    }


def mapped_envs(
    dag_id: str, flavour: str, extra: dict[str, str] | None = None
) -> list[dict[str, str]]:
    envs = []
    for item_json, label in mapping_items():
        env = dict(base_env(dag_id, flavour))
        env.update(extra or {})
        env["DPONE_AIRFLOW_MAPPING_ITEM"] = item_json
        env["DPONE_AIRFLOW_MAPPING_LABEL"] = label
        envs.append(env)
    return envs


def hostile_env() -> dict[str, str]:
    env = dict(HOSTILE_CORPUS)
    env.update({f"DPONE_T_PLAIN_{i:02d}": v for i, v in enumerate(PLAIN_CORPUS)})
    return env


KPO_RUN_ARGS = ["run", "--catalog", CATALOG_IN_IMAGE, "--workload", "w", "--process", "p"]
SUBPROCESS_RUN_COMMAND = ["dpone", *KPO_RUN_ARGS]

# What each reference file must contain. "envs" are the ORIGINAL env dicts per map index (runtime task)
# and per hook / plain task.
REFERENCE_DAGS: dict[str, dict] = {
    "kubernetes_summary.py": {
        "dag_id": "dpone_ref_kubernetes_summary",
        "flavour": "kubernetes",
        "runtime_class": "DponeRuntimeOperator",
        "mapped": True,
        "tasks": ["pre_migrate", "dpone_run", "post_notify"],
        "hook_envs": {
            "pre_migrate": base_env("dpone_ref_kubernetes_summary", "kubernetes"),
            "post_notify": base_env("dpone_ref_kubernetes_summary", "kubernetes"),
        },
        "runtime_envs": mapped_envs("dpone_ref_kubernetes_summary", "kubernetes"),
    },
    "kubernetes_internal.py": {
        "dag_id": "dpone_ref_kubernetes_internal",
        "flavour": "kubernetes",
        "runtime_class": "DponeRuntimeOperator",
        "mapped": False,
        "tasks": ["dpone_run"],
        "hook_envs": {},
        "runtime_envs": [base_env("dpone_ref_kubernetes_internal", "kubernetes")],
    },
    "kubernetes_env_fidelity.py": {
        "dag_id": "dpone_ref_kubernetes_env_fidelity",
        "flavour": "kubernetes",
        "runtime_class": "DponeRuntimeOperator",
        "mapped": True,
        "tasks": ["pre_hostile", "dpone_run"],
        "hook_envs": {"pre_hostile": hostile_env()},
        "runtime_envs": mapped_envs(
            "dpone_ref_kubernetes_env_fidelity", "kubernetes", hostile_env()
        ),
    },
    "subprocess_summary.py": {
        "dag_id": "dpone_ref_subprocess_summary",
        "flavour": "subprocess",
        "runtime_class": "DponeRuntimeSubprocessOperator",
        "mapped": True,
        "tasks": ["pre_migrate", "dpone_run", "post_notify"],
        "hook_envs": {
            "pre_migrate": base_env("dpone_ref_subprocess_summary", "subprocess"),
            "post_notify": base_env("dpone_ref_subprocess_summary", "subprocess"),
        },
        "runtime_envs": mapped_envs("dpone_ref_subprocess_summary", "subprocess"),
    },
    "subprocess_env_fidelity.py": {
        "dag_id": "dpone_ref_subprocess_env_fidelity",
        "flavour": "subprocess",
        "runtime_class": "DponeRuntimeSubprocessOperator",
        "mapped": True,
        "tasks": ["pre_hostile", "dpone_run"],
        "hook_envs": {"pre_hostile": hostile_env()},
        "runtime_envs": mapped_envs(
            "dpone_ref_subprocess_env_fidelity", "subprocess", hostile_env()
        ),
    },
}
