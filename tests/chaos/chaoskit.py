"""The chaos harness: real `dpone run` processes for the items of one summary campaign, crashed
(SIGKILL) at named fault points and at random times, stalled past their lease (SIGSTOP), and
restarted until the campaign completes; then the invariants are checked against Postgres (and,
for the MySQL-sink variant, against MariaDB/MySQL).

Invariants after every campaign:
  * the target equals the source: row count and an order-independent checksum, per chunk;
  * every chunk has exactly one COMMITTED transition in the ledger;
  * every completion was written by the lease's owner: it directly follows that owner's RUNNING
    transition of the same attempt (no completion by a stale owner);
  * no advisory lock is left on either database once the processes are gone;
  * every process either exited 0, was killed by the harness, or failed with a structured,
    retryable dpone.error.v1 line (never a traceback).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from dpone import errors
from dpone.packing.pack import ProcessPlan, load_and_compile
from dpone.packing.verify import expected_identity
from psycopg import sql

HERE = Path(__file__).resolve().parent
CATALOG = HERE / "project" / "workloads.yaml"
DPONE = Path(sys.executable).with_name("dpone")
DATA_DB = "dpone_chaos"  # prefixes: each test process gets <prefix>_<pid>
LEDGER_DB = "dpone_chaos_ledger"
ROWS_PER_DAY = 150
DAYS = 60
LEASE_SECONDS = 5
RETRYABLE = {
    errors.CHUNK_BUSY,
    errors.CHUNK_LEASE_LOST,
    errors.MAPPING_CAMPAIGN_BUSY,
    errors.CONNECTION_FAILED,
}


@dataclass(frozen=True)
class Variant:
    workload: str
    sink_table: str
    audit_schema: str
    split_ledger: bool  # the ledger lives in another database than the sink
    points: tuple[str, ...]  # fault points this variant can reach
    stalls: bool  # SIGSTOP a process past its lease to make stale owners
    mysql: bool = False  # the sink is the MariaDB/MySQL database DPONE_CONN_CHAOS_MYSQL


SAME = Variant(
    "chaos_same",
    "dst_same",
    "chaos_audit_same",
    False,
    ("campaign_locked", "lease_locked", "chunk_written", "group_closed"),
    stalls=False,
)
# The same placement with inner_mode replace: a worker's chunks move as set-based groups (one
# delete, one copy, one grouped checksum a side, the group's leases and completions in one round
# trip each: ADR 0022).
SAME_SET = Variant(
    "chaos_same_set",
    "dst_same_set",
    "chaos_audit_same_set",
    False,
    ("campaign_locked", "lease_locked", "chunk_leased", "chunk_written", "group_closed"),
    stalls=False,
)
SPLIT = Variant(
    "chaos_split",
    "dst_split",
    "chaos_audit_split",
    True,
    (
        "campaign_locked",
        "lease_locked",
        "chunk_leased",
        "sink_written",
        "data_committed",
        "close_locked",
    ),
    stalls=True,
)


MYSQL = Variant(
    "chaos_mysql",
    "dst_mysql",
    "chaos_audit_mysql",
    True,
    (
        "campaign_locked",
        "lease_locked",
        "chunk_leased",
        "sink_written",
        "data_committed",
        "close_locked",
    ),
    stalls=True,
    mysql=True,
)
MYSQL_DB = "dpone_chaos_my"


# --- databases -----------------------------------------------------------------------------------


def dsn_for(base_dsn: str, database: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(base_dsn)
    info["dbname"] = database
    return psycopg.conninfo.make_conninfo(**info)


def ensure_database(base_dsn: str, database: str) -> str:
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not found:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return dsn_for(base_dsn, database)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def private_database(base_dsn: str, prefix: str) -> Iterator[str]:
    """A database of this test process only (``<prefix>_<pid>``), dropped afterwards; leftovers
    of dead test processes are dropped first. Concurrent test runs never share tables."""
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (prefix + "\\_%",)
        ).fetchall():
            suffix = name[len(prefix) + 1 :]
            if suffix.isdigit() and not _pid_alive(int(suffix)):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
    name = f"{prefix}_{os.getpid()}"
    dsn = ensure_database(base_dsn, name)
    try:
        yield dsn
    finally:
        with psycopg.connect(base_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def dbname(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def as_url(dsn: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    password = f":{info['password']}" if info.get("password") else ""
    return (
        f"postgresql://{info.get('user', 'postgres')}{password}@{info.get('host', '127.0.0.1')}"
        f":{info.get('port', '5432')}/{info['dbname']}"
    )


def seed(data_dsn: str, rows_per_day: int = ROWS_PER_DAY, days: int = DAYS) -> None:
    """chaos.src, deterministic rows over ``days`` days; neither target has a unique key, so a
    duplicate (an append twice, or a stale replace committing next to its successor) shows."""
    with psycopg.connect(data_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS chaos CASCADE")
        conn.execute("CREATE SCHEMA chaos")
        conn.execute(
            "CREATE TABLE chaos.src (id bigint PRIMARY KEY, d date NOT NULL, "
            "amount numeric(12,2) NOT NULL, note text)"
        )
        conn.execute(
            "INSERT INTO chaos.src SELECT g, date '2023-01-01' + ((g - 1) / %s)::int, "
            "round((g * 7919 %% 100000) / 100.0, 2), CASE WHEN g %% 13 = 0 THEN NULL "
            "ELSE md5(g::text) END FROM generate_series(1, %s) AS g",
            (rows_per_day, rows_per_day * days),
        )
        conn.execute(
            "CREATE TABLE chaos.dst_same (id bigint NOT NULL, d date NOT NULL, "
            "amount numeric(12,2) NOT NULL, note text)"
        )
        conn.execute("CREATE INDEX ON chaos.dst_same (d)")
        conn.execute(
            "CREATE TABLE chaos.dst_same_set (id bigint NOT NULL, d date NOT NULL, "
            "amount numeric(12,2) NOT NULL, note text)"
        )
        conn.execute("CREATE INDEX ON chaos.dst_same_set (d)")
        conn.execute(
            "CREATE TABLE chaos.dst_split (id bigint NOT NULL, d date NOT NULL, "
            "amount numeric(12,2) NOT NULL, note text)"
        )
        conn.execute("CREATE INDEX ON chaos.dst_split (d)")


def reset_campaign(
    data_dsn: str, ledger_dsn: str, variant: Variant, mysql_dsn: str | None = None
) -> None:
    if variant.mysql:
        assert mysql_dsn is not None
        with _mysql(mysql_dsn) as conn, conn.cursor() as cur:
            cur.execute(f"TRUNCATE TABLE `{variant.sink_table}`")
    else:
        with psycopg.connect(data_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("TRUNCATE chaos.{}").format(sql.Identifier(variant.sink_table)))
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(variant.audit_schema))
        )


CHECKSUM = (
    "SELECT d, count(*), coalesce(sum(('x' || substr(md5(concat_ws('|', id, d, amount, "
    "coalesce(note, '<null>'))), 1, 15))::bit(60)::bigint), 0) FROM chaos.{} GROUP BY d"
)


def per_day(data_dsn: str, table: str) -> dict[Any, tuple[int, int]]:
    with psycopg.connect(data_dsn) as conn:
        rows = conn.execute(sql.SQL(CHECKSUM).format(sql.Identifier(table))).fetchall()
    return {r[0]: (int(r[1]), int(r[2])) for r in rows}


def table_fingerprint(data_dsn: str, table: str) -> tuple[int, int]:
    days = per_day(data_dsn, table)
    return sum(c for c, _ in days.values()), sum(s for _, s in days.values())


# --- MariaDB/MySQL sink ----------------------------------------------------------------------------


@contextlib.contextmanager
def _mysql(dsn: str) -> Iterator[Any]:
    import pymysql
    from dpone.connectors.mysql import parse_dsn

    conn = pymysql.connect(**parse_dsn(dsn).connect_args(), autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


@contextlib.contextmanager
def private_mysql_database(server_dsn: str) -> Iterator[str]:
    """``dpone_chaos_my_<pid>`` on the MySQL server with the sink table, dropped afterwards
    (leftovers of dead test processes first); yields its DSN."""
    with _mysql(server_dsn) as conn, conn.cursor() as cur:
        cur.execute("SHOW DATABASES LIKE %s", (MYSQL_DB + "\\_%",))
        for (name,) in cur.fetchall():
            suffix = name[len(MYSQL_DB) + 1 :]
            if suffix.isdigit() and not _pid_alive(int(suffix)):
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        name = f"{MYSQL_DB}_{os.getpid()}"
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        cur.execute(
            f"CREATE TABLE `{name}`.`{MYSQL.sink_table}` (id bigint NOT NULL, d date NOT NULL, "
            "amount decimal(12,2) NOT NULL, note longtext, KEY (d)) ENGINE=InnoDB"
        )
    try:
        yield server_dsn.split("?", 1)[0].rstrip("/") + "/" + name
    finally:
        with _mysql(server_dsn) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


MYSQL_CHECKSUM = (
    "SELECT d, count(*), coalesce(sum(CAST(conv(substr(md5(concat_ws('|', id, d, amount, "
    "coalesce(note, '<null>'))), 1, 15), 16, 10) AS UNSIGNED)), 0) FROM `{}` GROUP BY d"
)


def per_day_mysql(mysql_dsn: str, table: str) -> dict[Any, tuple[int, int]]:
    """per_day's figures computed by MySQL (the same md5 prefix, summed as a number)."""
    with _mysql(mysql_dsn) as conn, conn.cursor() as cur:
        cur.execute(MYSQL_CHECKSUM.format(table))
        return {r[0]: (int(r[1]), int(r[2])) for r in cur.fetchall()}


