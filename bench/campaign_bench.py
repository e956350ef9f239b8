"""Campaign benchmark: a whole daily backfill Postgres -> Postgres, dpone vs. the psql COPY pipe.

The shape of issue 12, measured side by side in one run: 1,000,000 rows over the 365 days of 2023
in one database (dpone_bench_src; in date order, indexed on the chunk column), the target table in
another (dpone_bench_dst) with an index on the chunk column, the ledger in the target database,
daily chunks, inner_mode replace. Beside it, issue 27's hourly shape: a year of hourly chunks (8,760
chunks of 115 rows, 1,007,400 rows) in its own table (bench.orders_hourly, indexed on order_ts) and
ledger schema, measured against the pipe of that same table.

  pipe      ``psql -c "COPY .. TO STDOUT" | psql -c "COPY .. FROM STDIN"`` of the whole table
            (text; the limit every ratio is taken against)
  w1, w4    ``dpone run`` of an internal workload with parallel_workers 1 and 4; w1 also with
            its read-ahead off (DPONE_READ_AHEAD_MB=0), the same code: what the read-ahead gains
  summary   the 40-item summary plan of the generated DAG file run as 8 concurrent ``dpone run``
            processes (the pool), each with the env and command taken from that file
  gate      w1 also with ``sink.read_back: count`` and ``off`` (w1 itself runs the default,
            ``checksum``): what the read-back gate costs; --gate-only runs just these and the pipe
  hourly    the hourly table's own pipe, and ``dpone run`` of an internal workload with
            parallel_workers 4 over its 8,760 chunks (ratio to that pipe)
  no-op     one mapped item re-run whose chunks are all committed (a cleared task), wall time,
            beside the floor its goal is stated against, in the same interleaved repetitions:
            python + ``import psycopg`` + one connection + one read of the ledger table (no
            dpone code, no YAML); reported as milliseconds above that floor (goal: 40), judged
            on the installed wheel and the floor in its venv when the wheel could be built
  estimates beside w1, w4 and the summary, in the same repetitions: the same campaign moved with
            no dpone code (bench/campaign_relay.py): each chunk relayed by the cheapest psycopg
            loop, one transaction each; for w1 inside dpone's ledger transaction while a thread
            reads the next chunk, for w4 by 4 processes, for the summary by 40 fresh
            interpreters 8 at a time. What the goal costs a Python client that relays the rows,
            without dpone's own code; not a floor (a better relay may exist).

Every run starts from an empty target and a fresh ledger schema; row count and sum(id) of the
target are compared with the source after each. The repetitions are interleaved (pipe, w1, w4,
hourly pipe, hourly w4, summary, pipe, ...) and the medians reported, with the load average
before each run: the machine may be shared, so the ratios, taken side by side, are the figures
to quote.

With --compare-src, w1, w4, the summary, the hourly w4 and the no-op also run with another
runtime checkout (PYTHONPATH), interleaved with this one: a before/after taken under the same
load, each pair's order alternating from one repetition to the next (use an even --repeat).

Beside every run: the machine's busy CPU seconds and the CPU of the client processes. Then the
floors of bench/campaign_floors.py, which bound what any client of this design reaches here:
the target's own work per chunk over 1 and 4 connections (rows read beforehand; no source, no
ledger, no dpone), the same while another process reads the source (pipelined, 1 and 4),
the one-connection pipelined work with dpone's compare-and-set and completion inside each chunk,
40 x ``import psycopg`` plus the 4-connection work (alone, or with the source read and the
ledger) spread over every core, and the no-op
item re-run from the runtime wheel installed in a fresh venv (``--no-wheel`` skips building it),
beside the no-op goal's floor in that venv (python, import psycopg, connect, read one ledger
table) and the floor of a pod that reads its YAML with ruamel (the same plus importing
ruamel.yaml and parsing the catalog and the manifest with it; no dpone code: dpone's pods read
YAML's common subset without ruamel), with how many of its runs exceed the goal.

A last pass runs w1 once more with DPONE_TIMING set (see runtime/src/dpone/observability/timing.py) and prints
the per-chunk breakdown: milliseconds and round trips of lease, delete, copy out, copy in,
checksum and completion; and the phases of the no-op item.

    .venv/bin/python bench/campaign_bench.py [--rows 1000000] [--repeat 1] [--noop-repeat 5]
        [--hours 8760] [--hourly-rows 115] [--dsn DSN] [--keep] [--json] [--no-wheel]
        [--gate-only | --noop-only | --hourly-only | --summary-only]
        [--compare-src OLD_CHECKOUT/runtime/src]

--hourly-only runs just the hourly pipe and the hourly w4 (and its --compare-src twin),
interleaved, and prints their ratios: the quickest before/after of the hourly goal.

--summary-only runs just the pipe and the summary (and its --compare-src twin), interleaved, and
prints their ratios and each run's machine CPU seconds: the quickest before/after of the summary
goal.

--noop-only runs just the summary campaign once and then the no-op measurement (the item beside
its floors, installed wheel included, and its phases), the quickest check of the no-op goal; the
rows do not matter to it: ``--noop-only --rows 20000 --noop-repeat 15`` takes about a minute.

--hours and --hourly-rows shrink the hourly shape for a quick check of the script (the goal is
stated for the defaults). --json prints every figure as JSON at the end: each run's seconds,
ratio to its own pipe, goal and whether it was met; the shapes; the no-op goal (item and floor
wall times, milliseconds above the floor, met); the floors and the breakdowns.

DSN: --dsn, else DPONE_TEST_POSTGRES_DSN, else postgresql://postgres@127.0.0.1:5432/postgres (any
database of the server: the two bench databases are created there and dropped at the end unless
--keep). It is never printed.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import datetime as dt
import functools
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from campaign_floors import (
    installed_runtime,
    ledger_work_leasing_while_reading,
    ledger_work_while_reading,
    machine_busy_s,
    read_chunks,
    relay_items,
    relay_processes,
    relay_statements,
    relay_with_ledger_reading_ahead,
    target_work,
    target_work_while_reading,
)
from psycopg import sql
from runtime_bytecode import compile_bytecode

ROOT = Path(__file__).resolve().parents[1]
DPONE = Path(sys.executable).with_name("dpone")
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
SRC_DB, DST_DB = "dpone_bench_src", "dpone_bench_dst"
SCHEMA, TABLE, AUDIT = "bench", "orders", "bench_audit"
COLUMNS = "id, order_date, customer, amount, payload"
DDL = (
    "CREATE TABLE {} (id bigint NOT NULL, order_date date NOT NULL, customer text NOT NULL,"
    " amount numeric(12,2) NOT NULL, payload text)"
)
#: the hourly shape: a year of hourly chunks of about 115 rows in its own table and ledger schema
HOURLY, HOURLY_AUDIT = "orders_hourly", "bench_audit_hourly"
HOURLY_COLUMNS = "id, order_ts, customer, amount, payload"
HOURLY_DDL = (
    "CREATE TABLE {} (id bigint NOT NULL, order_ts timestamp NOT NULL, customer text NOT NULL,"
    " amount numeric(12,2) NOT NULL, payload text)"
)
HOURS, HOURLY_ROWS = 8_760, 115
ITEMS, POOL = 40, 8
#: ratio to the pipe of the same table, at least (issue 27's goals)
GOALS = {"w1": 0.65, "w4": 0.85, "summary": 0.30, "hourly w4": 0.5}
GATE_GOAL = 0.10  # the default read-back gate (w1) loses at most 10% against read_back: off
GATE_LEVELS = {"w1 (read_back off)": "campaign_w1_off", "w1 (read_back count)": "campaign_w1_count"}
READ_AHEAD_OFF = "DPONE_READ_AHEAD_MB"
RELAY = {  # the relay estimate run beside each goal's dpone run, in the same group of variants
    "w1": "w1 (relay + ledger, no dpone)",
    "w4": "w4 (relay, 4 processes, no dpone)",
    "summary": "summary (relay, 40 interpreters, no dpone)",
}
NOOP_GOAL_MS = 40  # a no-op item is within 40 ms of its floor, measured in the same run
NOOP_FLOOR = "floor: installed venv, psycopg + ruamel.yaml parse + connect + read"
NOOP_ITEM = "no-op item re-run (all chunks committed)"
NOOP_ITEM_INSTALLED = "no-op item re-run, installed wheel"
NOOP_GOAL_FLOOR = "floor: python + import psycopg + connect + ledger read"
NOOP_BREAKDOWN = (
    "no-op item, one process (exclusive ms; the rest is interpreter start and imports):"
)
NOOP_GOAL_FLOOR_INSTALLED = "floor: installed venv, python + psycopg + connect + ledger read"
BREAKDOWN = ("lease", "cas", "sink_other", "delete", "copy_out", "copy_in", "checksum")
BREAKDOWN += ("read_back", "completion", "chunk")

MANIFEST = """schema: dpone.pipeline.v1
name: {name}
processes:
  - name: orders
    source:
      connection: bench_src
      table: {{schema: {schema}, name: {table}}}
    sink:
      connection: bench_dst
      table: {{schema: {schema}, name: {table}}}
      keys: [id]
      strategy: {{mode: backfill}}{read_back}
    backfill:
      chunk: {chunk}
      inner_mode: replace
      parallel_workers: {workers}
      lease_seconds: 300
    state:
      backend: audit_schema
      connection: bench_dst
      schema: {audit}
      require_distributed_lock: true
