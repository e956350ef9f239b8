"""Typed helpers shared by the unit tests: repository paths, tiny projects, plans and items."""

from __future__ import annotations

import hashlib
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.errors import ErrorRecord
from dpone.packing.pack import ProcessPlan, WorkloadPack, load_and_compile
from dpone.plan.mapping import MappingPlan, MappingPolicy, plan_mapping

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden"
GOLDEN_CATALOGS: tuple[Path, ...] = tuple(sorted(GOLDEN.glob("*/workloads.yaml")))
GOLDEN_IDS: tuple[str, ...] = tuple(path.parent.name for path in GOLDEN_CATALOGS)
FAKE_HASH = "sha256:" + "ab" * 32


def independent_fingerprint(value: Any) -> str:
    """The contract's canonical-JSON sha256, recomputed here without dpone's code."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def write_project(root: Path, catalog: str, manifests: dict[str, str]) -> Path:
    """Write ``workloads.yaml`` plus manifests under ``root``; returns the catalog path."""
    for name, text in manifests.items():
        write(root / name, text)
    return write(root / "workloads.yaml", catalog)


# A mapped-ready manifest: 10 daily chunks, audit_schema state with a distributed lock.
# Line numbers matter to the tests that pin file:line:column; keep this text stable.
BACKFILL_MANIFEST = """
schema: dpone.pipeline.v1
name: orders
processes:
  - name: orders
    source: {connection: wh, table: {schema: raw, name: orders}}
    sink:
      connection: wh
      table: {schema: analytics, name: orders}
      keys: [order_id]
      strategy: {mode: backfill}
    backfill:
      chunk: {column: order_date, type: date, start: 2024-01-01, end: 2024-01-11}
      inner_mode: replace
      parallel_workers: 1
    state: {backend: audit_schema, connection: wh, require_distributed_lock: true}
"""


def backfill_manifest(**replacements: str) -> str:
    """BACKFILL_MANIFEST with whole lines swapped: ``{"inner_mode: replace": "inner_mode: merge"}``."""
    text = BACKFILL_MANIFEST
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def catalog_with(mapping: str | None = None, *, extra_airflow: str = "") -> str:
    """A one-workload catalog (``orders``, manifest ``orders.yaml``) with an optional mapping."""
    lines = [
        "schema: dpone.workload-catalog.v1",
        "workloads:",
        "  orders:",
        "    manifest: orders.yaml",
    ]
    airflow: list[str] = []
    if mapping is not None:
        airflow.append(f"      mapping: {mapping}")
    if extra_airflow:
        airflow.extend(textwrap.dedent(extra_airflow).strip("\n").splitlines())
    if airflow:
        lines.append("    airflow:")
        lines.extend(line if line.startswith("      ") else "      " + line for line in airflow)
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Compiled:
    packs: list[WorkloadPack]
    problems: list[ErrorRecord]

    @property
    def codes(self) -> list[str]:
        return [problem.code for problem in self.problems]

    def only_plan(self) -> ProcessPlan:
        assert not self.problems, self.problems
        assert len(self.packs) == 1 and len(self.packs[0].processes) == 1
        return self.packs[0].processes[0]


def compile_project(root: Path, catalog: str, manifests: dict[str, str]) -> Compiled:
    path = write_project(root, catalog, manifests)
    _, packs, problems = load_and_compile(str(path))
    return Compiled(packs, problems)


def golden_packs(catalog: Path) -> list[WorkloadPack]:
    _, packs, problems = load_and_compile(str(catalog))
    assert not problems, problems
    return packs


def summary_plan(chunks_total: int, max_items: int, *, mode: str = "summary") -> MappingPlan:
    policy = MappingPolicy(mode, max_items, min(16, max_items), "dpone_backfill")
    plan = plan_mapping(policy, chunks_total, FAKE_HASH)
    assert plan is not None
    return plan
