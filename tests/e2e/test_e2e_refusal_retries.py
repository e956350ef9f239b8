"""A final refusal is final in real Airflow: with `retries: 3`, a mapped task whose item or pack does
not match the image's plan fails after exactly one try; a retryable failure in the same DAG run is
retried (the control that proves retries were on). Airflow 3.3.2 and 2.10.5, `dag.test()`, the
generated DAG running the project venv's real `dpone run` against the real Postgres, in both
flavours: subprocess, and kubernetes with each pod's command run as a local process (the harness's
``--local-pods``: no cluster here; the DAG's pod operator subclass and its result check unchanged).

The e2e project's summary workload is cut to 10 days in 5 items of 2 chunks. In the generated DAG
file, item 1's backfill plan hash is edited (DPONE_AIRFLOW_MAPPING_PLAN_MISMATCH) and item 3's run
identity names another pack (DPONE_PACK_MISMATCH); item 2's first chunk is leased by a foreign
holder (DPONE_BACKFILL_CHUNK_BUSY, retryable); items 0 and 4 commit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import e2ekit
import pytest
from dpone import errors
from dpone.ledger.factory import open_store
from dpone.ledger.port import LeaseStatus
from dpone.packing.pack import load_and_compile
from dpone.packing.verify import Selection
from dpone.run.orchestrator import RunContext, RunSettings

VERSIONS = ["3.3.2", "2.10.5"]
RETRIES = 3
PLAN_TAMPERED, BUSY, PACK_TAMPERED = 1, 2, 3
HOLDER = "dpone-test-holder:refusal"

pytestmark = [pytest.mark.postgres, pytest.mark.airflow]


@pytest.fixture(scope="module")
def e2e_db(pg_dsn: str) -> Iterator[str]:
    with e2ekit.private_database(pg_dsn, prefix="dpone_refusal_e2e") as dsn:
        e2ekit.seed(dsn)
        yield dsn


def _project(root: Path, flavour: str) -> Path:
    """The e2e project, its summary workload cut to 10 days in 5 items, with `retries: 3`, in
    ``flavour`` (kubernetes: an image the local pods never pull, and the DSN's secret reference,
    which the local pods take from the worker's DPONE_CONN_E2E instead)."""
    catalog = e2ekit.copy_project(root / "project")
    text = catalog.read_text(encoding="utf-8")
    if flavour == "kubernetes":
        assert "    flavour: subprocess\n" in text
        text = text.replace(
            "    flavour: subprocess\n",
            "    flavour: kubernetes\n    image: registry.example.invalid/dpone-runtime:test\n"
            "    secrets: [{connection: e2e, secret: dpone-e2e, key: dsn}]\n",
        )
    mapping = "mapping: {mode: summary, max_items: 40, max_active: 8, pool: dpone_e2e}"
    assert mapping in text
    text = text.replace(
        mapping,
        "mapping: {mode: summary, max_items: 5, max_active: 5, pool: dpone_e2e}\n"
        f"      retries: {RETRIES}\n      retry_delay: 0",
    )
    catalog.write_text(text, encoding="utf-8")
    manifest = catalog.with_name("orders_summary.yaml")
    text = manifest.read_text(encoding="utf-8")
    assert "end: 2024-01-01" in text
    manifest.write_text(text.replace("end: 2024-01-01", "end: 2023-01-11"), encoding="utf-8")
    return catalog


def _tamper(dag_file: Path) -> None:
    """Edit two items' env in the generated file, as a hand edit or a stale image would: item
    PLAN_TAMPERED's plan hash, and item PACK_TAMPERED's run identity (the task's is written once,
    in TASK_ENV; the edit gives that one item its own, naming another pack)."""
    lines = dag_file.read_text(encoding="utf-8").splitlines(keepends=True)
    (shared,) = [line for line in lines if '"DPONE_AIRFLOW_RUN_IDENTITY": ' in line]
    other_pack = re.sub(
        r'("pack_fingerprint":"sha256:)[0-9a-f]{64}', r"\g<1>" + "2" * 64, shared.strip()
    )
    plan_edits = pack_edits = 0
    for number, line in enumerate(list(lines)):
        if "DPONE_AIRFLOW_MAPPING_ITEM" not in line:
            continue
        if f'"item_index":{PLAN_TAMPERED},' in line:
            lines[number] = re.sub(
                r'("backfill_plan_hash":"sha256:)[0-9a-f]{64}', r"\g<1>" + "1" * 64, line
            )
            plan_edits += lines[number] != line
        if f'"item_index":{PACK_TAMPERED},' in line:  # after **TASK_ENV[...]: it wins
            assert lines[number - 1].strip().startswith("**TASK_ENV[")
            indent = line[: len(line) - len(line.lstrip())]
            lines[number] = f"{indent}{other_pack}\n{line}"
            pack_edits += other_pack != shared.strip()
    assert (plan_edits, pack_edits) == (1, 1), (plan_edits, pack_edits)
    dag_file.write_text("".join(lines), encoding="utf-8")


def _hold_busy_item(catalog: Path, data_dsn: str) -> Any:
    _, packs, problems = load_and_compile(str(catalog))
    assert not problems
    (pack,) = [p for p in packs if p.workload.name == "orders_summary"]
    plan = pack.processes[0]
    assert plan.mapping_plan is not None and plan.mapping_plan.items_total == 5
    ctx = RunContext(pack, plan, Selection(plan.chunks, None, None), RunSettings())
    store = open_store("audit_schema", dsn=e2ekit.as_url(data_dsn), schema=e2ekit.AUDIT, path=None)
    store.initialize(ctx.shape(), HOLDER, 30)
    chunk = plan.chunks[plan.mapping_plan.items[BUSY].first_chunk_index - 1]
    held = store.acquire_lease(ctx.shape(), chunk, HOLDER, 3600)
    assert held.status is LeaseStatus.ACQUIRED
    return store


@pytest.mark.parametrize("flavour", ["subprocess", "kubernetes"])
@pytest.mark.parametrize("version", VERSIONS)
def test_a_final_refusal_fails_after_one_try(
    version: str, flavour: str, e2e_db: str, tmp_path: Path
) -> None:
    python = e2ekit.airflow_python(version)
    catalog = _project(tmp_path, flavour)
    out = tmp_path / "dags"
    generated = e2ekit.dpone("generate", str(catalog), "--out", str(out))
    assert generated.returncode == 0, generated.stderr
    dag_file = out / f"{e2ekit.SUMMARY_DAG}.py"
    assert f'"retries": {RETRIES},' in dag_file.read_text(encoding="utf-8")
    _tamper(dag_file)
    e2ekit.reset_summary(e2e_db)
    store = _hold_busy_item(catalog, e2e_db)
    try:
        facts = e2ekit.harness(
            python,
            {"DPONE_CONN_E2E": e2ekit.as_url(e2e_db)},
            "dagtest",
            "--home",
            str(tmp_path / "airflow-home"),
            "--dag-file",
            str(dag_file),
            "--task-id",
            e2ekit.TASK,
            *(["--local-pods"] if flavour == "kubernetes" else []),
        )
    finally:
        store.close()
    assert facts["import_errors"] == {}, facts["import_errors"]
    tis = {t["map_index"]: t for t in facts["task_instances"] if t["task_id"] == e2ekit.TASK}
    assert sorted(tis) == [0, 1, 2, 3, 4], facts["_log_tail"]
    tries = {index: (ti["state"], ti["try_number"]) for index, ti in tis.items()}
    # the final refusals: failed after one try, although three retries were allowed
    assert tries[PLAN_TAMPERED] == ("failed", 1), (tries, facts["_log_tail"])
    assert tries[PACK_TAMPERED] == ("failed", 1), tries
    # the control: a retryable failure used every try Airflow allows
    assert tries[BUSY] == ("failed", RETRIES + 1), tries
    assert tries[0] == ("success", 1) and tries[4] == ("success", 1), tries
    xcom = facts["xcom"]
    for index, code in (
        (PLAN_TAMPERED, errors.MAPPING_PLAN_MISMATCH),
        (PACK_TAMPERED, errors.PACK_MISMATCH),
        (BUSY, errors.CHUNK_BUSY),
    ):
        result = xcom[f"{e2ekit.TASK}[{index}]"]
        assert result["status"] == "failed" and result["error"]["code"] == code, result
        assert result["error"]["retryable"] is (index == BUSY), result
    print(json.dumps({"airflow": version, "flavour": flavour, "tries": tries}, sort_keys=True))
