"""What a DAG file says, decided before rendering: labels, run identity, env, task order."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from dpone.packing.pack import load_and_compile
from dpone.task.identity import parse_run_identity
from dpone.task.item import ENV_ITEM, ENV_LABEL, ENV_RUN_IDENTITY, parse_mapping_item
from dpone_generator.dagspec import DagFile, dag_file
from dpone_generator.render import pod_name
from generator_support import GOLDEN, write_catalog

ROOT = Path(__file__).resolve().parents[2]
IDENTITY_SCHEMA = json.loads(
    (ROOT / "runtime/src/dpone/schemas/run-identity.v1.schema.json").read_text(encoding="utf-8")
)


def _dags(case: str) -> dict[str, DagFile]:
    _, packs, problems = load_and_compile(f"golden/{case}/workloads.yaml")
    assert not problems
    return {pack.workload.name: dag_file(pack, f"golden/{case}/workloads.yaml") for pack in packs}


def _labels(dag: DagFile) -> list[str]:
    return [dict(env)[ENV_LABEL] for env in dag.runtime_tasks[0].mapped_envs]


def test_summary_labels_show_index_range_and_half_open_bounds(in_root: Path) -> None:
    labels = _labels(_dags("summary_365_into_40")["orders_history"])
    assert len(labels) == 40
    assert labels[0] == "item 0/40: chunks 1-10, 2023-01-01 <= order_date < 2023-01-11"
    assert labels[5] == "item 5/40: chunks 51-59, 2023-02-20 <= order_date < 2023-03-01"
    assert labels[-1] == "item 39/40: chunks 357-365, 2023-12-23 <= order_date < 2024-01-01"


def test_visible_integer_and_timestamp_labels(in_root: Path) -> None:
    assert _labels(_dags("visible_30_daily")["payments_daily"])[29] == (
        "item 29/30: chunk 30, 2024-06-30 <= paid_on < 2024-07-01"
    )
    assert _labels(_dags("summary_1000_into_200")["events_by_id"])[199] == (
        "item 199/200: chunks 996-1000, 995000 <= event_id < 1000000"
    )
    assert _labels(_dags("multi_workload")["sessions_hourly"])[0] == (
        "item 0/48: chunk 1, 2024-03-01T00:00:00Z <= started_at < 2024-03-01T01:00:00Z"
    )


def test_every_mapped_env_carries_its_item_and_the_shared_identity(in_root: Path) -> None:
    _, packs, _ = load_and_compile("golden/summary_1000_into_200/workloads.yaml")
    pack = packs[0]
    dag = dag_file(pack, "x")
    task = dag.runtime_tasks[0]
    plan = pack.processes[0].mapping_plan
    assert plan is not None and task.items_total == plan.items_total == 200
    identities = set()
    for index, env in enumerate(task.mapped_envs):
        values = dict(env)
        item = parse_mapping_item(values[ENV_ITEM])
        assert (item.item_index, item.first_chunk_index) == (
            index,
            plan.items[index].first_chunk_index,
        )
        assert item.mapping_plan_fingerprint == plan.plan_fingerprint
        identities.add(values[ENV_RUN_IDENTITY])
        assert list(values)[-2:] == [ENV_ITEM, ENV_LABEL]
    assert len(identities) == 1


@pytest.mark.parametrize(
    ("case", "flavour", "image"),
    [
        ("gitops_policy", "kubernetes", "registry.example.com/dpone-runtime:0.1.0"),
        ("hooks_subprocess", "subprocess", None),
    ],
)
def test_run_identity_is_valid_on_every_task(
    in_root: Path, case: str, flavour: str, image: str | None
) -> None:
    _, packs, _ = load_and_compile(f"golden/{case}/workloads.yaml")
    for pack in packs:
        dag = dag_file(pack, "x")
        envs = [h.env for h in (*dag.pre_hooks, *dag.post_hooks)]
        envs += [t.env for t in dag.runtime_tasks]
        envs += [e for t in dag.runtime_tasks for e in t.mapped_envs]
        for env in envs:
            raw = dict(env)[ENV_RUN_IDENTITY]
            jsonschema.validate(json.loads(raw), IDENTITY_SCHEMA)
            identity = parse_run_identity(raw)
            assert identity.pack_fingerprint == pack.fingerprint
            assert (identity.flavour, identity.image, identity.dag_id) == (
                flavour,
                image,
                dag.dag_id,
            )


def test_internal_task_env_is_catalog_env_plus_identity_sorted(in_root: Path) -> None:
    dag = _dags("internal_default")["orders_history"]
    task = dag.runtime_tasks[0]
    assert not task.mapped and task.pool is None
    assert [k for k, _ in task.env] == [ENV_RUN_IDENTITY]
    gitops = _dags("gitops_policy")["shipments_history"]
    keys = [k for k, _ in gitops.runtime_tasks[0].env]
    assert keys == sorted(keys) and ENV_RUN_IDENTITY in keys and "SHIPMENTS_NOTE" in keys


def test_processes_chain_in_manifest_order_between_hooks(in_root: Path) -> None:
    dag = _dags("hooks_subprocess")["ledger_sync"]
    assert dag.task_order == (
        "pre_migrate",
        "pre_announce",
        "run_accounts",
        "run_entries",
        "post_notify",
    )
    assert [t.process for t in dag.runtime_tasks] == ["accounts", "entries"]
    assert dict(dag.pre_hooks[0].env)[ENV_RUN_IDENTITY].count('"process":"accounts"') == 1
    assert dict(dag.post_hooks[0].env)[ENV_RUN_IDENTITY].count('"process":"entries"') == 1
    assert dag.runtime_tasks[0].arguments == (
        "run",
        "--catalog",
        "golden/hooks_subprocess/workloads.yaml",
        "--workload",
        "ledger_sync",
        "--process",
        "accounts",
    )


def test_pod_names_are_dns_labels() -> None:
    assert pod_name("run_Orders_") == "dpone-run-orders"
    assert pod_name("pre_" + "x" * 80) == "dpone-pre-" + "x" * 53


def test_pod_options_stay_off_subprocess_dag_files_and_task_options_stay_on(
    tmp_path: Path,
) -> None:
    """defaults.airflow.pod applies to kubernetes workloads only; task arguments to both."""
    manifest = (GOLDEN / "hooks_subprocess" / "ledger.yaml").read_text(encoding="utf-8")
    catalog = write_catalog(
        tmp_path,
        {
            "ledger.yaml": manifest,
            "workloads.yaml": (
                "schema: dpone.workload-catalog.v1\n"
                "defaults:\n"
                "  airflow:\n"
                "    owner: platform\n"
                "    pod: {service_account_name: dpone, node_selector: {pool: batch}}\n"
                "workloads:\n"
                "  pods:\n"
                "    manifest: ledger.yaml\n"
                "    airflow: {image: reg/x:1, dag_id: pods}\n"
                "  local:\n"
                "    manifest: ledger.yaml\n"
                "    airflow: {flavour: subprocess, dag_id: local, execution_timeout: 60}\n"
            ),
        },
    )
    _, packs, problems = load_and_compile(str(catalog))
    assert problems == []
    dags = {pack.workload.name: dag_file(pack, "workloads.yaml") for pack in packs}
    assert dags["pods"].pod_options == (
        ("service_account_name", "dpone"),
        ("node_selector", {"pool": "batch"}),
    )
    assert dags["pods"].task_options == (("owner", "platform"),)
    assert dags["local"].pod_options == ()
    assert dags["local"].task_options == (("execution_timeout", 60), ("owner", "platform"))
