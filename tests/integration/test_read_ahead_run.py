"""`dpone run` reads the next chunk ahead only where that was measured faster: an internal run
with one worker. Seen from the server: the source stamps each row with the time it was read
(``clock_timestamp()``), the ledger stamps each lease (``recorded_at`` of the RUNNING record), so
a chunk read ahead was read before its own lease, and any other chunk after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from dpone.cli import main
from dpone.connectors.base import ChunkWrite, ReadBackGate
from dpone.packing.pack import load_and_compile
from dpone.packing.verify import expected_identity

pytestmark = pytest.mark.postgres

DAYS = 6
CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow: {{image: example/dpone:1, mapping: {{mode: internal}}}}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source:
      connection: src
      query: SELECT order_id, order_date, amount, clock_timestamp() AS read_at FROM {s}.raw_orders
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
      read_back: count  # read_at differs on every read: a checksum could never match
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-0{end}}}
      inner_mode: replace
      parallel_workers: {workers}
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit}}
"""


@pytest.fixture
def schema(pg_dsn: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    name = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        conn.execute(
            f"CREATE TABLE {name}.raw_orders (order_id bigint PRIMARY KEY, order_date date NOT NULL,"
            " amount integer NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE {name}.orders (order_id bigint PRIMARY KEY, order_date date NOT NULL,"
            " amount integer NOT NULL, read_at timestamptz NOT NULL)"
        )
        conn.execute(
            f"INSERT INTO {name}.raw_orders SELECT g, date '2023-01-01' + (g % {DAYS}), g"
            " FROM generate_series(1, 600) g"
        )
    separator = "&" if "?" in pg_dsn else "?"  # another DSN text: the COPY path, not INSERT SELECT
    monkeypatch.setenv("DPONE_CONN_SRC", f"{pg_dsn}{separator}application_name=dpone_read_ahead")
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    monkeypatch.delenv("DPONE_AIRFLOW_MAPPING_ITEM", raising=False)
    monkeypatch.delenv("DPONE_AIRFLOW_RUN_IDENTITY", raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {name}_audit CASCADE")


def _run(tmp_path: Path, schema: str, workers: int, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "workloads.yaml").write_text(CATALOG.format())
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema, end=DAYS + 1, workers=workers))
    catalog = str(tmp_path / "workloads.yaml")
    code = main(["run", "--catalog", catalog, "--workload", "orders", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err


def _slow_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chunk's read-back check (a set-based group's too: it checks each of its chunks)
    lasts a quarter second more. A read ahead starts once the chunk's COPY has ended, so it
    overlaps the check, the completion and the commit: a few milliseconds here, which a loaded
    machine can take from the read-ahead's thread before it sends its statement. The wait makes
    the overlap certain; a read started after the next lease stays after it."""
    check = ReadBackGate.check

    def slow_check(gate: ReadBackGate, written: ChunkWrite) -> ChunkWrite:
        time.sleep(0.25)
        return check(gate, written)

    monkeypatch.setattr(ReadBackGate, "check", slow_check)


def _set_based(manifest: str) -> str:
    """The manifest moving set-based groups of at most two chunks (ADR 0022): the default
    checksum gate, with read_at (different on every read) left out of the content hash."""
    return manifest.replace(
        "read_back: count  # read_at differs on every read: a checksum could never match",
        "accept_narrowing: [read_at]  # differs on every read: out of the content hash",
    ).replace("inner_mode: replace", "inner_mode: replace\n      coalesce: {max_chunks: 2}")


def _read_before_leased(dsn: str, schema: str) -> dict[int, bool]:
    """Per chunk: were its rows read before its lease was recorded?"""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"""SELECT t.chunk_index, min(o.read_at) < min(t.recorded_at)
                FROM {schema}_audit.chunk_transition t
                JOIN {schema}.orders o ON o.order_date = date '2023-01-01' + t.chunk_index - 1
                WHERE t.state = 'running' GROUP BY t.chunk_index""").fetchall()
        source, target = conn.execute(
            f"SELECT (SELECT count(*) FROM {schema}.raw_orders),"
            f" (SELECT count(*) FROM {schema}.orders)"
        ).fetchone() or (0, 0)
    assert source == target == 600
    return {int(index): bool(early) for index, early in rows}


def test_one_worker_reads_every_next_chunk_ahead(
    schema: str,
    pg_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _slow_gate(monkeypatch)
    _run(tmp_path, schema, 1, capsys)
    early = _read_before_leased(pg_dsn, schema)
    assert early == {i: i > 1 for i in range(1, DAYS + 1)}  # all but the first


def test_a_mapped_item_reads_its_next_chunks_ahead(
    schema: str,
    pg_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _slow_gate(monkeypatch)
    (tmp_path / "workloads.yaml").write_text(
        CATALOG.format().replace(
            "mapping: {mode: internal}",
            "mapping: {mode: summary, max_items: 2, max_active: 2, pool: dpone_test}",
        )
    )
    manifest = MANIFEST.format(s=schema, end=DAYS + 1, workers=1)
    (tmp_path / "orders.yaml").write_text(
        manifest.replace("_audit}", "_audit, require_distributed_lock: true}")
    )
    catalog = str(tmp_path / "workloads.yaml")
    _, packs, problems = load_and_compile(catalog)
    assert not problems
    pack, plan = packs[0], packs[0].processes[0]
    for item in plan.mapping_plan.items:
        monkeypatch.setenv("DPONE_AIRFLOW_MAPPING_ITEM", plan.mapping_plan.item_env_value(item))
        monkeypatch.setenv(
            "DPONE_AIRFLOW_RUN_IDENTITY", expected_identity(pack, plan.name).env_value()
        )
        code = main(["run", "--catalog", catalog, "--workload", "orders", "--no-progress"])
        err = capsys.readouterr().err
        assert code == 0, err
    # two items of three chunks each: the first chunk of each item is read after its lease
    early = _read_before_leased(pg_dsn, schema)
    assert early == {1: False, 2: True, 3: True, 4: False, 5: True, 6: True}


def test_one_worker_reads_each_next_set_based_group_ahead(
    schema: str,
    pg_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set-based groups of at most two chunks (ADR 0022; read_at left out of the content hash):
    [1] alone (nothing known yet of a chunk's rows), during whose write [2, 3] is read ahead
    (sized by the rows chunk 1 copied), then [2, 3], during whose write [4, 5] is, then
    [4, 5], during whose write [6] is."""
    _slow_gate(monkeypatch)
    (tmp_path / "workloads.yaml").write_text(CATALOG.format())
    (tmp_path / "orders.yaml").write_text(
        _set_based(MANIFEST.format(s=schema, end=DAYS + 1, workers=1))
    )
    code = main(["run", "--catalog", str(tmp_path / "workloads.yaml"), "--workload", "orders"])
    assert code == 0, capsys.readouterr().err
    with psycopg.connect(pg_dsn) as conn:
        groups = conn.execute(
            f"SELECT array_agg(chunk_index ORDER BY chunk_index) FROM {schema}_audit.chunk_transition"
            " WHERE state = 'committed' GROUP BY xmin::text ORDER BY min(chunk_index)"
        ).fetchall()
    assert [g[0] for g in groups] == [[1], [2, 3], [4, 5], [6]]
    early = _read_before_leased(pg_dsn, schema)
    assert early == {1: False, 2: True, 3: True, 4: True, 5: True, 6: True}


def test_without_a_budget_every_chunk_is_read_after_its_lease(
    schema: str,
    pg_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPONE_READ_AHEAD_MB", "0")
    _run(tmp_path, schema, 1, capsys)
    assert _read_before_leased(pg_dsn, schema) == {i: False for i in range(1, DAYS + 1)}


def test_several_workers_do_not_read_ahead(
    schema: str, pg_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path, schema, 2, capsys)
    assert _read_before_leased(pg_dsn, schema) == {i: False for i in range(1, DAYS + 1)}


def test_a_bad_budget_is_refused_before_any_io(
    schema: str,
    pg_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPONE_READ_AHEAD_MB", "lots")
    (tmp_path / "workloads.yaml").write_text(CATALOG.format())
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema, end=DAYS + 1, workers=1))
    code = main(["run", "--catalog", str(tmp_path / "workloads.yaml"), "--workload", "orders"])
    err = capsys.readouterr().err
    assert code != 0
    assert "DPONE_CONFIG_INVALID" in err and "DPONE_READ_AHEAD_MB" in err
    assert "Traceback" not in err
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f"{schema}_audit.chunk_transition",))
        assert found.fetchone() == (None,)  # the ledger was never created: no I/O happened


