"""Floors of the campaign benchmark: what no client of this design can beat on this machine.

campaign_bench.py compares dpone with the psql pipe. Where a goal is missed, these runs show
what bounds it, measured in the same run:

  target work   the target's own work per chunk and nothing else: the chunk's rows, read from the
                source once before the clock starts, are written by plain psycopg connections, one
                transaction per chunk (DELETE of the range, binary COPY, dpone's checksum query,
                COMMIT), no source, no ledger, no dpone. With one connection it bounds an internal
                run with one worker; with four, one with four workers.
  pipelined     the one-connection target work while another process reads every chunk from the
                source at the same time (binary COPY TO, discarded): a one-worker run whose source
                reads were perfectly hidden behind its writes, still without a ledger, sharing
                the machine's cores as such a run would. Over 4 connections it bounds a 4-worker
                run: any client that relays the rows makes the source send them and receives
                them (here the reader) and sends them to the target (here the writers, from
                memory); the relay adds its own work on top, the ledger more.
  with ledger   the pipelined floor with the ledger's work that must sit inside each chunk's
                transaction in the one-database placement: dpone's compare-and-set and its
                completion record (SqlLedger.complete_in_transaction around the same DELETE,
                COPY and checksum). The leases are taken before the clock starts: a pipelined
                worker could take them on another connection. It bounds a one-worker run of any
                design that keeps the ledger's protocol; over 4 connections (4 forked processes,
                each with its own ledger connection), a 4-worker one.
  leasing       the one-connection floor with the ledger, with the leases inside the clock: a
                forked process takes every chunk's lease (one committed transaction each, as
                dpone's acquire_lease) as fast as it can from the start, the writer waiting only
                for the lease of the chunk it is about to write. The fence needs each chunk's
                lease committed before its data; no one-worker design hides the leases better
                than an unbounded lease-ahead on another core. campaign_bench.py adds to it, and
                to the 4-process floor with the ledger, the process's start (python + ``import
                psycopg``, measured in the same run): every ``dpone run`` is a process.
  relay         not a floor but an estimate, run beside dpone's runs by campaign_bench.py: the
                campaign moved with no dpone code (campaign_relay.py), each chunk relayed from the
                source's binary COPY TO into the target's COPY FROM by the cheapest loop psycopg
                allows, one transaction each. With 4 forked processes (no shared interpreter
                lock), beside the 4-worker run; as 40 fresh interpreters, 8 at a time, each
                relaying its item's contiguous chunks, beside the summary (every item is a process
                that starts Python and imports psycopg); in one process inside dpone's
                complete_in_transaction while a thread reads the next chunk whole, leases taken
                before the clock, beside the 1-worker run. A better relay may exist, so these
                bound nothing; they show what is left for dpone's own code to lose or win.
  machine CPU   busy CPU seconds of the whole machine (/proc/stat) during a run, beside the CPU of
                the dpone processes themselves: on 2 cores a run cannot end before half of it.
                The summary's floors add 40 x ``import psycopg`` (every item is a process) to the
                machine CPU of the 4-connection target work, or of the 4-process work with the
                ledger (which also reads the source), spread over every core.
  installed     a no-op item re-run from the runtime wheel installed (bytecode compiled) in a fresh
                venv, beside ``python -c 'import psycopg'`` of that venv: what a pod runs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from campaign_relay import relay, write_day
from dpone.connectors.postgres import checksum_select, raw_copy_blocks
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
DAYS = 365
FIRST_DAY = dt.date(2023, 1, 1)
CHECKSUM_COLUMNS = (
    ("amount", 1700),
    ("customer", 25),
    ("id", 20),
    ("order_date", 1082),
    ("payload", 25),
)
#: the bench table's NOT NULL columns (the joined text's short form); both sides are Postgres,
#: so the gate compares in the chained form (ADR 0027), as the floors and estimates do
NOT_NULL = ("amount", "customer", "id", "order_date")


def machine_busy_s() -> float:
    """Busy CPU seconds of every core since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _days() -> list[tuple[dt.date, dt.date]]:
    return [(FIRST_DAY + dt.timedelta(d), FIRST_DAY + dt.timedelta(d + 1)) for d in range(DAYS)]


def _iso_days() -> list[tuple[str, str]]:
    return [(lower.isoformat(), upper.isoformat()) for lower, upper in _days()]