"""
CATALOG = """schema: dpone.workload-catalog.v1
defaults:
  airflow:
    flavour: subprocess
    command: [{command}]
    catalog_path: {catalog}
    start_date: "2024-01-01"
workloads:
  campaign_w1:
    manifest: campaign_w1.yaml
    airflow: {{dag_id: dpone_bench_campaign_w1}}
  campaign_w1_count:
    manifest: campaign_w1_count.yaml
    airflow: {{dag_id: dpone_bench_campaign_w1_count}}
  campaign_w1_off:
    manifest: campaign_w1_off.yaml
    airflow: {{dag_id: dpone_bench_campaign_w1_off}}
  campaign_w4:
    manifest: campaign_w4.yaml
    airflow: {{dag_id: dpone_bench_campaign_w4}}
  campaign_hourly_w4:
    manifest: campaign_hourly_w4.yaml
    airflow: {{dag_id: dpone_bench_campaign_hourly_w4}}
  campaign_summary:
    manifest: campaign_summary.yaml
    airflow:
      dag_id: dpone_bench_campaign_summary
      mapping: {{mode: summary, max_items: {items}, max_active: {pool}, pool: dpone_bench}}
"""


# --- databases -------------------------------------------------------------------------------------
def database_dsn(dsn: str, dbname: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + dbname))


def create_databases(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in (SRC_DB, DST_DB):
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not found:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_databases(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in (SRC_DB, DST_DB):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def seed_source(src: str, rows: int) -> None:
    """bench.orders: ``rows`` rows spread evenly over the 365 days of 2023, in date order as a
    history table fills, with an index on the chunk column (without one every chunk would be a
    full scan of the source, which no client can avoid); kept between runs when unchanged."""
    chunk_value = "date '2023-01-01' + ((g - 1) * 365 / %s)::int"
    seed_table(src, TABLE, DDL, ("order_date", chunk_value), (rows, rows), "v2")


def seed_hourly_source(src: str, hours: int, per_hour: int) -> None:
    """bench.orders_hourly: ``per_hour`` rows in each of the first ``hours`` hours of 2023 (a
    year by default: 8,760 chunks of 115 rows, 1,007,400 rows), in time order, indexed on the
    chunk column; kept between runs when unchanged."""
    chunk_value = "timestamp '2023-01-01' + ((g - 1) / %s) * interval '1 hour'"
    seed_table(
        src, HOURLY, HOURLY_DDL, ("order_ts", chunk_value), (per_hour, hours * per_hour), "h1"
    )


def seed_table(
    src: str, name: str, ddl: str, chunk: tuple[str, str], params: tuple[int, int], version: str
) -> None:
    """``params[1]`` rows g = 1.. of bench.``name``, the chunk column ``chunk[0]`` computed by the
    expression ``chunk[1]`` of g and ``params[0]``; the table's comment marks what it holds, so an
    unchanged table is kept."""
    marker = f"dpone campaign_bench {version} {params}"
    if version == "v2":  # the daily table's marker of earlier versions of this script
        marker = f"dpone campaign_bench v2 rows={params[1]}"
    table = sql.Identifier(SCHEMA, name)
    with psycopg.connect(src, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        found = conn.execute(
            "SELECT obj_description(to_regclass(%s), 'pg_class')", (f"{SCHEMA}.{name}",)
        ).fetchone()
        if found and found[0] == marker:
            return
        print(f"generating {params[1]:,} rows of {SCHEMA}.{name} ...", file=sys.stderr)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        conn.execute(sql.SQL(ddl).format(table))  # type: ignore[arg-type]
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, " + chunk[1] + ","
                " 'customer_' || (g %% 5000), round((random() * 10000)::numeric, 2),"
                " md5(g::text) || '-payload' FROM generate_series(1, %s) AS g"
            ).format(
                table
            ),  # type: ignore[arg-type]
            params,
        )
        conn.execute(sql.SQL("CREATE INDEX ON {} ({})").format(table, sql.Identifier(chunk[0])))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
        conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(table, sql.Literal(marker)))


def prepare_target(dst: str) -> None:
    """The empty targets with their index on the chunk column (created once, truncated per run)."""
    with psycopg.connect(dst, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        for name, ddl, column in ((TABLE, DDL, "order_date"), (HOURLY, HOURLY_DDL, "order_ts")):
            table = sql.Identifier(SCHEMA, name)
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
            conn.execute(sql.SQL(ddl).format(table))  # type: ignore[arg-type]
            conn.execute(sql.SQL("CREATE INDEX ON {} ({})").format(table, sql.Identifier(column)))


def shape_of(run: str) -> tuple[str, str, str]:
    """(table, columns, ledger schema) a run moves: the hourly runs have their own."""
    if run.startswith("hourly"):
        return HOURLY, HOURLY_COLUMNS, HOURLY_AUDIT
    return TABLE, COLUMNS, AUDIT


def reset_target(dst: str, run: str = "") -> None:
    """Empty target, no ledger schema, a checkpoint so no run pays for the previous one's WAL."""
    name, _, audit = shape_of(run)
    with psycopg.connect(dst, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(SCHEMA, name)))
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(audit)))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(SCHEMA, name)))
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


