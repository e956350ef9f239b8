"""Every artifact dpone emits validates against its published schema (jsonschema, Draft 2020-12)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from dpone import errors
from dpone.errors import DponeError, ErrorRecord, Location
from dpone.packing.pack import WorkloadPack, load_and_compile
from dpone.task.identity import RunIdentity, parse_run_identity
from dpone.task.item import ENV_ITEM, ENV_RUN_IDENTITY, parse_mapping_item
from dpone_generator.dagspec import dag_file

from .support import (
    ERROR,
    GOLDEN,
    IDENTITY,
    ITEM,
    PLAN,
    GoldenDoc,
    errors_of,
    golden_docs,
    validator,
)

CATALOGS = tuple(sorted(GOLDEN.glob("*/workloads.yaml")))


@cache
def packs() -> tuple[WorkloadPack, ...]:
    found: list[WorkloadPack] = []
    for catalog in CATALOGS:
        _, compiled, problems = load_and_compile(str(catalog))
        assert not problems, problems
        found.extend(compiled)
    return tuple(found)


def emitted_env() -> Iterator[tuple[str, str, str]]:
    """(workload, env key, value) of every env value the generator writes into a DAG file."""
    for pack in packs():
        spec = dag_file(pack, "workloads.yaml")
        for task in spec.runtime_tasks:
            for env in (task.env, *task.mapped_envs):
                for key, value in env:
                    yield pack.workload.name, key, value


def test_golden_projects_are_all_covered() -> None:
    assert len(CATALOGS) >= 5
    modes = {p.mapping_policy.mode for pack in packs() for p in pack.processes}
    assert modes == {"internal", "visible", "summary"}


@pytest.mark.parametrize("doc", golden_docs(), ids=[d.id for d in golden_docs()])
def test_golden_documents_validate(doc: GoldenDoc) -> None:
    assert errors_of(doc.schema, doc.data) == []


def test_every_mapping_plan_validates() -> None:
    plans = [p.mapping_plan for pack in packs() for p in pack.processes if p.mapping_plan]
    assert len(plans) >= 5
    for plan in plans:
        artifact = json.loads(json.dumps(plan.to_artifact()))
        assert errors_of(PLAN, artifact) == []


def test_every_item_validates() -> None:
    count = 0
    for pack in packs():
        for process in pack.processes:
            plan = process.mapping_plan
            if plan is None:
                continue
            for item in plan.items:
                assert errors_of(ITEM, json.loads(plan.item_env_value(item))) == []
                count += 1
    assert count >= 200


def test_every_emitted_env_item_and_identity_validates() -> None:
    items = identities = 0
    for _, key, value in emitted_env():
        if key == ENV_ITEM:
            assert errors_of(ITEM, json.loads(value)) == []
            parse_mapping_item(value)
            items += 1
        elif key == ENV_RUN_IDENTITY:
            assert errors_of(IDENTITY, json.loads(value)) == []
            parse_run_identity(value)
            identities += 1
    assert items >= 200 and identities >= len(packs())


@pytest.mark.parametrize("image", ["registry.example.com/dpone-runtime:0.1.0", None])
def test_run_identities_validate(image: str | None) -> None:
    for pack in packs():
        for process in pack.processes:
            identity = RunIdentity(
                dag_id=pack.workload.airflow.dag_id,
                workload=pack.workload.name,
                process=process.name,
                pack_fingerprint=pack.fingerprint,
                flavour=pack.workload.airflow.flavour,
                image=image,
            )
            assert errors_of(IDENTITY, identity.to_json()) == []
            assert errors_of(IDENTITY, json.loads(identity.env_value())) == []


@pytest.mark.parametrize("code", sorted(errors.REGISTRY))
def test_every_registered_error_validates(code: str) -> None:
    located = ErrorRecord(code, "a message", Location("workloads.yaml", 3, 7)).to_json()
    file_only = ErrorRecord(code, "a message", Location("workloads.yaml")).to_json()
    bare = DponeError(code, "a message").to_json()
    for document in (located, file_only, bare):
        assert errors_of(ERROR, document) == []
    assert located["retryable"] is errors.REGISTRY[code].retryable


def test_errors_from_a_broken_project_validate(tmp_path: Path) -> None:
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\nworkloads:\n"
        "  a: {manifest: missing.yaml, colour: red}\n"
        "  b: {manifest: b.yaml, airflow: {mapping: {mode: often}, env: {DPONE_AIRFLOW_X: y}}}\n",
        encoding="utf-8",
    )
    (tmp_path / "b.yaml").write_text("schema: dpone.pipeline.v1\nprocesses: [}\n", encoding="utf-8")
    for catalog in ("workloads.yaml", "b.yaml", "nothing.yaml"):
        _, _, problems = load_and_compile(str(tmp_path / catalog))
        assert problems
        for problem in problems:
            assert errors_of(ERROR, problem.to_json()) == []


def test_a_schema_violation_is_detected_by_the_validator() -> None:
    # guard against a vacuous suite: the validators really reject things
    assert errors_of(PLAN, {"schema": "dpone.airflow-mapping-plan.v1"})
    assert not validator(ITEM).is_valid({})