def relay_statements(table: str, columns: str) -> dict[str, str]:
    """The relay's SQL as plain text (a floor item is a script that imports no dpone)."""
    rows = f"SELECT {columns} FROM {table} WHERE order_date >= %s AND order_date < %s"
    return {
        "copy_out": f"COPY ({rows}) TO STDOUT (FORMAT BINARY)",
        "copy_in": f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)",
        "delete": f"DELETE FROM {table} WHERE order_date >= %s AND order_date < %s",
        "checksum": checksum_select(
            sql.SQL(f"({rows}) AS s"), CHECKSUM_COLUMNS, NOT_NULL, chained=True
        ).as_string(None),
    }


def read_chunks(src: str, table: str, columns: str) -> list[bytes]:
    """Every daily chunk of the source as binary COPY data (read before any clock starts)."""
    out: list[bytes] = []
    statement = (
        f"COPY (SELECT {columns} FROM {table} WHERE order_date >= %s AND order_date < %s)"
        " TO STDOUT (FORMAT BINARY)"
    )
    with psycopg.connect(src, autocommit=True) as conn:
        for lower, upper in _days():
            with conn.cursor() as cur, cur.copy(statement, (lower, upper)):
                out.append(b"".join(bytes(block) for block in raw_copy_blocks(conn, 1 << 30)))
    return out


def target_work(dst: str, table: str, columns: str, chunks: list[bytes], connections: int) -> float:
    """Seconds to write every chunk as one transaction each over ``connections`` connections."""
    days = _days()
    checksum = checksum_select(
        sql.SQL(f"(SELECT {columns} FROM {table} WHERE order_date >= %s AND order_date < %s) AS s"),
        CHECKSUM_COLUMNS,
        NOT_NULL,
        chained=True,
    )
    failures: list[BaseException] = []

    def work(indexes: range) -> None:
        try:
            with psycopg.connect(dst) as conn:
                for i in indexes:
                    lower, upper = days[i]
                    with conn.transaction(), conn.cursor() as cur:
                        cur.execute(
                            f"DELETE FROM {table} WHERE order_date >= %s AND order_date < %s",
                            (lower, upper),
                        )
                        with cur.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as cp:
                            cp.write(chunks[i])
                        cur.execute(checksum, (lower, upper))
                        cur.fetchone()
        except BaseException as exc:  # reported by the caller, after every thread ended
            failures.append(exc)

    threads = [
        threading.Thread(target=work, args=(range(k, DAYS, connections),))
        for k in range(connections)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"target-work floor failed: {type(failures[0]).__name__}")
    return time.perf_counter() - started


def _read_and_discard(src: str, table: str, columns: str) -> None:
    read_chunks(src, table, columns)


def target_work_while_reading(
    src: str, dst: str, table: str, columns: str, chunks: list[bytes], connections: int = 1
) -> float:
    """Seconds until both the target work over ``connections`` connections and a full read of
    the source by another process (started together) have ended."""
    reader = multiprocessing.get_context("fork").Process(
        target=_read_and_discard, args=(src, table, columns)
    )
    started = time.perf_counter()
    reader.start()
    target_work(dst, table, columns, chunks, connections)
    reader.join()
    elapsed = time.perf_counter() - started
    if reader.exitcode != 0:
        raise SystemExit(f"pipelined floor: the source reader failed (exit {reader.exitcode})")
    return elapsed


FLOOR_LEDGER = "bench_floor_audit"


FLOOR_OWNER = "bench-floor"


def _floor_shape() -> Any:
    """The floors' campaign: the 365 daily chunks of 2023."""
    from dpone.ledger.port import CampaignShape
    from dpone.plan.chunks import ChunkSpec, plan_chunks_hashed

    run_key = "bf-bench-floor"
    spec = ChunkSpec("order_date", "date", FIRST_DAY.isoformat(), "2024-01-01", 1, "day")
    planned, digest = plan_chunks_hashed(spec, run_key)
    assert len(planned) == DAYS
    return CampaignShape(run_key, "bench", "orders", digest, "sha256:" + "0" * 64, planned)


def _lease(store: Any, shape: Any, chunk: Any) -> Any:
    outcome = store.acquire_lease(shape, chunk, FLOOR_OWNER, 3600.0)
    if outcome.lease is None:
        raise SystemExit(f"ledger floor: chunk {chunk.index} not leased")
    return outcome.lease