def open_mysql_transactions(mysql_dsn: str, timeout: float = 30.0) -> list[tuple[Any, ...]]:
    """Transactions still open on the chaos database after every process is gone (a killed
    client's session must end; its row locks with it), waited for up to ``timeout`` s."""
    database = mysql_dsn.rsplit("/", 1)[-1]
    deadline = time.monotonic() + timeout
    while True:
        with _mysql(mysql_dsn) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT t.trx_id, t.trx_state, p.ID FROM information_schema.INNODB_TRX AS t "
                "JOIN information_schema.PROCESSLIST AS p ON p.ID = t.trx_mysql_thread_id "
                "WHERE p.DB = %s AND p.ID <> CONNECTION_ID()",
                (database,),
            )
            left = [tuple(r) for r in cur.fetchall()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def advisory_locks(dsn: str, databases: tuple[str, ...]) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT d.datname, l.classid, l.objid, l.pid, l.granted FROM pg_locks AS l "
            "JOIN pg_database AS d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND d.datname = ANY(%s)",
            (list(databases),),
        ).fetchall()
    return [tuple(r) for r in rows]


def wait_no_advisory_locks(dsn: str, databases: tuple[str, ...], timeout: float = 10.0) -> None:
    """Killed clients' backends go away once the server sees the closed socket (fast, local)."""
    deadline = time.monotonic() + timeout
    while True:
        held = advisory_locks(dsn, databases)
        if not held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"advisory locks left behind: {held}")
        time.sleep(0.2)