def table_facts(dsn: str, run: str = "") -> tuple[int, int]:
    """Row count and sum(id) of the table ``run`` moves (bench.orders, or the hourly one)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*), coalesce(sum(id), 0) FROM {}").format(
                sql.Identifier(SCHEMA, shape_of(run)[0])
            )
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# --- the project and its generated DAG ---------------------------------------------------------------
def hourly_end(hours: int) -> str:
    end = dt.datetime(2023, 1, 1) + dt.timedelta(hours=hours)
    return end.strftime("%Y-%m-%dT%H:%M:%SZ")


def write_project(folder: Path, hours: int = HOURS) -> Path:
    catalog = folder / "workloads.yaml"
    daily = (
        "{column: order_date, type: date, start: 2023-01-01, end: 2024-01-01, step: 1, unit: day}"
    )
    hourly = (
        '{column: order_ts, type: timestamp, start: "2023-01-01T00:00:00Z", '
        f'end: "{hourly_end(hours)}", step: 1, unit: hour}}'
    )
    for name, workers, level in (
        ("campaign_w1", 1, None),  # the default gate, read_back: checksum
        ("campaign_w1_count", 1, "count"),
        ("campaign_w1_off", 1, "off"),
        ("campaign_w4", 4, None),
        ("campaign_hourly_w4", 4, None),
        ("campaign_summary", 1, None),
    ):
        read_back = f"\n      read_back: {level}" if level else ""
        is_hourly = name == "campaign_hourly_w4"
        text = MANIFEST.format(
            name=name,
            schema=SCHEMA,
            table=HOURLY if is_hourly else TABLE,
            workers=workers,
            audit=HOURLY_AUDIT if is_hourly else AUDIT,
            read_back=read_back,
            chunk=hourly if is_hourly else daily,
        )
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
    catalog.write_text(
        CATALOG.format(
            command=json.dumps(str(DPONE)), catalog=json.dumps(str(catalog)), items=ITEMS, pool=POOL
        ),
        encoding="utf-8",
    )
    return catalog


def mapped_tasks(dag_file: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The mapped task's command and its env_vars list, read from the generated file's AST."""
    tree = ast.parse(dag_file.read_text(encoding="utf-8"))
    # Each item's dict extends the task's env written once above the DAG: {**TASK_ENV[...], ...}.
    shared = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        if node.targets[0].id == "TASK_ENV"
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "expand"
            and isinstance(node.func.value, ast.Call)
        ):
            partial = {k.arg: k.value for k in node.func.value.keywords}
            expand = {k.arg: k.value for k in node.keywords}
            command = ast.literal_eval(partial["command"])
            source = ast.Expression(expand["env_vars"])  # literals and TASK_ENV only
            envs = eval(compile(source, str(dag_file), "eval"), {"__builtins__": {}}, shared)
            for env in envs:
                for value in env.values():
                    if value.startswith("{{"):  # Airflow would render it; nothing here does
                        raise SystemExit("an env value of the generated DAG is Jinja-encoded")
            return list(command), list(envs)
    raise SystemExit(f"{dag_file}: no mapped task")


# --- runs ------------------------------------------------------------------------------------------
def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def clean_env(src: str, dst: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update({"DPONE_CONN_BENCH_SRC": src, "DPONE_CONN_BENCH_DST": dst, "NO_COLOR": "1"})
    env.update(extra)
    return env


def run_pipe(src: str, dst: str, table: str = TABLE, columns: str = COLUMNS) -> None:
    out = f"COPY {SCHEMA}.{table} ({columns}) TO STDOUT"
    into = f"COPY {SCHEMA}.{table} ({columns}) FROM STDIN"
    reader = subprocess.Popen(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", src, "-c", out],
        stdout=subprocess.PIPE,
    )
    subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dst, "-c", into],
        stdin=reader.stdout,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    assert reader.stdout is not None
    reader.stdout.close()
    if reader.wait() != 0:
        raise SystemExit("psql COPY TO failed")


def run_dpone(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"dpone run failed ({done.returncode}):\n{done.stderr[-3000:]}")


def noop_floor_code(catalog: Path) -> str:
    """What a no-op item that reads its YAML with ruamel cannot go below: import psycopg and
    ruamel.yaml, parse the catalog and the manifest (the pod recompiles the pack from them:
    DESIGN.md), connect to the ledger database and read one ledger table. No dpone code;
    ruamel's cheapest loader (safe, its C parser where installed). dpone's pods read the common
    subset of YAML without ruamel (dpone.authoring.yaml_subset), so they can go below it."""
    files = [str(catalog), str(catalog.with_name("campaign_summary.yaml"))]
    return (
        "import os, psycopg\n"
        "from ruamel.yaml import YAML\n"
        "yaml = YAML(typ='safe')\n"
        f"for name in {files!r}:\n"
        "    with open(name, encoding='utf-8') as f:\n"
        "        yaml.load(f.read())\n"
        "with psycopg.connect(os.environ['DPONE_CONN_BENCH_DST']) as conn:\n"
        f"    conn.execute('SELECT count(*) FROM {AUDIT}.campaign').fetchone()\n"
    )


def noop_goal_floor_code() -> str:
    """The floor the no-op goal is stated against: python, ``import psycopg``, one connection to
    the ledger database and one read of the ledger table (the item's chunk rows); nothing else.
    Autocommit: not even a COMMIT round trip."""
    return (
        "import os, psycopg\n"
        "with psycopg.connect(os.environ['DPONE_CONN_BENCH_DST'], autocommit=True) as conn:\n"
        f"    conn.execute('SELECT chunk_index, state FROM {AUDIT}.chunk_transition"
        " WHERE chunk_index < 10').fetchall()\n"
    )


