"""bench/plan_bench.py --pod runs what a pod runs before its first connection, in fresh
processes: the scenario itself must keep working (its budget is the benchmark's, not a test's)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_pod_scenario_compiles_and_verifies_the_hourly_pack_in_fresh_processes() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import plan_bench
    finally:
        sys.path.remove(str(BENCH))
    result = plan_bench.measure_pods(2, "cpu")
    # measure_pods raises when a process fails or selects other than its item's 43-44 chunks
    assert result["chunks"] == 8_760 and result["repetitions"] == 2
    assert 0 < result["p50_ms"] <= result["p95_ms"] <= result["max_ms"]
    assert result["imports_p50_ms"] > 0
