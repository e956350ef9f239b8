"""The pools file: what `airflow pools import` reads, with slots from max_active."""

from __future__ import annotations

import json
from pathlib import Path

from dpone.packing.pack import load_and_compile
from dpone_generator.pools import is_pools_document, plan_pools, pools_document


def _doc(case: str) -> dict[str, dict[str, object]]:
    _, packs, problems = load_and_compile(f"golden/{case}/workloads.yaml")
    assert not problems
    doc: dict[str, dict[str, object]] = json.loads(pools_document(plan_pools(packs)))
    return doc


def test_shared_pool_gets_the_largest_max_active_and_says_so(in_root: Path) -> None:
    pool = _doc("shared_pool")["dpone_shared"]
    assert pool["slots"] == 5
    assert "clicks_daily (max_active 3), views_weekly (max_active 5)" in str(pool["description"])
    assert "slots = the largest max_active" in str(pool["description"])


def test_one_pool_per_name_with_every_field_airflow_import_needs(in_root: Path) -> None:
    doc = _doc("multi_workload")
    assert sorted(doc) == ["dpone_backfill", "dpone_sessions"]
    for value in doc.values():
        # airflow/cli/commands/pool_command.py: a value needs "slots" and "description";
        # "include_deferred" is optional (2.10-3.3 read it with a default of False).
        assert set(value) == {"slots", "description", "include_deferred"}
        assert isinstance(value["slots"], int) and value["include_deferred"] is True
    assert doc["dpone_sessions"]["slots"] == 4


def test_internal_only_catalog_has_no_pools(in_root: Path) -> None:
    assert _doc("internal_default") == {}


def test_pools_file_recognition() -> None:
    assert is_pools_document("{}")
    assert is_pools_document('{"p": {"slots": 2, "description": "dpone: x"}}')
    assert not is_pools_document('{"p": {"slots": 2, "description": "ours"}}')
    assert not is_pools_document('{"p": {"slots": 2}}')
    assert not is_pools_document("[]")
    assert not is_pools_document("not json")