# A stop's cancels go out one after another; one landing on the statement that records the
# chunk's release left the chunk RUNNING (seen once in CI). This makes that release fail once.
CANCELLED_RELEASE = """\
from dpone import errors
from dpone.errors import DponeError
from dpone.lifecycle.interrupt import STOP
from dpone.ledger import sql

_complete = sql.SqlLedger.complete
_met = []


def complete(self, lease, chunk, result):
    if STOP.requested and not result.committed and not _met:
        _met.append(chunk.index)
        raise DponeError(errors.LEDGER_UNAVAILABLE, "canceling statement due to user request")
    return _complete(self, lease, chunk, result)


sql.SqlLedger.complete = complete
"""


# Each chunk's read-back check lasts a quarter second more (see _slow_gate), in the run's process.
SLOW_GATE = """\
import time

from dpone.connectors.base import ReadBackGate

_check = ReadBackGate.check


def check(self, written):
    time.sleep(0.25)
    return _check(self, written)


ReadBackGate.check = check
"""


def _hanging_read(schema: str, order_id: int) -> str:
    """The manifest whose source row ``order_id`` sleeps a minute on the server when read."""
    return MANIFEST.format(s=schema, end=DAYS + 1, workers=1).replace(
        f"FROM {schema}.raw_orders",
        f"FROM {schema}.raw_orders WHERE CASE WHEN order_id = {order_id}"
        " THEN pg_sleep(60) IS NOT NULL ELSE true END",
    )