def ledger_transitions(ledger_dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(ledger_dsn) as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sql.SQL(
                    "SELECT chunk_index, transition, state, attempt, lease_owner "
                    "FROM {}.chunk_transition ORDER BY chunk_index, transition"
                ).format(sql.Identifier(schema))
            ).fetchall()
        ]


# --- the plan ------------------------------------------------------------------------------------


def plan_of(workload: str) -> ProcessPlan:
    _, packs, problems = load_and_compile(str(CATALOG))
    assert not problems, problems
    (pack,) = [p for p in packs if p.workload.name == workload]
    return pack.processes[0]


def stopped(proc: subprocess.Popen[bytes]) -> bool:
    """The process sits stopped (SIGSTOP, a ``:stop`` fault point), read from /proc."""
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def item_env(workload: str, item: str) -> dict[str, str]:
    """The provider-owned env of one mapped item, as the generated DAG passes it."""
    _, packs, problems = load_and_compile(str(CATALOG))
    assert not problems, problems
    (pack,) = [p for p in packs if p.workload.name == workload]
    identity = expected_identity(pack, pack.processes[0].name).env_value()
    return {"DPONE_AIRFLOW_MAPPING_ITEM": item, "DPONE_AIRFLOW_RUN_IDENTITY": identity}


# --- processes -----------------------------------------------------------------------------------


