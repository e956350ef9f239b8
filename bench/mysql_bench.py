"""MySQL/MariaDB data-movement benchmark: one chunk MySQL -> MySQL (two databases), the connector
vs. the server's own tools on the same rows.

Measured side by side, interleaved repetition by repetition; the figure is the median:

- ``mysqldump --no-create-info | mysql`` (the baseline: what an operator reaches for first),
- ``SELECT .. INTO OUTFILE`` + ``LOAD DATA INFILE`` (server-side files, no client in the path),
- the connector with the rows streamed through dpone (a source DSN that differs in an option, as
  for two servers): LOAD DATA LOCAL, with and without checksum,
- the same with PyMySQL's multi-row ``executemany`` forced (the alternative write path; the
  connector uses whichever is faster, and this run is the evidence),
- the connector's ``INSERT .. SELECT`` path: source in another database of the same server and
  account (what two-database runs on one server get).

    .venv/bin/python bench/mysql_bench.py [--rows 200000] [--repeat 3] [--dsn mysql://root@127.0.0.1:3306/]

Databases ``dpone_bench_my_src`` and ``dpone_bench_my_dst`` are created (and kept for reruns);
the DSN is never printed.
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
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime" / "src"))

import pymysql  # noqa: E402
from dpone.connectors import (  # noqa: E402
    ChunkWindow,
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    open_sink,
    open_source,
    table_checksum,
)
from dpone.connectors import mysql as dialect  # noqa: E402

DEFAULT_DSN = "mysql://root@127.0.0.1:3306/"
SRC_DB = "dpone_bench_my_src"
DST_DB = "dpone_bench_my_dst"
DDL = (
    "CREATE TABLE IF NOT EXISTS {} (id bigint, order_date date, customer varchar(40), "
    "amount decimal(12,2), payload varchar(80)) ENGINE=InnoDB"
)
COLUMNS = "id, order_date, customer, amount, payload"
WINDOW = ChunkWindow("order_date", "date", "2024-01-01", "2025-01-01")
OUTFILE_DIR = "/tmp"


@contextlib.contextmanager
def connect(dsn: str, **extra: Any) -> Iterator[Any]:
    conn = pymysql.connect(**dialect.parse_dsn(dsn).connect_args(), autocommit=True, **extra)
    try:
        yield conn
    finally:
        conn.close()


def db_dsn(server: str, database: str, tag: str = "") -> str:
    """A DSN on ``database``; ``tag`` gives another DSN string for the same database."""
    base = server.split("?", 1)[0].rstrip("/") + "/" + database
    return base + (f"?connect_timeout={tag}" if tag else "")


def prepare(server: str, rows: int) -> None:
    marker = f"dpone mysql_bench v1 rows={rows}"
    with connect(server) as conn, conn.cursor() as cur:
        for db in (SRC_DB, DST_DB):
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4")
        cur.execute(
            "SELECT TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = 'orders'",
            (SRC_DB,),
        )
        found = cur.fetchone()
        if not found or found[0] != marker:
            print(f"generating {rows:,} source rows ...", file=sys.stderr)
            cur.execute(f"DROP TABLE IF EXISTS `{SRC_DB}`.orders")
            cur.execute(DDL.format(f"`{SRC_DB}`.orders"))
            cur.execute(f"USE `{SRC_DB}`")  # MariaDB's seq_1_to_N sequence engine needs one
            cur.execute(
                f"INSERT INTO `{SRC_DB}`.orders SELECT seq, '2024-01-01' + INTERVAL (seq % 366) "
                "DAY, concat('customer_', seq % 5000), round(rand(seq) * 10000, 2), "
                f"concat(md5(seq), '-payload') FROM seq_1_to_{rows}"
            )
            cur.execute(f"ALTER TABLE `{SRC_DB}`.orders COMMENT = %s", (marker,))
        cur.execute(f"DROP TABLE IF EXISTS `{DST_DB}`.orders")
        cur.execute(DDL.format(f"`{DST_DB}`.orders"))


def truncate(server: str, database: str, table: str) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        cur.execute(f"TRUNCATE TABLE `{database}`.`{table}`")


def _cli_args(server: str) -> list[str]:
    parsed = dialect.parse_dsn(server)
    args = [f"--host={parsed.host}", f"--port={parsed.port}", f"--user={parsed.user or 'root'}"]
    return args


def dump_pipe(server: str) -> int:
    where = f"order_date >= '{WINDOW.lower}' AND order_date < '{WINDOW.upper}'"
    env = dict(os.environ)
    password = dialect.parse_dsn(server).password
    if password:
        env["MYSQL_PWD"] = password
    dump = subprocess.Popen(
        [
            "mysqldump",
            *_cli_args(server),
            "--no-create-info",
            "--skip-triggers",
            "--single-transaction",
            f"--where={where}",
            SRC_DB,
            "orders",
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    subprocess.run(["mysql", *_cli_args(server), DST_DB], stdin=dump.stdout, check=True, env=env)
    assert dump.stdout is not None
    dump.stdout.close()
    if dump.wait() != 0:
        raise SystemExit("mysqldump failed")
    return count(server, DST_DB, "orders")


def outfile_load(server: str) -> int:
    path = f"{OUTFILE_DIR}/dpone_mysql_bench_{os.getpid()}.tsv"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    try:
        with connect(server) as conn, conn.cursor() as cur:
            cur.execute(
                f"SELECT {COLUMNS} INTO OUTFILE %s FROM `{SRC_DB}`.orders "
                "WHERE order_date >= %s AND order_date < %s",
                (path, WINDOW.lower, WINDOW.upper),
            )
            cur.execute(f"LOAD DATA INFILE %s INTO TABLE `{DST_DB}`.orders ({COLUMNS})", (path,))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return count(server, DST_DB, "orders")


def count(server: str, database: str, table: str) -> int:
    with connect(server) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM `{database}`.`{table}`")
        return int(cur.fetchone()[0])


def connector(
    src: str, dst: str, table: str, checksum: bool, gate: bool = False
) -> tuple[int, str | None, str]:
    """One chunk; ``checksum``: the sink's read-back checksum; ``gate``: the default read-back
    gate besides (the source's checksum of the chunk, compared)."""
    options = SinkOptions(checksum=checksum, read_back="checksum" if gate else "off")
    source = open_source(SourceSpec("bench_src", TableRef(SRC_DB, "orders")), src)
    sink = open_sink(SinkSpec("bench_dst", TableRef(None, table), "replace"), dst, options)
    with source, sink:
        result = sink.write_chunk(source, WINDOW)
    return result.rows, result.checksum, result.method


def executemany_connector(src: str, dst: str) -> tuple[int, str | None, str]:
    """The connector with every batch sent through executemany (LOAD DATA switched off)."""
    original = dialect.tsv_field

    def refuse(value: object) -> str:
        raise dialect.BinaryValue

    dialect.tsv_field = refuse  # type: ignore[assignment]
    try:
        rows, checksum, method = connector(src, dst, "orders", checksum=False)
    finally:
        dialect.tsv_field = original  # type: ignore[assignment]
    return rows, checksum, f"{method} (executemany batches)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = args.dsn or os.environ.get("DPONE_TEST_MYSQL_DSN") or DEFAULT_DSN
    prepare(server, args.rows)
    src = db_dsn(server, SRC_DB)
    dst = db_dsn(server, DST_DB)
    streamed = db_dsn(server, SRC_DB, tag="31")  # another DSN string: rows go through dpone
    expected = table_checksum(
        src, TableRef(None, "orders"), WINDOW.column, WINDOW.lower, WINDOW.upper
    )
    methods: dict[str, tuple[str, str, Callable[[], object]]] = {
        "mysqldump | mysql (baseline)": (DST_DB, "orders", lambda: dump_pipe(server)),
        "SELECT INTO OUTFILE + LOAD DATA INFILE": (DST_DB, "orders", lambda: outfile_load(server)),
        "connector streamed, LOAD DATA LOCAL, no checksum": (
            DST_DB,
            "orders",
            lambda: connector(streamed, dst, "orders", checksum=False),
        ),
        "connector streamed, LOAD DATA LOCAL, with checksum": (
            DST_DB,
            "orders",
            lambda: connector(streamed, dst, "orders", checksum=True),
        ),
        "connector streamed, LOAD DATA LOCAL, default gate": (
            DST_DB,
            "orders",
            lambda: connector(streamed, dst, "orders", checksum=True, gate=True),
        ),
        "connector streamed, executemany (forced), no checksum": (
            DST_DB,
            "orders",
            lambda: executemany_connector(streamed, dst),
        ),
        "connector INSERT..SELECT, same server, no checksum": (
            DST_DB,
            "orders",
            lambda: connector(src, dst, "orders", checksum=False),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    for rep in range(args.repeat):
        for name, (database, table, run) in methods.items():
            truncate(server, database, table)
            started = time.perf_counter()
            outcome = run()
            times[name].append(time.perf_counter() - started)
            if isinstance(outcome, tuple):
                rows, checksum, method = outcome
                if rows != args.rows or checksum not in (None, expected):
                    raise SystemExit(f"{name}: wrong result {rows} rows, {checksum}")
                if rep == 0:
                    print(f"  {name}: path {method}", file=sys.stderr)
            elif outcome != args.rows:
                raise SystemExit(f"{name}: copied {outcome} rows")
    with connect(server) as conn, conn.cursor() as cur:
        cur.execute("SELECT version()")
        version = cur.fetchone()[0]
    baseline = statistics.median(times["mysqldump | mysql (baseline)"])
    print(
        f"\nmysql_bench: {args.rows:,} rows in one chunk, median of {args.repeat}; server "
        f"{version}, PyMySQL {metadata.version('PyMySQL')}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    print(f"{'method':<50} {'seconds':>8} {'rows/s':>10} {'vs dump':>8}")
    report = []
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<50} {median:>8.3f} {args.rows / median:>10,.0f} {baseline / median:>8.2f}")
        report.append(
            {
                "method": name,
                "seconds": round(median, 3),
                "rows_per_s": round(args.rows / median),
                "vs_dump": round(baseline / median, 3),
                "all_seconds": [round(v, 3) for v in values],
            }
        )
    print(f"checksum of the moved chunk: {expected}")
    if args.json:
        print(json.dumps({"rows": args.rows, "repeat": args.repeat, "results": report}, indent=2))


if __name__ == "__main__":
    main()