def timed_runs(
    commands: dict[str, tuple[list[str], dict[str, str]]], times: int
) -> dict[str, tuple[float, float, list[float]]]:
    """Median wall and median CPU seconds (user + system of the child) of each command, run
    ``times`` times interleaved (so load hits every command alike), and every wall time."""
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(times):
        for name, (command, env) in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            run_dpone(command, env)
            walls[name].append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {
        name: (statistics.median(walls[name]), statistics.median(cpus[name]), walls[name])
        for name in commands
    }


def internal_command(catalog: Path, workload: str) -> list[str]:
    return [str(DPONE), "run", "--catalog", str(catalog), "--workload", workload, "--no-progress"]


def run_summary(command: list[str], envs: list[dict[str, str]], base: dict[str, str]) -> None:
    """Every item, at most POOL processes at once, the next one starting when one ends."""
    with concurrent.futures.ThreadPoolExecutor(POOL) as pool:
        for future in [pool.submit(run_dpone, command, {**base, **env}) for env in envs]:
            future.result()


@contextlib.contextmanager
def timing_file(folder: Path, name: str) -> Iterator[Path]:
    path = folder / f"timing-{name}.jsonl"
    path.unlink(missing_ok=True)
    yield path


def _client_cpu_s() -> float:
    """CPU seconds of the child processes and of this one (a relay estimate runs here)."""
    used = [resource.getrusage(who) for who in (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF)]
    return sum(u.ru_utime + u.ru_stime for u in used)


def in_turn(
    runs: dict[str, Callable[[], object]], repetition: int
) -> list[tuple[str, Callable[[], object]]]:
    """The runs in order, each group of variants of one run (``w1``, ``w1 (compared)``, ...)
    reversed on every other repetition: a run right after a heavy one is measured slower on this
    VM (up to 10%), so the variants take turns going first."""
    groups: list[list[tuple[str, Callable[[], object]]]] = []
    for name, run in runs.items():
        base = name.split(" (")[0]
        if groups and groups[-1][0][0].split(" (")[0] == base:
            groups[-1].append((name, run))
        else:
            groups.append([(name, run)])
    return [item for group in groups for item in (group[::-1] if repetition % 2 else group)]


def measure_floors(
    args: argparse.Namespace, src: str, dst: str, pipe: list[float]
) -> dict[str, tuple[float, float]]:
    """The target's own work with 1 and 4 connections (seconds, machine CPU seconds), medians of
    ``--repeat`` runs, each with its pipe beside it appended to ``pipe``."""
    table = f"{SCHEMA}.{TABLE}"
    chunks = read_chunks(src, table, COLUMNS)
    runs: dict[str, Callable[[], float]] = {
        "target1": lambda: target_work(dst, table, COLUMNS, chunks, 1),
        "target4": lambda: target_work(dst, table, COLUMNS, chunks, 4),
        "pipelined1": lambda: target_work_while_reading(src, dst, table, COLUMNS, chunks),
        "pipelined4": lambda: target_work_while_reading(src, dst, table, COLUMNS, chunks, 4),
        "ledger1": lambda: ledger_work_while_reading(src, dst, table, COLUMNS, chunks),
        "leasing1": lambda: ledger_work_leasing_while_reading(src, dst, table, COLUMNS, chunks),
        "ledger4": lambda: ledger_work_while_reading(src, dst, table, COLUMNS, chunks, 4),
    }
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, run in runs.items():
            reset_target(dst)
            busy = machine_busy_s()
            seconds = run()
            found[name].append((seconds, machine_busy_s() - busy))
            if table_facts(dst) != table_facts(src):
                raise SystemExit(f"floor {name}: wrong target")
            print(f"  floor {name}: {seconds:.2f} s", file=sys.stderr)
        reset_target(dst)
        started = time.perf_counter()
        run_pipe(src, dst)
        pipe.append(time.perf_counter() - started)
    return {
        name: (
            statistics.median(s for s, _ in values),
            statistics.median(c for _, c in values),
        )
        for name, values in found.items()
    }


def print_floors(
    floors: dict[str, tuple[float, float]],
    baseline: float,
    starts: dict[str, tuple[float, float, list[float]]],
    cpu: dict[str, list[tuple[float, float]]],
) -> dict[str, Any]:
    """What bounds each goal: the floors beside the goals, as ratios to the same pipe."""
    cores = os.cpu_count() or 1
    psycopg_wall, psycopg_cpu, _ = starts["floor: python -c 'import psycopg'"]
    if "floor: installed venv, import psycopg" in starts:
        psycopg_wall, psycopg_cpu, _ = starts["floor: installed venv, import psycopg"]
    target4_s, target4_cpu = floors["target4"]
    # 40 processes each start an interpreter and import psycopg; the target does the 4-way work;
    # nothing else (no source read, no ledger, no dpone) - spread perfectly over every core
    summary_s = (ITEMS * psycopg_cpu + target4_cpu) / cores
    # the same with the work of the 4-process floor with the ledger (which reads the source too)
    summary_ledger_s = (ITEMS * psycopg_cpu + floors["ledger4"][1]) / cores
    rows = {
        "target work only, 1 connection": (floors["target1"][0], "w1"),
        "the same while another process reads the source (pipelined)": (
            floors["pipelined1"][0],
            "w1",
        ),
        "the same with dpone's compare-and-set and completion in each transaction": (
            floors["ledger1"][0],
            "w1",
        ),
        "the same with the leases inside the clock, taken ahead by another process": (
            floors["leasing1"][0],
            "w1",
        ),
        "the same + the process's start (python + import psycopg, measured above)": (
            floors["leasing1"][0] + psycopg_wall,
            "w1",
        ),
        "target work only, 4 connections": (target4_s, "w4"),
        "4 connections while another process reads the source (pipelined)": (
            floors["pipelined4"][0],
            "w4",
        ),
        "the same with dpone's compare-and-set and completion, 4 processes": (
            floors["ledger4"][0],
            "w4",
        ),
        "the same + the process's start (python + import psycopg), 4 processes": (
            floors["ledger4"][0] + psycopg_wall,
            "w4",
        ),
        f"summary: {ITEMS} x import psycopg + 4-way target work, CPU / {cores} cores": (
            summary_s,
            "summary",
        ),
        f"summary: {ITEMS} x import psycopg + 4-process work with the ledger, CPU / {cores}": (
            summary_ledger_s,
            "summary",
        ),
    }
    title = "floor (what no client of this design beats here)"
    print(f"\n{title:<62} {'seconds':>8} {'x pipe':>7}")
    out: dict[str, Any] = {}
    for label, (seconds, goal) in rows.items():
        ratio = baseline / seconds
        print(f"{label:<62} {seconds:>8.2f} {ratio:>7.2f}  (goal {goal} >= {GOALS[goal]:.2f})")
        out[label] = {"seconds": round(seconds, 3), "vs_pipe": round(ratio, 3), "goal": goal}
    machine = {name: statistics.median(m for m, _ in values) for name, values in cpu.items()}
    print(
        f"machine CPU seconds: target work 1 / 4 connections {floors['target1'][1]:.2f} / "
        f"{target4_cpu:.2f}, pipelined 1 / 4 {floors['pipelined1'][1]:.2f} / "
        f"{floors['pipelined4'][1]:.2f}, with the ledger 1 / 4 "
        f"{floors['ledger1'][1]:.2f} / {floors['ledger4'][1]:.2f}; import psycopg {psycopg_cpu:.3f} per process; runs: "
        + ", ".join(f"{name} {value:.2f}" for name, value in machine.items())
    )
    out["machine_cpu_s"] = {
        "target1": round(floors["target1"][1], 3),
        "pipelined1": round(floors["pipelined1"][1], 3),
        "pipelined4": round(floors["pipelined4"][1], 3),
        "ledger1": round(floors["ledger1"][1], 3),
        "leasing1": round(floors["leasing1"][1], 3),
        "ledger4": round(floors["ledger4"][1], 3),
        "target4": round(target4_cpu, 3),
        "import_psycopg": round(psycopg_cpu, 3),
    }
    return out


