"""Ledger throughput: dpone's Postgres ledger against a plain FOR UPDATE SKIP LOCKED queue, one run.

N worker processes (spawn) move M no-op chunks through lease + complete, in three shapes:

- owned: worker k owns a contiguous range (how mapped items run: disjoint ranges);
- contended: workers run in pairs over the same range in the same order (a duplicate attempt of a
  mapped item racing the original); a busy or committed chunk is skipped;
- racing: every worker walks all chunks in its own random order, skipping busy or committed ones
  (a work-queue pattern the ledger is not built for; shown for honesty, no goal).

The baseline claims from the same ranges (contended: the pair's range; racing: the whole table).

The baseline is the usual job-queue loop on the same server: claim the next pending (or expired)
row with ``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1)``, commit, then a
fenced completion ``UPDATE ... WHERE owner = %s AND attempt = %s``, commit.

    .venv/bin/python bench/ledger_bench.py [--dsn DSN] [--workers 8] [--chunks 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

DEFAULT_DSN = os.environ.get("DPONE_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
RUN_KEY = "bench-run"


@dataclass(frozen=True)
class WorkerReport:
    committed: int
    attempts: int
    latencies_ms: list[float]
    started: float
    finished: float


def _shape(chunk_count: int) -> Any:
    from dpone.ledger.port import CampaignShape
    from dpone.plan.chunks import ChunkSpec, plan_chunks, plan_hash

    chunks = plan_chunks(ChunkSpec("id", "integer", 0, chunk_count, 1, "value"), RUN_KEY)
    return CampaignShape(RUN_KEY, "bench", "bench", plan_hash(chunks), "sha256:" + "0" * 64, chunks)


SHAPES = ("owned", "contended", "racing")


def _range(worker: int, workers: int, chunk_count: int, shape: str) -> tuple[int, int]:
    """Zero-based half-open range of chunk positions a worker walks (or claims from)."""
    if shape == "racing":
        return 0, chunk_count
    groups = workers if shape == "owned" else max(1, workers // 2)
    group = worker if shape == "owned" else worker // 2
    size = -(-chunk_count // groups)
    return group * size, min(chunk_count, (group + 1) * size)


def _order(worker: int, workers: int, chunk_count: int, shape: str) -> list[int]:
    low, high = _range(worker, workers, chunk_count, shape)
    order = list(range(low, high))
    if shape == "racing":
        random.Random(worker).shuffle(order)
    return order


def ledger_worker(
    dsn: str, schema: str, worker: int, workers: int, chunk_count: int, shape_name: str, start: Any
) -> WorkerReport:
    from dpone.ledger.port import ChunkResult, LeaseStatus
    from dpone.ledger.postgres import PostgresLedger

    shape = _shape(chunk_count)
    owner = f"w{worker}-{uuid.uuid4().hex[:8]}"
    store = PostgresLedger(dsn, schema=schema, lease_seconds=60)
    latencies: list[float] = []
    attempts = 0
    start.wait()
    began = time.perf_counter()
    for position in _order(worker, workers, chunk_count, shape_name):
        chunk = shape.chunks[position]
        t0 = time.perf_counter()
        outcome = store.acquire_lease(shape, chunk, owner, 60)
        attempts += 1
        if outcome.status is not LeaseStatus.ACQUIRED:
            continue
        assert outcome.lease is not None
        store.complete(outcome.lease, chunk, ChunkResult(committed=True, rows=0))
        latencies.append((time.perf_counter() - t0) * 1000)
    finished = time.perf_counter()
    store.close()
    return WorkerReport(len(latencies), attempts, latencies, began, finished)


def queue_worker(
    dsn: str, schema: str, worker: int, workers: int, chunk_count: int, shape_name: str, start: Any
) -> WorkerReport:
    import psycopg

    owner = f"w{worker}-{uuid.uuid4().hex[:8]}"
    first, end = _range(worker, workers, chunk_count, shape_name)
    low, high = first + 1, end
    claim = (
        f"UPDATE \"{schema}\".queue SET state = 'running', owner = %s, attempt = attempt + 1, "
        "lease_expires_at = clock_timestamp() + interval '60 seconds' "
        f'WHERE id = (SELECT id FROM "{schema}".queue WHERE id BETWEEN %s AND %s AND '
        "(state = 'pending' OR (state = 'running' AND lease_expires_at < clock_timestamp())) "
        "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, attempt"
    )
    finish = (
        f"UPDATE \"{schema}\".queue SET state = 'committed', lease_expires_at = NULL, rows_moved = 0 "
        "WHERE id = %s AND owner = %s AND attempt = %s AND state = 'running'"
    )
    latencies: list[float] = []
    attempts = 0
    with psycopg.connect(dsn, autocommit=False) as conn:
        start.wait()
        began = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            with conn.transaction():
                row = conn.execute(claim, (owner, low, high)).fetchone()
            attempts += 1
            if row is None:
                break
            with conn.transaction():
                done = conn.execute(finish, (row[0], owner, row[1]))
                if done.rowcount != 1:
                    raise RuntimeError(f"baseline lost chunk {row[0]}")
            latencies.append((time.perf_counter() - t0) * 1000)
        finished = time.perf_counter()
    return WorkerReport(len(latencies), attempts, latencies, began, finished)


def _setup(dsn: str, schema: str, chunk_count: int) -> None:
    import psycopg
    from dpone.ledger.postgres import PostgresLedger

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    with PostgresLedger(dsn, schema=schema) as store:
        store.initialize(_shape(chunk_count), "bench-setup", 10)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{schema}".queue (id integer PRIMARY KEY, state text NOT NULL, '
            "owner text, attempt integer NOT NULL DEFAULT 0, lease_expires_at timestamptz, "
            "rows_moved bigint)"
        )
        conn.execute(
            f'INSERT INTO "{schema}".queue (id, state) '
            "SELECT g, 'pending' FROM generate_series(1, %s) AS g",
            (chunk_count,),
        )
        conn.execute(f'VACUUM ANALYZE "{schema}".queue')


def _verify(dsn: str, schema: str, chunk_count: int, kind: str) -> None:
    import psycopg

    with psycopg.connect(dsn) as conn:
        if kind == "ledger":
            row = conn.execute(
                f'SELECT count(*), count(DISTINCT chunk_index) FROM "{schema}".chunk_transition '
                "WHERE state = 'committed'"
            ).fetchone()
        else:
            row = conn.execute(
                f"SELECT count(*), count(DISTINCT id) FROM \"{schema}\".queue WHERE state = 'committed'"
            ).fetchone()
    assert row is not None
    if row[0] != chunk_count or row[1] != chunk_count:
        raise SystemExit(
            f"{kind}: {row[0]} commits of {row[1]} distinct chunks, want {chunk_count}"
        )


def run_variant(
    dsn: str, kind: str, shape_name: str, workers: int, chunk_count: int
) -> dict[str, Any]:
    schema = f"dpone_bench_{os.getpid()}"
    _setup(dsn, schema, chunk_count)
    context = mp.get_context("spawn")
    start = context.Manager().Event()
    target = ledger_worker if kind == "ledger" else queue_worker
    with context.Pool(workers) as pool:
        pending = [
            pool.apply_async(target, (dsn, schema, k, workers, chunk_count, shape_name, start))
            for k in range(workers)
        ]
        time.sleep(2.0)  # every worker connected and waiting
        start.set()
        reports: list[WorkerReport] = [p.get(timeout=600) for p in pending]
    _verify(dsn, schema, chunk_count, kind)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    wall = max(r.finished for r in reports) - min(r.started for r in reports)
    latencies = sorted(x for r in reports for x in r.latencies_ms)
    committed = sum(r.committed for r in reports)
    return {
        "kind": kind,
        "shape": shape_name,
        "committed": committed,
        "attempts": sum(r.attempts for r in reports),
        "chunks_per_s": committed / wall,
        "p50_ms": statistics.median(latencies),
        "p95_ms": latencies[int(0.95 * (len(latencies) - 1))],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=2000)
    args = parser.parse_args(argv)
    results = {}
    for shape_name in SHAPES:
        for kind in ("queue", "ledger"):
            results[(kind, shape_name)] = run_variant(
                args.dsn, kind, shape_name, args.workers, args.chunks
            )
    print(f"{args.workers} processes, {args.chunks} no-op chunks, lease + complete per chunk\n")
    header = (
        f"{'shape':<10} {'store':<28} {'chunks/s':>9} {'p50 ms':>7} {'p95 ms':>7} {'claims':>6}"
    )
    print(header)
    print("-" * len(header))
    for shape_name in SHAPES:
        for kind, label in (
            ("queue", "SKIP LOCKED queue (baseline)"),
            ("ledger", "dpone PostgresLedger"),
        ):
            r = results[(kind, shape_name)]
            print(
                f"{r['shape']:<10} {label:<28} {r['chunks_per_s']:>9.0f} {r['p50_ms']:>7.2f} "
                f"{r['p95_ms']:>7.2f} {r['attempts']:>6}"
            )
    print()
    worst = 0.0
    for shape_name in SHAPES:
        ratio = (
            results[("queue", shape_name)]["chunks_per_s"]
            / results[("ledger", shape_name)]["chunks_per_s"]
        )
        goal = "goal <= 2x" if shape_name != "racing" else "no goal"
        if shape_name != "racing":
            worst = max(worst, ratio)
        print(f"{shape_name}: baseline / ledger throughput = {ratio:.2f}x ({goal})")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
