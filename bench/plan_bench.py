"""Plan compilation benchmark: a 200-item summary plan over 1,000 chunks, compiled and validated.

One repetition is everything the generator and every pod do to get from a chunk spec to a
verified mapping plan:

  chunks    run key, 1,000 chunks with their idempotency keys, backfill_plan_hash
  mapping   the 200-item summary plan and its plan_fingerprint
  coverage  verify_coverage (every chunk exactly once, in order)
  items     every item's DPONE_AIRFLOW_MAPPING_ITEM env value (canonical JSON, <= 8 KiB)
  schema    the plan artifact validated with dpone.authoring.schema (mapping-plan.v1)

Budgets: the contract's p95 <= 10 ms per plan; ours p95 <= 1 ms on the reference machine.
The process exits 1 when the contract budget is missed (ours is reported, not enforced).

usage: python bench/plan_bench.py [--repetitions 500] [--warmup 50] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpone.authoring.schema import load_schema, validate
from dpone.plan.chunks import ChunkSpec, backfill_run_key, plan_chunks, plan_hash
from dpone.plan.mapping import MappingPolicy, plan_mapping, verify_coverage

CONTRACT_P95_MS = 10.0
OURS_P95_MS = 1.0
SPEC = ChunkSpec("event_id", "integer", 0, 1_000_000, 1_000, "value")  # 1,000 chunks
POLICY = MappingPolicy("summary", 200, 16, "dpone_events")
DATASET = "analytics.events"
STAGES = ("chunks", "mapping", "coverage", "items", "schema")


@dataclass(frozen=True)
class Sample:
    """Nanoseconds per stage of one repetition."""

    stages: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.stages)


def compile_once() -> Sample:
    clock = time.perf_counter_ns
    schema = load_schema("mapping-plan.v1.schema.json")  # cached after the first call
    t0 = clock()
    run_key = backfill_run_key(DATASET, SPEC, "append")
    chunks = plan_chunks(SPEC, run_key)
    backfill_plan_hash = plan_hash(chunks)
    t1 = clock()
    plan = plan_mapping(POLICY, len(chunks), backfill_plan_hash)
    t2 = clock()
    assert plan is not None
    verify_coverage(plan.items, len(chunks))
    t3 = clock()
    env_values = [plan.item_env_value(item) for item in plan.items]
    t4 = clock()
    violations = validate(plan.to_artifact(), schema)
    t5 = clock()
    if violations or len(env_values) != 200 or len(chunks) != 1_000:
        raise AssertionError(f"invalid plan: {violations[:3]}")
    return Sample((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4))


def percentile(values: list[int], q: float) -> float:
    """Nearest-rank percentile, in milliseconds."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[rank - 1] / 1e6


def measure(repetitions: int, warmup: int, run: Callable[[], Sample]) -> list[Sample]:
    for _ in range(warmup):
        run()
    gc.collect()
    return [run() for _ in range(repetitions)]


def report(samples: list[Sample], repetitions: int) -> dict[str, Any]:
    totals = [s.total for s in samples]
    per_stage = {
        name: round(statistics.median(s.stages[i] for s in samples) / 1e6, 3)
        for i, name in enumerate(STAGES)
    }
    p50, p95 = percentile(totals, 50), percentile(totals, 95)
    return {
        "benchmark": "plan_bench",
        "scenario": "summary plan, 1000 chunks -> 200 items, compiled and validated",
        "repetitions": repetitions,
        "p50_ms": round(p50, 3),
        "p95_ms": round(p95, 3),
        "max_ms": round(max(totals) / 1e6, 3),
        "stage_p50_ms": per_stage,
        "contract_p95_budget_ms": CONTRACT_P95_MS,
        "contract_ok": p95 <= CONTRACT_P95_MS,
        "ours_p95_budget_ms": OURS_P95_MS,
        "ours_ok": p95 <= OURS_P95_MS,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpu",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plan_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    result = report(measure(args.repetitions, args.warmup, compile_once), args.repetitions)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        stages = ", ".join(f"{k} {v:.3f}" for k, v in result["stage_p50_ms"].items())
        print(f"stage p50 (ms): {stages}")
        print(
            f"per plan: p50 {result['p50_ms']:.3f} ms, p95 {result['p95_ms']:.3f} ms, "
            f"max {result['max_ms']:.3f} ms"
        )
    verdict = (
        f"contract p95 <= {CONTRACT_P95_MS:g} ms {'PASS' if result['contract_ok'] else 'FAIL'}, "
        f"ours p95 <= {OURS_P95_MS:g} ms {'PASS' if result['ours_ok'] else 'MISS'}"
    )
    print(
        f"plan_bench: 200-item summary plan over 1000 chunks, compiled + validated: "
        f"p50 {result['p50_ms']:.2f} ms, p95 {result['p95_ms']:.2f} ms per plan "
        f"(N={args.repetitions}, CPython {result['python']}, {result['machine']}); {verdict}",
        file=sys.stderr if args.json else sys.stdout,
    )
    return 0 if result["contract_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