def phase_totals(path: Path) -> dict[str, list[int]]:
    """Phases of every process that reported to ``path``, summed (none from a runtime that
    predates DPONE_TIMING)."""
    totals: dict[str, list[int]] = {}
    if not path.exists():
        return totals
    for line in path.read_text(encoding="utf-8").splitlines():
        for name, values in json.loads(line)["phases"].items():
            row = totals.setdefault(name, [0, 0, 0, 0])
            for i, value in enumerate(values):
                row[i] += value
    return totals


def print_breakdown(title: str, totals: dict[str, list[int]], per: int) -> dict[str, Any]:
    """Per-chunk (or per-run) milliseconds (exclusive) and round trips of each phase."""
    print(f"\n{title}")
    if not totals:
        print("(no phases: this runtime does not know DPONE_TIMING)")
    print(f"{'phase':<14} {'calls':>7} {'ms each':>9} {'round trips':>12}")
    out: dict[str, Any] = {}
    names = [n for n in BREAKDOWN if n in totals] + sorted(set(totals) - set(BREAKDOWN))
    for name in names:
        calls, own_ns, _, trips = totals[name]
        ms = own_ns / 1e6 / per
        print(f"{name:<14} {calls / per:>7.2f} {ms:>9.3f} {trips / per:>12.2f}")
        out[name] = {"calls": calls / per, "ms": round(ms, 3), "round_trips": trips / per}
    return out


def noop_above_floor(
    measured: dict[str, tuple[float, float, list[float]]], noop_load: str
) -> dict[str, Any]:
    """Print the one-process runs and judge the no-op goal: the item's median wall time at most
    NOOP_GOAL_MS above its floor's (python + import psycopg + connect + ledger read), in the same
    venv and run; installed from the wheel (what a pod runs) when it could be built."""
    noop_name, floor_name = NOOP_ITEM, NOOP_GOAL_FLOOR
    if NOOP_ITEM_INSTALLED in measured and NOOP_GOAL_FLOOR_INSTALLED in measured:
        noop_name, floor_name = NOOP_ITEM_INSTALLED, NOOP_GOAL_FLOOR_INSTALLED
    floor_walls = measured[floor_name][2]
    limit_s = measured[floor_name][0] + NOOP_GOAL_MS / 1000
    print(
        f"\n{'one process, median of ' + str(len(floor_walls)):<62} {'wall s':>7} {'cpu s':>7}"
        f"  {'runs > floor + ' + str(NOOP_GOAL_MS) + ' ms':>22}"
    )
    for name, (wall, cpu, walls) in measured.items():
        above = f"{sum(w > limit_s for w in walls)} of {len(walls)}"
        print(f"{name:<62} {wall:>7.3f} {cpu:>7.3f}  {above:>22}")
    noop_wall, _, noop_walls = measured[noop_name]
    above_ms = (noop_wall - measured[floor_name][0]) * 1000
    # the runs are interleaved: each repetition's item beside the same repetition's floor
    paired_ms = (
        statistics.median(n - f for n, f in zip(noop_walls, floor_walls, strict=True)) * 1000
    )
    met = above_ms <= NOOP_GOAL_MS
    print(
        f"no-op goal: within {NOOP_GOAL_MS} ms of {floor_name!r}: {above_ms:+.0f} ms (medians; "
        f"paired by repetition {paired_ms:+.0f} ms), judged on {noop_name!r} "
        f"({'met' if met else 'NOT met'}; load before: {noop_load})"
    )
    return {
        "item": noop_name,
        "floor": floor_name,
        "item_wall_s": round(noop_wall, 3),
        "floor_wall_s": round(measured[floor_name][0], 3),
        "above_floor_ms": round(above_ms, 1),
        "above_floor_paired_ms": round(paired_ms, 1),
        "goal_ms": NOOP_GOAL_MS,
        "met": met,
        "load": noop_load,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved repetitions")
    parser.add_argument("--noop-repeat", type=int, default=5)
    parser.add_argument(
        "--hours", type=int, default=HOURS, help="chunks of the hourly shape (a year: 8760)"
    )
    parser.add_argument(
        "--hourly-rows", type=int, default=HOURLY_ROWS, help="rows in each hourly chunk"
    )
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the two bench databases")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument(
        "--no-wheel",
        action="store_true",
        help="skip building the runtime wheel into a fresh venv for the installed no-op figure",
    )
    parser.add_argument(
        "--gate-only",
        action="store_true",
        help="only the pipe and w1 at each read-back level (checksum, count, off)",
    )
    parser.add_argument(
        "--hourly-only",
        action="store_true",
        help="only the hourly pipe and the hourly w4 (and its --compare-src twin), interleaved",
    )
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="only the pipe and the summary (and its --compare-src twin), interleaved",
    )
    parser.add_argument(
        "--noop-only",
        action="store_true",
        help="only the summary campaign once and the no-op item beside its floors",
    )
    parser.add_argument(
        "--compare-src",
        help="also run w1, w4, summary and the no-op (with --gate-only: w1) with this runtime "
        "source tree (an older checkout's runtime/src) first on PYTHONPATH, interleaved with "
        "this one in the same run",
    )
    args = parser.parse_args()
    base_dsn = args.dsn or os.environ.get("DPONE_TEST_POSTGRES_DSN") or DEFAULT_DSN
    src, dst = database_dsn(base_dsn, SRC_DB), database_dsn(base_dsn, DST_DB)
    create_databases(base_dsn)
    folder = Path(tempfile.mkdtemp(prefix="dpone-campaign-bench-"))
    try:
        return bench(args, src, dst, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if not args.keep:
            drop_databases(base_dsn)


def print_gate(times: dict[str, list[float]]) -> bool:
    """The read-back gate's cost: w1 (default, checksum) and count against off, same runs."""
    off = statistics.median(times["w1 (read_back off)"])
    met = True
    for name, label in (("w1 (read_back count)", "count"), ("w1", "checksum (default)")):
        loss = statistics.median(times[name]) / off - 1
        goal = f" (goal <= {GATE_GOAL:.0%})" if name == "w1" else ""
        print(f"read-back gate {label} vs off, 1 worker: {loss:+.1%}{goal}")
        met = met and (name != "w1" or loss <= GATE_GOAL)
    return met


def interleaved(
    runs: dict[str, Callable[[], object]], repeat: int, dst: str, expected: tuple[int, int]
) -> dict[str, list[float]]:
    """Each run ``repeat`` times, in turn (see in_turn), from an empty target, the target
    checked after each: the seconds of each run."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for repetition in range(repeat):
        for name, run in in_turn(runs, repetition):
            reset_target(dst, name)
            before = load()
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
            if table_facts(dst, name) != expected:
                raise SystemExit(f"{name}: wrong target")
            print(f"  {name}: {times[name][-1]:.2f} s (load {before})", file=sys.stderr)
    return times


def print_medians(title: str, times: dict[str, list[float]], pipe: str) -> float:
    """Each run's median and its ratio to the median of ``pipe`` (returned)."""
    baseline = statistics.median(times[pipe])
    print(f"\ncampaign_bench {title}, {os.cpu_count()} CPUs")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<24} {median:>8.2f} s {baseline / median:>6.2f} x pipe")
    return baseline