def _stop_while_reading(
    pg_dsn: str,
    schema: str,
    tmp_path: Path,
    manifest: str,
    site: str | None,
    leased: int,
    seen: Callable[[], object] = lambda: None,
) -> dict[int, str]:
    """Run ``manifest`` in a process (``site`` as its sitecustomize), wait until chunk
    ``leased`` is leased and its read hangs, call ``seen``, send SIGTERM; the run must stop
    within seconds as interrupted, with no hanging read left on the server. Returns each
    chunk's last ledger state."""
    (tmp_path / "workloads.yaml").write_text(CATALOG.format())
    (tmp_path / "orders.yaml").write_text(manifest)
    env = {k: v for k, v in os.environ.items() if k.startswith("DPONE_CONN_") or k == "PATH"}
    env["DPONE_XCOM_PATH"] = str(tmp_path / "xcom.json")
    if site is not None:
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(site)
        env["PYTHONPATH"] = str(tmp_path / "site")
    err = (tmp_path / "stderr.txt").open("w")
    args = ["run", "--catalog", str(tmp_path / "workloads.yaml"), "--workload", "orders"]
    run = subprocess.Popen(
        [sys.executable, "-m", "dpone", *args, "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    try:
        deadline = time.monotonic() + 30
        while not _leased(pg_dsn, schema, leased):
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
        seen()
        signalled = time.monotonic()
        run.send_signal(signal.SIGTERM)
        code = run.wait(30)
        stop_s = time.monotonic() - signalled
    finally:
        if run.poll() is None:
            run.kill()
        err.close()
    text = (tmp_path / "stderr.txt").read_text()
    assert code == 143, text
    assert stop_s < 5.0, f"stopped {stop_s:.1f}s after SIGTERM"
    assert "DPONE_RUN_INTERRUPTED" in text and "Traceback" not in text
    with psycopg.connect(pg_dsn) as conn:
        states = {
            int(index): str(state)
            for index, state in conn.execute(
                f"SELECT DISTINCT ON (chunk_index) chunk_index, state"
                f" FROM {schema}_audit.chunk_transition ORDER BY chunk_index, transition DESC"
            ).fetchall()
        }
        sleeping = conn.execute(  # this test's reads only: others run beside it
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dpone_read_ahead'"
            " AND state = 'active' AND position(%s in query) > 0",
            (f"{schema}.raw_orders",),
        ).fetchone()
    assert sleeping == (0,)  # the server's reads were cancelled, not left running
    return states


@pytest.mark.parametrize("coalesce", [False, True], ids=["alone", "coalesced"])
@pytest.mark.parametrize("release", ["as is", "cancelled once"])
def test_sigterm_while_waiting_for_a_read_ahead_stops_at_once(
    schema: str, pg_dsn: str, tmp_path: Path, release: str, coalesce: bool
) -> None:
    """The next chunk's read hangs on the server; SIGTERM arrives while the worker waits for it:
    the read is cancelled, not started again, the chunk released, and the run stops within
    seconds; also when the first attempt to record the release meets a cancel. Coalesced
    (ADR 0022), chunks 1 to 3 are one group: all three are rolled back and released."""
    manifest = _hanging_read(schema, 2)  # order_id 2 is on day 3 (g % 6)
    if not coalesce:
        manifest = manifest.replace(
            "inner_mode: replace", "inner_mode: replace\n      coalesce: false"
        )
    site = CANCELLED_RELEASE if release == "cancelled once" else None
    states = _stop_while_reading(pg_dsn, schema, tmp_path, manifest, site, leased=3)
    done = "failed" if coalesce else "committed"  # a group is rolled back as a whole
    assert states == {1: done, 2: done, 3: "failed"}  # released, not stuck


def test_sigterm_while_waiting_for_a_set_based_groups_read_ahead_stops_at_once(
    schema: str, pg_dsn: str, tmp_path: Path
) -> None:
    """Set-based groups of two (ADR 0022): [1], [2, 3], then [4, 5], whose span is read ahead
    while [2, 3] is read back and committed. That read hangs on the server (a row of chunk 4
    sleeps a minute); SIGTERM arrives while the worker waits for it inside [4, 5]'s
    transaction: the read is cancelled, the group rolled back and its chunks released, and the
    run stops within seconds."""
    manifest = _set_based(_hanging_read(schema, 3))  # order_id 3 is on day 4 (g % 6)
    started: list[tuple[datetime | None, datetime | None]] = []

    def read_ahead_started() -> None:  # the hanging COPY against [2, 3]'s completion
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute(
                "SELECT (SELECT query_start FROM pg_stat_activity"
                " WHERE application_name = 'dpone_read_ahead' AND state = 'active'"
                " AND query LIKE 'COPY %%' AND position(%s in query) > 0),"
                f" (SELECT recorded_at FROM {schema}_audit.chunk_transition"
                " WHERE chunk_index = 3 AND state = 'committed')",
                (f"{schema}.raw_orders",),
            ).fetchone()
        assert row is not None
        started.append((row[0], row[1]))

    states = _stop_while_reading(
        pg_dsn, schema, tmp_path, manifest, SLOW_GATE, leased=4, seen=read_ahead_started
    )
    ((read_at, moved_at),) = started
    assert read_at is not None and moved_at is not None
    assert read_at < moved_at  # [4, 5] was read ahead, while [2, 3] was checked
    done = {1: "committed", 2: "committed", 3: "committed"}
    assert states == {**done, 4: "failed", 5: "failed"}  # released, not stuck; 6 not started
    with psycopg.connect(pg_dsn) as conn:
        held = conn.execute(
            f"SELECT count(*) FROM {schema}.orders WHERE order_date >= date '2023-01-04'"
        ).fetchone()
    assert held == (0,)  # the group's rows went with its transaction


def _leased(dsn: str, schema: str, index: int) -> bool:
    """The chunk is leased: a committed RUNNING record (the split placement), or its lock held
    by the one-commit transaction that moves it (ADR 0021)."""
    from dpone.ledger.postgres import PostgresLedger

    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{schema}_audit.chunk_transition",)
        ).fetchone()
    if found and found[0]:
        store = PostgresLedger(dsn, f"{schema}_audit", create=False)
        try:
            if any(index in store.chunk_lock_holders(k) for k in store.list_campaigns()):
                return True
        finally:
            store.close()
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{schema}_audit.chunk_transition",)
        ).fetchone()
        if not found or not found[0]:
            return False
        row = conn.execute(
            f"SELECT count(*) FROM {schema}_audit.chunk_transition"
            " WHERE chunk_index = %s AND state = 'running'",
            (index,),
        ).fetchone()
    return bool(row and row[0])