@contextlib.contextmanager
def floor_ledger(dst: str, leased: bool = True) -> Iterator[tuple[Any, list[Any], list[Any]]]:
    """A fresh ledger in the target database with every daily chunk leased (before any clock
    starts; none with ``leased=False``): the store, the planned chunks and their leases; dropped
    afterwards."""
    from dpone.ledger.postgres import PostgresLedger

    shape = _floor_shape()
    with psycopg.connect(dst, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {FLOOR_LEDGER} CASCADE")
    store = PostgresLedger(dst, schema=FLOOR_LEDGER)
    try:
        store.initialize(shape, FLOOR_OWNER, 10.0)
        leases = [_lease(store, shape, chunk) for chunk in shape.chunks] if leased else []
        yield store, list(shape.chunks), leases
    finally:
        store.close()
        with psycopg.connect(dst, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {FLOOR_LEDGER} CASCADE")


def _chunk_writer(
    table: str, columns: str, chunks: list[bytes]
) -> Callable[[int], Callable[[Any], Any]]:
    """write(i): the work of chunk i inside complete_in_transaction (DELETE of its range, binary
    COPY of its rows read beforehand, dpone's checksum query)."""
    from dpone.ledger.port import ChunkResult

    days = _days()
    checksum = checksum_select(
        sql.SQL(f"(SELECT {columns} FROM {table} WHERE order_date >= %s AND order_date < %s) AS s"),
        CHECKSUM_COLUMNS,
        NOT_NULL,
        chained=True,
    )

    def write(i: int) -> Callable[[Any], ChunkResult]:
        def work(conn: Any) -> ChunkResult:
            lower, upper = days[i]
            with conn.cursor() as cur:
                cur.execute(
                    f"DELETE FROM {table} WHERE order_date >= %s AND order_date < %s",
                    (lower, upper),
                )
                with cur.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as cp:
                    cp.write(chunks[i])
                rows = cur.rowcount
                cur.execute(checksum, (lower, upper))
                found = cur.fetchone()
            return ChunkResult(True, rows=rows, checksum=str(found))

        return work

    return write


def ledger_work_while_reading(
    src: str, dst: str, table: str, columns: str, chunks: list[bytes], connections: int = 1
) -> float:
    """Seconds until the target work, each chunk inside dpone's complete_in_transaction
    (compare-and-set, then the work, then the completion record, one commit), and a full read of
    the source by another process (started together) have ended. With several connections, each
    is a forked process with its own ledger connection taking every ``connections``-th chunk."""
    from dpone.ledger.postgres import PostgresLedger

    write = _chunk_writer(table, columns, chunks)
    with floor_ledger(dst) as (store, planned, leases):

        def complete(ledger: Any, indexes: range) -> None:
            for i in indexes:
                result = ledger.complete_in_transaction(leases[i], planned[i], write(i))
                if not result.committed:
                    raise SystemExit(f"ledger floor: chunk {planned[i].index} not committed")

        def complete_in_child(indexes: range) -> None:
            ledger = PostgresLedger(dst, schema=FLOOR_LEDGER)  # never the parent's connection
            try:
                complete(ledger, indexes)
            finally:
                ledger.close()

        context = multiprocessing.get_context("fork")
        reader = context.Process(target=_read_and_discard, args=(src, table, columns))
        workers = [
            context.Process(target=complete_in_child, args=(range(k, DAYS, connections),))
            for k in range(connections if connections > 1 else 0)
        ]
        started = time.perf_counter()
        reader.start()
        for worker in workers:
            worker.start()
        if not workers:
            complete(store, range(DAYS))
        for process in [*workers, reader]:
            process.join()
        elapsed = time.perf_counter() - started
    if any(process.exitcode != 0 for process in [*workers, reader]):
        raise SystemExit("ledger floor: a writing or reading process failed")
    return elapsed


def _lease_every_chunk(dst: str, send: Any) -> None:
    """In a forked process: lease the floor campaign's chunks in order on its own ledger
    connection, each lease its own committed transaction (as dpone's acquire_lease), sending
    each lease as soon as it is committed."""
    from dpone.ledger.postgres import PostgresLedger

    shape = _floor_shape()
    store = PostgresLedger(dst, schema=FLOOR_LEDGER)  # never the parent's connection
    try:
        for chunk in shape.chunks:
            send.send(_lease(store, shape, chunk))
    finally:
        store.close()
        send.close()


def ledger_work_leasing_while_reading(
    src: str, dst: str, table: str, columns: str, chunks: list[bytes]
) -> float:
    """The one-connection floor with the ledger, with the leases inside the clock: another
    process takes every chunk's lease (one committed transaction each, as the fence requires
    before the chunk's data moves) as fast as it can, from the start, while a third reads the
    source; the writer waits only for the lease of the chunk it is about to write. A one-worker
    run of any design that keeps the ledger's protocol leases every chunk; none can hide the
    leases better than a process that takes them all ahead, unbounded."""
    write = _chunk_writer(table, columns, chunks)
    with floor_ledger(dst, leased=False) as (store, planned, _):
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        leaser = context.Process(target=_lease_every_chunk, args=(dst, send))
        reader = context.Process(target=_read_and_discard, args=(src, table, columns))
        started = time.perf_counter()
        reader.start()
        leaser.start()
        send.close()  # the child's copy is the only writer left
        for i, chunk in enumerate(planned):
            lease = receive.recv()
            if lease.chunk_index != chunk.index:
                raise SystemExit(f"ledger floor: lease {lease.chunk_index} for chunk {chunk.index}")
            if not store.complete_in_transaction(lease, chunk, write(i)).committed:
                raise SystemExit(f"ledger floor: chunk {chunk.index} not committed")
        for process in (leaser, reader):
            process.join()
        elapsed = time.perf_counter() - started
        receive.close()
    if any(process.exitcode != 0 for process in (leaser, reader)):
        raise SystemExit("ledger floor: the leasing or the reading process failed")
    return elapsed


def relay_with_ledger_reading_ahead(src: str, dst: str, statements: dict[str, str]) -> float:
    """Seconds for one process to relay every chunk inside dpone's complete_in_transaction
    while a thread reads the next chunk whole from the source (leases taken before the clock)."""
    from campaign_relay import read_day
    from dpone.ledger.port import ChunkResult

    days = _iso_days()

    def write(day: tuple[str, str], blocks: list[bytearray]) -> Callable[[Any], ChunkResult]:
        def work(conn: Any) -> ChunkResult:
            with conn.cursor() as cur:
                write_day(cur, statements, day, iter(blocks))
            return ChunkResult(True)

        return work

    with (
        floor_ledger(dst) as (store, planned, leases),
        psycopg.connect(src, autocommit=True) as source,
        concurrent.futures.ThreadPoolExecutor(1) as reader,
    ):
        started = time.perf_counter()
        ahead = reader.submit(read_day, source, statements, days[0])
        for i, chunk in enumerate(planned):
            blocks = ahead.result()
            if i + 1 < DAYS:
                ahead = reader.submit(read_day, source, statements, days[i + 1])
            result = store.complete_in_transaction(leases[i], chunk, write(days[i], blocks))
            if not result.committed:
                raise SystemExit(f"relay + ledger: chunk {chunk.index} not committed")
        return time.perf_counter() - started


def relay_processes(src: str, dst: str, statements: dict[str, str], workers: int) -> float:
    """Seconds for ``workers`` forked processes (psycopg already imported) to relay every chunk,
    process k taking the days k, k + workers, ..."""
    days = _iso_days()
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=relay, args=(src, dst, statements, days[k::workers]))
        for k in range(workers)
    ]
    started = time.perf_counter()
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    if any(process.exitcode != 0 for process in processes):
        raise SystemExit("relay: a relaying process failed")
    return elapsed