def gate_only(
    args: argparse.Namespace,
    runs: dict[str, Callable[[], object]],
    expected: tuple[int, int],
    dst: str,
    timing: tuple[Path, dict[str, list[str]], dict[str, str]],
) -> int:
    """--gate-only: the pipe and w1 at each read-back level, interleaved; then one timed run
    (DPONE_TIMING) of w1 at checksum and at off: the gate's phases per chunk."""
    times = interleaved(runs, args.repeat, dst, expected)
    print_medians(
        f"--gate-only: {args.rows:,} rows, 365 daily chunks, median of {args.repeat}", times, "pipe"
    )
    met = print_gate(times)
    folder, commands, base = timing
    for level, command in commands.items():
        with timing_file(folder, f"gate_{level}") as path:
            reset_target(dst)
            run_dpone(command, {**base, "DPONE_TIMING": str(path)})
            print_breakdown(
                f"per chunk, 1 worker, read_back {level} (exclusive ms; checksum counts the "
                "sink's read-back and the source's, which runs on its own thread beside the "
                "write; read_back is the writer's wait for it):",
                phase_totals(path),
                365,
            )
    if args.json:
        report = {name: [round(v, 3) for v in values] for name, values in times.items()}
        print(json.dumps({"rows": args.rows, "repeat": args.repeat, "seconds": report}, indent=2))
    return 0 if met else 1


def hourly_only(args: argparse.Namespace, src: str, dst: str, folder: Path) -> int:
    """--hourly-only: the hourly pipe and the hourly w4 (and its twin from --compare-src),
    interleaved; the medians and their ratios to the pipe."""
    seed_hourly_source(src, args.hours, args.hourly_rows)
    prepare_target(dst)
    expected = table_facts(src, "hourly")
    hourly = internal_command(write_project(folder, args.hours), "campaign_hourly_w4")
    base = clean_env(src, dst)
    runs: dict[str, Callable[[], object]] = {
        "hourly pipe": functools.partial(run_pipe, src, dst, HOURLY, HOURLY_COLUMNS)
    }
    if args.compare_src:
        old = {**base, "PYTHONPATH": str(Path(args.compare_src).resolve())}
        runs["hourly w4 (compared)"] = functools.partial(run_dpone, hourly, old)
    runs["hourly w4"] = functools.partial(run_dpone, hourly, base)
    times = interleaved(runs, args.repeat, dst, expected)
    baseline = print_medians(
        f"--hourly-only: {args.hours:,} hourly chunks of {args.hourly_rows} rows, median of "
        f"{args.repeat}",
        times,
        "hourly pipe",
    )
    if args.json:
        report = {name: [round(v, 3) for v in values] for name, values in times.items()}
        print(json.dumps({"hours": args.hours, "seconds": report}, indent=2))
    ratio = baseline / statistics.median(times["hourly w4"])
    return 0 if ratio >= GOALS["hourly w4"] else 1


def measure_noop(
    args: argparse.Namespace,
    folder: Path,
    catalog: Path,
    summary: tuple[list[str], list[dict[str, str]]],
    base: dict[str, str],
    old: dict[str, str],
) -> tuple[dict[str, tuple[float, float, list[float]]], str, dict[str, list[int]]]:
    """The summary campaign is complete: re-run one item (a cleared task) several times beside
    the floors no dpone change can go below (the interpreter, importing psycopg, ...); then once
    with DPONE_TIMING, timed apart. The runs, the load before them and the phases."""
    command, envs = summary
    noop_env = {**base, **envs[0]}
    run_dpone(command, noop_env)  # warm the page cache
    noop_load = load()
    python = [sys.executable, "-c", "pass"]
    starts = {NOOP_ITEM: (command, noop_env)}
    if old:
        starts["no-op item re-run (compared)"] = (command, {**old, **envs[0]})
    starts["floor: python -c pass"] = (python, noop_env)
    starts["floor: python -c 'import psycopg'"] = ([*python[:2], "import psycopg"], noop_env)
    starts[NOOP_GOAL_FLOOR] = ([*python[:2], noop_goal_floor_code()], noop_env)
    wheel_venv = installed_runtime(folder / "installed") if not args.no_wheel else None
    if wheel_venv is not None:
        installed = [str(wheel_venv / "bin" / "dpone"), *command[1:]]
        starts[NOOP_ITEM_INSTALLED] = (installed, noop_env)
        wheel_python = str(wheel_venv / "bin" / "python")
        starts["floor: installed venv, python -c pass"] = ([wheel_python, "-c", "pass"], noop_env)
        starts["floor: installed venv, import psycopg"] = (
            [wheel_python, "-c", "import psycopg"],
            noop_env,
        )
        starts[NOOP_FLOOR] = ([wheel_python, "-c", noop_floor_code(catalog)], noop_env)
        starts[NOOP_GOAL_FLOOR_INSTALLED] = ([wheel_python, "-c", noop_goal_floor_code()], noop_env)
    measured = timed_runs(starts, args.noop_repeat)
    with timing_file(folder, "noop") as path:
        run_dpone(command, {**noop_env, "DPONE_TIMING": str(path)})
        noop_phases = phase_totals(path)
    return measured, noop_load, noop_phases


