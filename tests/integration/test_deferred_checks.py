"""A target's deferred checks run before the read-back gate, and fail the chunk as the sink's.

A deferred constraint, or a deferred constraint trigger, of the target waits for COMMIT: after
the gate read the chunk back, and (with the ledger in the sink's database) at the commit the
rows share with their ledger record. The sink runs them once the rows are written, so a refusal
is the sink's (named, the chunk recorded FAILED, the others committed) and a trigger that
rewrites a row at commit is seen by the gate. A check the sink cannot know of (a deferred key of
another table a plain trigger writes) still fails as the sink's at that commit, recorded. The
real `dpone` executable against the real Postgres; the target is compared with the source in SQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone import errors

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: wh, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2024-01-01, end: 2024-01-04}}
      inner_mode: {mode}
    state: {{backend: audit_schema, connection: {ledger}, schema: {s}_audit}}
"""
#: the ledger's connection: the sink's (one commit for rows and record) or another one (fenced)
PLACEMENTS = {"shared": "wh", "fenced": "led"}


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = "dc_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {name}.{table} (order_id bigint PRIMARY KEY, "
                "order_date date NOT NULL, note text NOT NULL)"
            )
        conn.execute(f"CREATE INDEX ON {name}.orders (order_date)")
        conn.execute(
            f"INSERT INTO {name}.raw_orders SELECT g, date '2024-01-01' + (g % 3), 'n' || g "
            "FROM generate_series(1, 30) g"
        )
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {name}_audit CASCADE")


def _run(
    pg_dsn: str, schema: str, root: Path, ledger: str, mode: str = "replace"
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    (root / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    manifest = MANIFEST.format(s=schema, ledger=ledger, mode=mode)
    (root / "orders.yaml").write_text(manifest, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update(DPONE_CONN_WH=pg_dsn, DPONE_CONN_LED=pg_dsn)
    argv = ["--catalog", "workloads.yaml", "--workload", "orders"]
    done = subprocess.run(
        [str(DPONE), "run", *argv, "--no-progress"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    status = subprocess.run(
        [str(DPONE), "ledger", "status", *argv, "--format", "json"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done, json.loads(status.stdout)


def _days(pg_dsn: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each table's rows per day, read in SQL."""
    with psycopg.connect(pg_dsn) as conn:
        return {
            table: conn.execute(
                f"SELECT order_id, order_date::text, note FROM {schema}.{table} ORDER BY order_id"
            ).fetchall()
            for table in ("raw_orders", "orders")
        }


def _committed_equal(pg_dsn: str, schema: str, day: str) -> None:
    """The target holds exactly the source's rows outside ``day`` (the failed chunk's)."""
    rows = _days(pg_dsn, schema)
    assert rows["orders"] == [r for r in rows["raw_orders"] if r[1] != day]


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_a_deferred_key_fails_its_chunk_as_the_sink(
    pg_dsn: str, schema: str, tmp_path: Path, placement: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # two notes of 2024-01-02 collide
        conn.execute(f"UPDATE {schema}.raw_orders SET note = 'twice' WHERE order_id IN (1, 4)")
        conn.execute(
            f"ALTER TABLE {schema}.orders ADD CONSTRAINT one_note UNIQUE (note) "
            "DEFERRABLE INITIALLY DEFERRED"
        )
    done, status = _run(pg_dsn, schema, tmp_path, PLACEMENTS[placement])
    assert done.returncode == 1, done.stderr
    record = json.loads(done.stderr.strip().splitlines()[-1])
    assert record["code"] == errors.SINK_FAILED, record
    assert f"sink 'wh' table '{schema}.orders'" in record["message"], record
    assert 'constraint "one_note"' in record["message"] and "chunk 2" in record["message"]
    assert status["counts"] == {"committed": 2, "failed": 1, "pending": 0, "running": 0}
    (failure,) = status["failures"]
    assert (failure["chunk_index"], failure["error_code"]) == (2, errors.SINK_FAILED), failure
    _committed_equal(pg_dsn, schema, "2024-01-02")


def test_a_deferred_key_of_another_table_fails_at_the_shared_commit_as_the_sink(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {schema}.parent (id int PRIMARY KEY)")
        conn.execute(
            f"CREATE TABLE {schema}.side (id bigint, parent int REFERENCES {schema}.parent "
            "DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.execute(
            f"CREATE FUNCTION {schema}.side_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.order_id = 4 THEN INSERT INTO {schema}.side VALUES (NEW.order_id, 42); "
            "END IF; RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER side_row AFTER INSERT ON {schema}.orders FOR EACH ROW "
            f"EXECUTE FUNCTION {schema}.side_row()"
        )
    done, status = _run(pg_dsn, schema, tmp_path, PLACEMENTS["shared"])
    assert done.returncode == 1, done.stderr
    record = json.loads(done.stderr.strip().splitlines()[-1])
    assert record["code"] == errors.SINK_FAILED, record  # not the ledger's error
    assert "the target refused the chunk's rows at the commit" in record["message"], record
    assert 'constraint "side_parent_fkey"' in record["message"], record
    assert status["counts"] == {"committed": 2, "failed": 1, "pending": 0, "running": 0}
    (failure,) = status["failures"]
    assert (failure["chunk_index"], failure["error_code"]) == (2, errors.SINK_FAILED), failure
    _committed_equal(pg_dsn, schema, "2024-01-02")


@pytest.mark.parametrize("mode", ["replace", "merge", "append"])
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_a_row_rewritten_at_commit_is_seen_by_the_gate(
    pg_dsn: str, schema: str, tmp_path: Path, placement: str, mode: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE FUNCTION {schema}.shout() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"UPDATE {schema}.orders SET note = upper(note) WHERE order_id = NEW.order_id "
            "AND NEW.order_id = 4; RETURN NULL; END $$"
        )
        conn.execute(
            f"CREATE CONSTRAINT TRIGGER shout AFTER INSERT ON {schema}.orders "
            f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.shout()"
        )
    done, status = _run(pg_dsn, schema, tmp_path, PLACEMENTS[placement], mode)
    assert done.returncode == 1, done.stderr  # never passed with 'N4' in the target
    record = json.loads(done.stderr.strip().splitlines()[-1])
    assert record["code"] == errors.READ_BACK_MISMATCH and "chunk 2" in record["message"], record
    assert status["counts"] == {"committed": 2, "failed": 1, "pending": 0, "running": 0}
    _committed_equal(pg_dsn, schema, "2024-01-02")