def contiguous(days: Sequence[tuple[str, str]], items: int) -> list[Sequence[tuple[str, str]]]:
    """``days`` cut into ``items`` contiguous batches, the first ones one day longer."""
    size, longer = divmod(len(days), items)
    out, start = [], 0
    for item in range(items):
        end = start + size + (1 if item < longer else 0)
        out.append(days[start:end])
        start = end
    return out


def relay_items(
    python: str, src: str, dst: str, statements: dict[str, str], items: int, pool: int
) -> float:
    """Seconds for ``items`` fresh interpreters, ``pool`` at a time, each relaying its contiguous
    batch of days (campaign_relay.py as a script: Python, psycopg, two connections, the chunks)."""
    script = str(Path(__file__).with_name("campaign_relay.py"))
    jobs = [
        json.dumps({"src": src, "dst": dst, "statements": statements, "days": list(batch)})
        for batch in contiguous(_iso_days(), items)
    ]

    def run(job: str) -> None:
        subprocess.run([python, script], input=job, text=True, check=True, capture_output=True)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(pool) as executor:
        for future in [executor.submit(run, job) for job in jobs]:
            future.result()
    return time.perf_counter() - started


def installed_runtime(folder: Path) -> Path | None:
    """A fresh venv with the runtime wheel (and its postgres extra) installed by pip, which
    compiles the bytecode as any wheel install does and reads this machine's pip configuration;
    None (with a note on stderr) when the wheel or the install cannot be made here."""
    dist, venv = folder / "dist", folder / "venv"
    try:
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "build.sh"), str(dist)],
            check=True,
            capture_output=True,
        )
        (wheel,) = dist.glob("dpone_runtime-*.whl")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run(
            [*pip, "--disable-pip-version-check", f"{wheel}[postgres]"],
            check=True,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, ValueError) as exc:
        print(f"note: no installed-wheel venv ({type(exc).__name__})", file=sys.stderr)
        return None
    return venv