def report_noop_only(
    args: argparse.Namespace,
    measured: dict[str, tuple[float, float, list[float]]],
    noop_load: str,
    noop_phases: dict[str, list[int]],
) -> int:
    """--noop-only: the no-op item beside its floors and its phases (measured once the summary
    campaign ran, so every item's chunks are committed); exit 1 when the goal is not met."""
    noop_goal = noop_above_floor(measured, noop_load)
    breakdown = print_breakdown(
        NOOP_BREAKDOWN,
        noop_phases,
        1,
    )
    if args.json:
        print(json.dumps({"noop_goal": noop_goal, "noop_breakdown": breakdown}, indent=2))
    return 0 if noop_goal["met"] else 1


def generated_summary(catalog: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The summary workload's mapped task (command, each item's env) from `dpone generate`."""
    folder = catalog.parent
    generated = subprocess.run(
        [str(DPONE), "generate", str(catalog), "--out", str(folder / "dags")],
        capture_output=True,
        text=True,
        check=False,
        cwd=folder,
    )
    if generated.returncode != 0:
        raise SystemExit(f"dpone generate failed:\n{generated.stderr[-3000:]}")
    command, envs = mapped_tasks(folder / "dags" / "dpone_bench_campaign_summary.py")
    if len(envs) != ITEMS:
        raise SystemExit(f"the generated DAG has {len(envs)} items, not {ITEMS}")
    return command, envs


def summary_only(args: argparse.Namespace, src: str, dst: str, folder: Path) -> int:
    """--summary-only: the pipe and the summary (and its twin from --compare-src),
    interleaved; the medians, their ratios to the pipe and each run's machine CPU seconds."""
    seed_source(src, args.rows)
    prepare_target(dst)
    expected = table_facts(src)
    command, envs = generated_summary(write_project(folder, args.hours))
    base = clean_env(src, dst)
    busy: dict[str, list[float]] = {}

    def measured(name: str, run: Callable[[], object]) -> Callable[[], object]:
        def timed() -> None:
            before = machine_busy_s()
            run()
            busy.setdefault(name, []).append(machine_busy_s() - before)

        return timed

    runs = {"pipe": measured("pipe", functools.partial(run_pipe, src, dst))}
    if args.compare_src:
        old = {**base, "PYTHONPATH": str(Path(args.compare_src).resolve())}
        runs["summary (compared)"] = measured(
            "summary (compared)", functools.partial(run_summary, command, envs, old)
        )
    runs["summary"] = measured("summary", functools.partial(run_summary, command, envs, base))
    times = interleaved(runs, args.repeat, dst, expected)
    baseline = print_medians(
        f"--summary-only: {args.rows:,} rows, {ITEMS} items x {POOL} processes, median of "
        f"{args.repeat}",
        times,
        "pipe",
    )
    for name, values in busy.items():
        print(f"{name:<24} machine CPU {statistics.median(values):.2f} s (median)")
    if args.json:
        report = {name: [round(v, 3) for v in values] for name, values in times.items()}
        cpu = {name: [round(v, 3) for v in values] for name, values in busy.items()}
        print(json.dumps({"rows": args.rows, "seconds": report, "cpu_s": cpu}, indent=2))
    ratio = baseline / statistics.median(times["summary"])
    return 0 if ratio >= GOALS["summary"] else 1


