"""Data-movement benchmark: one chunk of 1M rows Postgres -> Postgres, connector vs. a psql pipe.

Measured side by side in one run, interleaved repetition by repetition so machine noise hits every
method alike; the figure reported is the median of the repetitions:

- ``psql COPY TO STDOUT | psql COPY FROM STDIN`` between two psql processes (text, the baseline;
  binary too, for reference),
- the connector's COPY path between two databases (``dpone_bench`` is created if absent) without
  the read-back pass, and with it at each level of the read-back gate (``off``: read back, not
  compared; ``count``; ``checksum``, the default: the source's checksum beside the write),
- the connector's same-database ``INSERT .. SELECT`` path, the same four ways.

Every connector run is a fresh source/sink (so connecting is timed, as it is for psql) writing one
``replace`` chunk that holds every row into an empty, index-free target. The goals: >= 70% of the
text pipe's rows/s for the COPY path without read-back, >= 80% with the default gate. Each method's
``cpu all`` is the busy CPU seconds of the whole machine during it (servers, psql, dpone); the
default gate's CPU over the cores is the best its wall time could be here.

    .venv/bin/python bench/data_bench.py [--rows 1000000] [--repeat 3] [--dsn DSN] [--json]

DSN: --dsn, else DPONE_TEST_POSTGRES_DSN, else postgresql://postgres@127.0.0.1:5432/test (the
source database; the target is database dpone_bench on the same server). It is never printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime" / "src"))

import psycopg  # noqa: E402
from campaign_floors import machine_busy_s  # noqa: E402
from dpone.connectors import (  # noqa: E402
    ChunkWindow,
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    open_sink,
    open_source,
    pair_checksums,
)
from psycopg import sql  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DB = "dpone_bench"
SCHEMA = "dpone_bench"
COLUMNS = "id, order_date, customer, amount, payload"
DDL = (
    "CREATE TABLE {} (id bigint, order_date date, customer text, amount numeric(12,2),"
    " payload text)"
)
WINDOW = ChunkWindow("order_date", "date", "2024-01-01", "2025-01-01")
GOAL = 0.70
GATE_GOAL = 0.80  # with the default read-back gate (read_back: checksum)


def database_dsn(dsn: str, dbname: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + dbname))


def prepare(src_dsn: str, dst_dsn: str, rows: int) -> None:
    """Source table with ``rows`` rows (kept between runs when unchanged) and empty targets."""
    marker = f"dpone data_bench v1 rows={rows}"
    with psycopg.connect(src_dsn, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (BENCH_DB,)
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        found = conn.execute(
            "SELECT obj_description(to_regclass(%s), 'pg_class')", (f"{SCHEMA}.orders",)
        ).fetchone()
        if not found or found[0] != marker:
            print(f"generating {rows:,} source rows ...", file=sys.stderr)
            table = sql.Identifier(SCHEMA, "orders")
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
            conn.execute(sql.SQL(DDL).format(table))  # type: ignore[arg-type]
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} SELECT g, date '2024-01-01' + (g %% 366),"
                    " 'customer_' || (g %% 5000), round((random() * 10000)::numeric, 2),"
                    " md5(g::text) || '-payload' FROM generate_series(1, %s) AS g"
                ).format(table),
                (rows,),
            )
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
            conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(table, sql.Literal(marker)))
        same_db = sql.Identifier(SCHEMA, "orders_copy")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(same_db))
        conn.execute(sql.SQL(DDL).format(same_db))  # type: ignore[arg-type]
    with psycopg.connect(dst_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        target = sql.Identifier(SCHEMA, "orders")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target))
        conn.execute(sql.SQL(DDL).format(target))  # type: ignore[arg-type]


def truncate(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(SCHEMA, table)))
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")  # so no run pays for another's WAL


def psql_pipe(src_dsn: str, dst_dsn: str, binary: bool) -> int:
    fmt = " (FORMAT binary)" if binary else ""
    out = (
        f"COPY (SELECT {COLUMNS} FROM {SCHEMA}.orders WHERE order_date >= '{WINDOW.lower}'"
        f" AND order_date < '{WINDOW.upper}') TO STDOUT{fmt}"
    )
    into = f"COPY {SCHEMA}.orders ({COLUMNS}) FROM STDIN{fmt}"
    reader = subprocess.Popen(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", src_dsn, "-c", out],
        stdout=subprocess.PIPE,
    )
    writer = subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", dst_dsn, "-c", into],
        stdin=reader.stdout,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    assert reader.stdout is not None
    reader.stdout.close()
    if reader.wait() != 0:
        raise SystemExit("psql COPY TO failed")
    return int(writer.stdout.split()[-1]) if writer.stdout.strip() else -1


def connector(
    src_dsn: str, dst_dsn: str, table: str, level: str | None, block: int
) -> tuple[int, str | None, str]:
    """One chunk; ``level`` is the read-back gate's (None: no read-back pass at all)."""
    source = open_source(SourceSpec("bench_src", TableRef(SCHEMA, "orders")), src_dsn)
    options = (
        SinkOptions(checksum=False, read_back="off", copy_block_bytes=block)
        if level is None
        else SinkOptions(read_back=level, copy_block_bytes=block)  # type: ignore[arg-type]
    )
    sink = open_sink(SinkSpec("bench_dst", TableRef(SCHEMA, table), "replace"), dst_dsn, options)
    with source, sink:
        result = sink.write_chunk(source, WINDOW)
    return result.rows, result.checksum, result.method


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--block-mib", type=float, default=4.0, help="COPY block size (MiB)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    block = max(1, int(args.block_mib * (1 << 20)))
    src_dsn = args.dsn or os.environ.get("DPONE_TEST_POSTGRES_DSN") or DEFAULT_DSN
    dst_dsn = database_dsn(src_dsn, BENCH_DB)
    prepare(src_dsn, dst_dsn, args.rows)
    source = (src_dsn, TableRef(SCHEMA, "orders"))
    expected = pair_checksums(source, source, WINDOW.column, WINDOW.lower, WINDOW.upper)[0]

    methods: dict[str, tuple[str, Callable[[], object]]] = {
        "psql pipe, text (baseline)": (
            "orders",
            lambda: psql_pipe(src_dsn, dst_dsn, binary=False),
        ),
        "psql pipe, binary": ("orders", lambda: psql_pipe(src_dsn, dst_dsn, binary=True)),
        "connector COPY, 2 databases, no read-back": (
            "orders",
            lambda: connector(src_dsn, dst_dsn, "orders", None, block),
        ),
        "connector COPY, 2 databases, read_back off": (
            "orders",
            lambda: connector(src_dsn, dst_dsn, "orders", "off", block),
        ),
        "connector COPY, 2 databases, read_back count": (
            "orders",
            lambda: connector(src_dsn, dst_dsn, "orders", "count", block),
        ),
        "connector COPY, 2 databases, read_back checksum": (
            "orders",
            lambda: connector(src_dsn, dst_dsn, "orders", "checksum", block),
        ),
        "connector INSERT..SELECT, same database, no read-back": (
            "orders_copy",
            lambda: connector(src_dsn, src_dsn, "orders_copy", None, block),
        ),
        "connector INSERT..SELECT, same database, read_back off": (
            "orders_copy",
            lambda: connector(src_dsn, src_dsn, "orders_copy", "off", block),
        ),
        "connector INSERT..SELECT, same database, read_back count": (
            "orders_copy",
            lambda: connector(src_dsn, src_dsn, "orders_copy", "count", block),
        ),
        "connector INSERT..SELECT, same database, read_back checksum": (
            "orders_copy",
            lambda: connector(src_dsn, src_dsn, "orders_copy", "checksum", block),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    for rep in range(args.repeat):
        for name, (table, run) in methods.items():
            truncate(src_dsn if table == "orders_copy" else dst_dsn, table)
            busy = machine_busy_s()
            started = time.perf_counter()
            outcome = run()
            times[name].append(time.perf_counter() - started)
            cpu[name].append(machine_busy_s() - busy)
            if isinstance(outcome, tuple):
                rows, checksum, method = outcome
                if rows != args.rows or checksum not in (None, expected):
                    raise SystemExit(f"{name}: wrong result {rows} rows, {checksum}")
                if rep == 0:
                    print(f"  {name}: path {method}", file=sys.stderr)
            elif outcome != args.rows:
                raise SystemExit(f"{name}: psql copied {outcome} rows")

    with psycopg.connect(src_dsn) as conn:
        server = conn.execute("SHOW server_version").fetchone()
    baseline = statistics.median(times["psql pipe, text (baseline)"])
    print(
        f"\ndata_bench: {args.rows:,} rows in one chunk, median of {args.repeat}; Postgres "
        f"{server[0] if server else '?'}, psycopg {psycopg.__version__}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, COPY blocks {args.block_mib:g} MiB"
    )
    print(f"{'method':<62} {'seconds':>8} {'rows/s':>12} {'vs pipe':>8} {'cpu all':>8}")
    report = []
    for name, values in times.items():
        median = statistics.median(values)
        ratio = baseline / median
        busy = statistics.median(cpu[name])
        print(f"{name:<62} {median:>8.3f} {args.rows / median:>12,.0f} {ratio:>8.2f} {busy:>8.2f}")
        report.append(
            {
                "method": name,
                "seconds": round(median, 3),
                "rows_per_s": round(args.rows / median),
                "vs_pipe": round(ratio, 3),
                "machine_cpu_s": round(busy, 3),
                "all_seconds": [round(v, 3) for v in values],
            }
        )
    copy_ratio = baseline / statistics.median(times["connector COPY, 2 databases, no read-back"])
    verdict = "PASS" if copy_ratio >= GOAL else "BELOW GOAL"
    print(f"\nCOPY path vs psql text pipe: {copy_ratio:.2f} (goal >= {GOAL:.2f}): {verdict}")
    gated = baseline / statistics.median(times["connector COPY, 2 databases, read_back checksum"])
    verdict = "PASS" if gated >= GATE_GOAL else "BELOW GOAL"
    print(
        f"COPY path with the default gate vs psql text pipe: {gated:.2f} "
        f"(goal >= {GATE_GOAL:.2f}): {verdict}"
    )
    cores = os.cpu_count() or 1
    floor = statistics.median(cpu["connector COPY, 2 databases, read_back checksum"]) / cores
    print(
        f"the default gate's CPU floor: its machine CPU seconds over {cores} cores, "
        f"{floor:.3f} s = {baseline / floor:.2f}x the pipe at best"
    )
    print(f"checksum of the moved chunk: {expected}")
    if args.json:
        print(json.dumps({"rows": args.rows, "repeat": args.repeat, "results": report}, indent=2))


if __name__ == "__main__":
    main()