@dataclass
class Launch:
    item: int
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    started: float
    fault: str
    twin: bool = False  # launched for an item whose first process is stalled
    kill_at: float | None = None
    stop_at: float | None = None
    stalled_at: float | None = None
    twin_launched: Launch | None = None
    stops_seen: int = 0
    killed_by_harness: bool = False

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="backslashreplace")

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)


@dataclass
class CampaignReport:
    variant: str
    launches: int = 0
    exits: Counter[str] = field(default_factory=Counter)
    points_fired: Counter[str] = field(default_factory=Counter)
    random_kills: int = 0
    stops_at_point: Counter[str] = field(default_factory=Counter)
    stalls: int = 0
    twins: int = 0
    retryable_codes: Counter[str] = field(default_factory=Counter)
    duration_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(self.points_fired.values()) + self.random_kills

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "launches": self.launches,
            "kills": self.kills,
            "points_fired": dict(self.points_fired),
            "random_kills": self.random_kills,
            "stops_at_point": dict(self.stops_at_point),
            "stalls": self.stalls,
            "twins": self.twins,
            "exits": dict(self.exits),
            "retryable_codes": dict(self.retryable_codes),
            "duration_s": round(self.duration_s, 1),
        }


class Campaign:
    """Supervises the processes of one campaign until every item has exited 0 once.

    One process per unfinished item; a killed or failed one is restarted after a short pause.
    A stalled one (SIGSTOP, by the harness or by a ``:stop`` fault point) is left stopped past
    its lease; then a twin process for the same item is started (an Airflow retry of a zombie
    task) and the stalled one is resumed once the twin has ended: its completion must be refused
    (DPONE_BACKFILL_CHUNK_LEASE_LOST) whenever the twin took its chunk over.
    """

    def __init__(
        self,
        variant: Variant,
        env: dict[str, str],
        rng: random.Random,
        workdir: Path,
        *,
        fault_probability: float = 0.07,
        random_kill_rate: float = 0.3,
        stall_rate: float = 0.05,
        deadline_s: float = 150.0,
    ) -> None:
        self.variant = variant
        self.env = env
        self.rng = rng
        self.workdir = workdir
        self.plan = plan_of(variant.workload)
        assert self.plan.mapping_plan is not None
        self.items = [
            self.plan.mapping_plan.item_env_value(i) for i in self.plan.mapping_plan.items
        ]
        self.fault_probability = fault_probability
        self.random_kill_rate = random_kill_rate
        self.stall_rate = stall_rate if variant.stalls else 0.0
        self.deadline_s = deadline_s
        self.report = CampaignReport(variant.workload)
        # Each point is forced once per campaign (deterministic coverage); the split variant
        # also stalls once right after a data commit, the classic stale-owner moment.
        self.forced = [f"{p}:1" for p in variant.points]
        if variant.stalls:
            # Stale owners at the three moments of the split placement: leased but not yet in
            # the sink, inside the open sink transaction (the fence's case), and committed
            # without a completion record.
            self.forced += ["chunk_leased:1:stop", "sink_written:1:stop", "data_committed:1:stop"]
        self.rng.shuffle(self.forced)

    def _fault_spec(self, twin: bool) -> str:
        if twin:
            return ""
        if self.forced and self.rng.random() < 0.5:
            return self.forced.pop()
        return ",".join(f"{p}:{self.fault_probability}" for p in self.variant.points)

    def _launch(self, item: int, twin: bool = False) -> Launch:
        fault = self._fault_spec(twin)
        fd, path = tempfile.mkstemp(prefix=f"item{item}-", suffix=".err", dir=self.workdir)
        env = {**self.env, **item_env(self.variant.workload, self.items[item])}
        if fault:
            env["DPONE_TEST_FAULT"] = fault
        argv = [str(DPONE), "run", "--catalog", str(CATALOG), "--workload", self.variant.workload]
        argv += ["--process", self.plan.name, "--lock-timeout", "10", "--no-progress"]
        with os.fdopen(fd, "wb") as err:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        now = time.monotonic()
        launch = Launch(item, proc, Path(path), now, fault, twin=twin)
        forced = fault.split(":")[1:2] == ["1"]  # a forced point must be reached, not preempted
        if twin or forced:
            pass
        elif self.rng.random() < self.random_kill_rate:
            launch.kill_at = now + self.rng.uniform(0.5, 3.0)
        elif self.rng.random() < self.stall_rate:
            launch.stop_at = now + self.rng.uniform(0.5, 2.0)
        self.report.launches += 1
        self.report.twins += int(twin)
        return launch

    def _finish(self, launch: Launch) -> bool:
        """Account for an exited process; True when it completed its item."""
        code = launch.proc.returncode
        text = launch.stderr()
        if "Traceback" in text:
            self.report.problems.append(f"item {launch.item}: traceback:\n{text[-2000:]}")
        if code == -signal.SIGKILL:
            fired = [
                line.rsplit(" ", 1)[-1]
                for line in text.splitlines()
                if line.startswith("dpone: test fault: SIGKILL at ")
            ]
            if fired:
                self.report.points_fired[fired[-1]] += 1
                self.report.exits["killed_at_point"] += 1
            elif launch.killed_by_harness:
                self.report.random_kills += 1
                self.report.exits["killed_random"] += 1
            else:
                self.report.problems.append(f"item {launch.item}: SIGKILL from nowhere: {text}")
            return False
        self.report.exits[str(code)] += 1
        if code == 0:
            return True
        lines = [line for line in text.splitlines() if line.startswith("{")]
        if not lines:
            self.report.problems.append(
                f"item {launch.item}: exit {code} without error JSON: {text[-1500:]}"
            )
            return False
        record = json.loads(lines[-1])
        if record.get("schema") != "dpone.error.v1" or record.get("code") not in RETRYABLE:
            self.report.problems.append(f"item {launch.item}: exit {code}: {record}")
        elif code != 4:
            self.report.problems.append(f"item {launch.item}: retryable {record} but exit {code}")
        else:
            self.report.retryable_codes[record["code"]] += 1
        return False

    def _stalled(self, launch: Launch, now: float) -> None:
        """Notice a process stopped by its own ``:stop`` fault point. The first stop makes a
        stale owner (twin, then resume); a ``:stop`` point fires again at the next chunk, and
        those later stops are resumed at once."""
        text = launch.stderr()
        stops = text.count("SIGSTOP at ")
        if stops <= launch.stops_seen:
            return
        launch.stops_seen = stops
        if stops == 1:
            fired = text.rsplit("SIGSTOP at ", 1)[-1].split()[0]
            self.report.stops_at_point[fired] += 1
            launch.stalled_at = now
            self.report.stalls += 1
        else:
            launch.resume()

    def _abort(self, live: list[Launch], done: set[int]) -> None:
        states = [
            f"item {x.item} twin={x.twin} fault={x.fault!r} stalled_at={x.stalled_at} "
            f"age={time.monotonic() - x.started:.1f}s stderr={x.stderr()[-300:]!r}"
            for x in live
        ]
        self.report.problems.extend(states)
        for launch in live:
            launch.resume()
            with contextlib.suppress(ProcessLookupError):
                launch.proc.kill()
            launch.proc.wait()
        raise AssertionError(
            f"{self.variant.workload}: campaign not complete after {self.deadline_s}s "
            f"(done {sorted(done)}): {self.report.to_json()} {self.report.problems[-5:]}"
        )

    def run(self) -> CampaignReport:
        started = time.monotonic()
        done: set[int] = set()
        live: list[Launch] = []
        not_before: dict[int, float] = {}
        while len(done) < len(self.items) or live:
            now = time.monotonic()
            if now - started > self.deadline_s:
                self._abort(live, done)
            busy_items = {launch.item for launch in live}
            for item in range(len(self.items)):
                if item in done or item in busy_items or not_before.get(item, 0.0) > now:
                    continue
                live.append(self._launch(item))
            for launch in list(live):
                if launch.proc.poll() is not None:
                    live.remove(launch)
                    if self._finish(launch):
                        done.add(launch.item)
                    else:
                        not_before[launch.item] = time.monotonic() + self.rng.uniform(0.2, 1.0)
                    launch.stderr_path.unlink(missing_ok=True)
                    continue
                self._stalled(launch, now)
                if launch.kill_at is not None and now >= launch.kill_at:
                    launch.killed_by_harness = True
                    launch.kill_at = None
                    launch.resume()
                    with contextlib.suppress(ProcessLookupError):
                        launch.proc.kill()
                elif launch.stop_at is not None and now >= launch.stop_at:
                    launch.stop_at = None
                    launch.stalled_at = now
                    self.report.stalls += 1
                    with contextlib.suppress(ProcessLookupError):
                        launch.proc.send_signal(signal.SIGSTOP)
                elif launch.stalled_at is not None:
                    twin = launch.twin_launched
                    if twin is None and now >= launch.stalled_at + LEASE_SECONDS + 0.5:
                        if launch.item not in done:
                            launch.twin_launched = self._launch(launch.item, twin=True)
                            live.append(launch.twin_launched)
                        else:
                            launch.stalled_at = None
                            launch.resume()
                    elif twin is not None and (
                        twin.proc.poll() is not None or now >= twin.started + 15.0
                    ):
                        launch.stalled_at = None
                        launch.resume()
            time.sleep(0.03)
        self.report.duration_s = time.monotonic() - started
        return self.report