def bench(args: argparse.Namespace, src: str, dst: str, folder: Path) -> int:
    compile_bytecode(args.compare_src)
    if args.hourly_only:
        return hourly_only(args, src, dst, folder)
    if args.summary_only:
        return summary_only(args, src, dst, folder)
    seed_source(src, args.rows)
    if not (args.gate_only or args.noop_only):
        seed_hourly_source(src, args.hours, args.hourly_rows)
    prepare_target(dst)
    expected = {TABLE: table_facts(src)}
    if not (args.gate_only or args.noop_only):
        expected[HOURLY] = table_facts(src, "hourly")
    catalog = write_project(folder, args.hours)
    command, envs = generated_summary(catalog)
    base = clean_env(src, dst)
    old = {**base, "PYTHONPATH": str(Path(args.compare_src).resolve())} if args.compare_src else {}
    if args.noop_only:
        run_summary(command, envs, base)
        return report_noop_only(
            args, *measure_noop(args, folder, catalog, (command, envs), base, old)
        )

    runs: dict[str, Callable[[], object]] = {"pipe": lambda: run_pipe(src, dst)}
    for name, workload in GATE_LEVELS.items():  # w1 at each read-back level, beside w1 itself
        runs[name] = functools.partial(run_dpone, internal_command(catalog, workload), base)
    if args.gate_only:
        if old:
            runs["w1 (compared)"] = functools.partial(
                run_dpone, internal_command(catalog, "campaign_w1"), old
            )
        runs["w1"] = functools.partial(run_dpone, internal_command(catalog, "campaign_w1"), base)
        timed = {
            level: [*internal_command(catalog, workload)]
            for level, workload in (("checksum", "campaign_w1"), ("off", "campaign_w1_off"))
        }
        return gate_only(args, runs, expected[TABLE], dst, (folder, timed, base))
    # dpone's data path with no dpone code, beside each run (see campaign_floors: estimates)
    statements = relay_statements(f"{SCHEMA}.{TABLE}", COLUMNS)
    runs[RELAY["w1"]] = functools.partial(relay_with_ledger_reading_ahead, src, dst, statements)
    for name, workload in (("w1", "campaign_w1"), ("w4", "campaign_w4")):
        if old:
            runs[f"{name} (compared)"] = functools.partial(
                run_dpone, internal_command(catalog, workload), old
            )
        if name == "w1":  # the same code with its read-ahead off: what the read-ahead gains
            runs["w1 (read-ahead off)"] = functools.partial(
                run_dpone, internal_command(catalog, workload), {**base, READ_AHEAD_OFF: "0"}
            )
        runs[name] = functools.partial(run_dpone, internal_command(catalog, workload), base)
    runs[RELAY["w4"]] = functools.partial(relay_processes, src, dst, statements, 4)
    # the hourly shape: its own table, pipe and ledger schema (before the summary: see the no-op)
    runs["hourly pipe"] = functools.partial(run_pipe, src, dst, HOURLY, HOURLY_COLUMNS)
    hourly = internal_command(catalog, "campaign_hourly_w4")
    if old:
        runs["hourly w4 (compared)"] = functools.partial(run_dpone, hourly, old)
    runs["hourly w4"] = functools.partial(run_dpone, hourly, base)
    runs[RELAY["summary"]] = functools.partial(
        relay_items, sys.executable, src, dst, statements, ITEMS, POOL
    )
    if old:
        runs["summary (compared)"] = functools.partial(run_summary, command, envs, old)
    runs["summary"] = functools.partial(run_summary, command, envs, base)  # see the no-op below
    times: dict[str, list[float]] = {name: [] for name in runs}
    loads: dict[str, list[str]] = {name: [] for name in runs}
    run_cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}  # machine, clients
    for repetition in range(args.repeat):
        for name, run in in_turn(runs, repetition):
            reset_target(dst, name)
            loads[name].append(load())
            busy, client = machine_busy_s(), _client_cpu_s()
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
            run_cpu[name].append((machine_busy_s() - busy, _client_cpu_s() - client))
            found = table_facts(dst, name)
            if found != expected[shape_of(name)[0]]:
                raise SystemExit(f"{name}: target has {found}, source {expected}")
            print(f"  {name}: {times[name][-1]:.2f} s (load {loads[name][-1]})", file=sys.stderr)

    if name == RELAY["summary"]:  # ran last: the no-op below needs dpone's summary campaign
        reset_target(dst)
        run_summary(command, envs, base)
    measured, noop_load, noop_phases = measure_noop(
        args, folder, catalog, (command, envs), base, old
    )
    floors = measure_floors(args, src, dst, times["pipe"])  # resets the target: after the no-op

    with psycopg.connect(src) as conn:
        server = conn.execute("SHOW server_version").fetchone()
    baseline = statistics.median(times["pipe"])
    baselines = {TABLE: baseline, HOURLY: statistics.median(times["hourly pipe"])}
    hourly_rows = args.hours * args.hourly_rows
    print(
        f"\ncampaign_bench: {args.rows:,} rows, 365 daily chunks, replace into an indexed target "
        f"in another database, ledger in the target database; hourly: {hourly_rows:,} rows, "
        f"{args.hours:,} hourly chunks of {args.hourly_rows}, its own pipe; median of "
        f"{args.repeat}; Postgres {server[0] if server else '?'}, psycopg {psycopg.__version__}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(
        f"{'run':<45} {'seconds':>8} {'x pipe':>7} {'goal':>6} {'cpu all':>8} {'cpu cli':>8}"
        "  load (1/5/15 min) before"
    )
    labels = {
        "pipe": "psql text pipe (baseline)",
        "w1": "dpone run internal, 1 worker",
        "w4": "dpone run internal, 4 workers",
        "summary": f"summary {ITEMS} items x {POOL} processes",
        "hourly pipe": "hourly: psql text pipe (its baseline)",
        "hourly w4": f"hourly: internal, 4 workers, {args.hours:,} chunks",
    }
    labels.update({f"{k} (compared)": f"{v} [compared]" for k, v in list(labels.items())})
    labels["w1 (read-ahead off)"] = f"{labels['w1']} [{READ_AHEAD_OFF}=0]"
    labels.update({name: f"{labels['w1']} [{name[4:-1]}]" for name in GATE_LEVELS})
    labels[RELAY["w1"]] = "  estimate: relay + ledger, no dpone code"
    labels[RELAY["w4"]] = "  estimate: relay, 4 processes, no dpone code"
    labels[RELAY["summary"]] = f"  estimate: relay, {ITEMS} interpreters x {POOL}, no dpone"
    report: dict[str, Any] = {
        "rows": args.rows,
        "repeat": args.repeat,
        "shapes": {
            "daily": {"rows": expected[TABLE][0], "chunks": 365, "baseline": "pipe"},
            "hourly": {
                "rows": expected[HOURLY][0],
                "chunks": args.hours,
                "rows_per_chunk": args.hourly_rows,
                "baseline": "hourly pipe",
                "runs": [name for name in times if name.startswith("hourly")],
            },
        },
        "runs": {},
    }
    met = True
    for name, values in times.items():
        median = statistics.median(values)
        ratio = baselines[shape_of(name)[0]] / median
        goal = None if name.endswith("(compared)") else GOALS.get(name)
        met = met and (goal is None or ratio >= goal)
        shown = f">={goal:.2f}" if goal else ""
        busy = statistics.median(m for m, _ in run_cpu[name])
        clients = statistics.median(c for _, c in run_cpu[name])
        print(
            f"{labels[name]:<45} {median:>8.2f} {ratio:>7.2f} {shown:>6} {busy:>8.2f} "
            f"{clients:>8.2f}  {loads[name][0]}"
        )
        report["runs"][name] = {
            "seconds": round(median, 3),
            "machine_cpu_s": round(busy, 3),
            "client_cpu_s": round(clients, 3),
            "vs_pipe": round(ratio, 3),
            "all_seconds": [round(v, 3) for v in values],
            "load": loads[name],
        }
        if goal is not None:
            report["runs"][name].update(goal=goal, met=ratio >= goal)
    met = print_gate(times) and met
    noop_goal = noop_above_floor(measured, noop_load)
    met = met and noop_goal["met"]
    report["floors"] = print_floors(floors, baseline, measured, run_cpu)
    report["noop_goal"] = noop_goal
    report["noop"] = {
        name: {
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "all_wall_s": [round(w, 3) for w in walls],
        }
        for name, (wall, cpu, walls) in measured.items()
    }

    # Breakdown pass (timed separately: the timing hook itself costs a little).
    report["noop_breakdown"] = print_breakdown(
        NOOP_BREAKDOWN,
        noop_phases,
        1,
    )
    with timing_file(folder, "w1") as path:
        reset_target(dst)
        run_dpone(internal_command(catalog, "campaign_w1"), {**base, "DPONE_TIMING": str(path)})
        if table_facts(dst) != expected[TABLE]:
            raise SystemExit("breakdown run: wrong target")
        report["chunk_breakdown"] = print_breakdown(
            "per chunk, internal 1 worker (exclusive ms; round trips = server exchanges;"
            " copy_out runs on the read-ahead thread from the second chunk on, beside the"
            " others, and copy_in includes waiting for its blocks):",
            phase_totals(path),
            365,
        )
    print(f"\ngoals: {'all met' if met else 'NOT all met'}")
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