# --- invariants ----------------------------------------------------------------------------------


def check_invariants(
    base_dsn: str, data_dsn: str, ledger_dsn: str, variant: Variant, mysql_dsn: str | None = None
) -> None:
    plan = plan_of(variant.workload)
    # 1. target == source, per chunk (a day) and in total.
    source = per_day(data_dsn, "src")
    if variant.mysql:
        assert mysql_dsn is not None
        target = per_day_mysql(mysql_dsn, variant.sink_table)
    else:
        target = per_day(data_dsn, variant.sink_table)
    assert target == source, {
        d: (source.get(d), target.get(d))
        for d in sorted(set(source) | set(target), key=str)
        if source.get(d) != target.get(d)
    }
    if not variant.mysql:
        assert table_fingerprint(data_dsn, variant.sink_table) == table_fingerprint(data_dsn, "src")
    else:  # per chunk equal, so in total too; and no killed client's transaction is left open
        assert open_mysql_transactions(str(mysql_dsn)) == []
    # 2. exactly one COMMITTED per chunk; 3. every completion by the lease's owner.
    transitions = ledger_transitions(ledger_dsn, variant.audit_schema)
    by_chunk: dict[int, list[tuple[Any, ...]]] = {}
    for row in transitions:
        by_chunk.setdefault(row[0], []).append(row)
    assert sorted(by_chunk) == list(range(1, plan.chunks_total + 1))
    for index, rows in by_chunk.items():
        assert [r[1] for r in rows] == list(range(1, len(rows) + 1)), f"chunk {index}: gaps {rows}"
        committed = [r for r in rows if r[2] == "committed"]
        assert len(committed) == 1, f"chunk {index} committed {len(committed)} times: {rows}"
        assert rows[-1][2] == "committed", f"chunk {index} ends {rows[-1]}"
        for position, row in enumerate(rows):
            if row[2] in ("committed", "failed"):
                before = rows[position - 1]
                assert position > 0 and before[2] == "running", f"chunk {index}: {rows}"
                assert (before[3], before[4]) == (row[3], row[4]), (
                    f"chunk {index}: completion by {row[4]} attempt {row[3]} after the lease "
                    f"of {before[4]} attempt {before[3]} (a stale owner completed): {rows}"
                )
        attempts = [r[3] for r in rows]
        assert attempts == sorted(attempts), f"chunk {index}: attempts go back {rows}"
    # 4. no advisory lock left behind.
    wait_no_advisory_locks(base_dsn, tuple(sorted({dbname(data_dsn), dbname(ledger_dsn)})))


def attempts_histogram(ledger_dsn: str, schema: str) -> dict[int, int]:
    """How many chunks needed 1, 2, 3... attempts."""
    histogram: Counter[int] = Counter()
    last: dict[int, int] = {}
    for index, _, _, attempt, _ in ledger_transitions(ledger_dsn, schema):
        last[index] = attempt
    for attempt in last.values():
        histogram[attempt] += 1
    return dict(sorted(histogram.items()))
