"""No row value leaves when a chunk fails at the commit it shares with its ledger record.

With the ledger in the sink's database, the chunk's rows and its completion commit in one
transaction: a deferred constraint, or a deferred constraint trigger that RAISEs a message
formatted from ``NEW``, fails at that COMMIT, on the ledger's connection. Its primary message
holds row values; stderr, the run result (XCom) and the evidence must not. The real `dpone`
executable against the real Postgres.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"
VALUE = "RowValue-" + uuid.uuid4().hex[:8]

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
      inner_mode: replace
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit}}
"""


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = "rv_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {name}.{table} (order_id bigint PRIMARY KEY, "
                "order_date date NOT NULL, note text NOT NULL)"
            )
        conn.execute(
            f"INSERT INTO {name}.raw_orders SELECT g, date '2024-01-01' + (g % 3), "
            f"'{VALUE}-' || g FROM generate_series(1, 30) g"
        )
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {name}_audit CASCADE")


def _run(pg_dsn: str, schema: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`dpone run` of the project in ``tmp_path``; sink and ledger on one connection (one commit
    per chunk), the result and the evidence beside it."""
    (tmp_path / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update(
        DPONE_CONN_WH=pg_dsn,
        DPONE_XCOM_PATH=str(tmp_path / "xcom.json"),
        DPONE_EVIDENCE_DIR=str(tmp_path / "evidence"),
    )
    return subprocess.run(
        [str(DPONE), "run", "--catalog", "workloads.yaml", "--workload", "orders"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.parametrize("refusal", ["trigger", "unique"])
def test_a_failure_at_the_shared_commit_names_no_row_value(
    pg_dsn: str, schema: str, tmp_path: Path, refusal: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        if refusal == "trigger":
            conn.execute(
                f"CREATE FUNCTION {schema}.chk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.order_id = 29 THEN RAISE EXCEPTION 'bad row note=%', NEW.note; END IF; "
                "RETURN NEW; END $$"
            )
            conn.execute(
                f"CREATE CONSTRAINT TRIGGER chk AFTER INSERT ON {schema}.orders "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.chk()"
            )
        else:  # two source rows of one day share a note: the deferred key fails at COMMIT
            conn.execute(
                f"UPDATE {schema}.raw_orders SET note = '{VALUE}' WHERE order_id IN (3, 6)"
            )
            conn.execute(
                f"ALTER TABLE {schema}.orders ADD CONSTRAINT one_note UNIQUE (note) "
                "DEFERRABLE INITIALLY DEFERRED"
            )
    done = _run(pg_dsn, schema, tmp_path)
    assert done.returncode != 0, done.stderr
    state = "P0001" if refusal == "trigger" else "23505"
    assert f"SQLSTATE {state}" in done.stderr, done.stderr  # what failed is still said
    written = [done.stdout, done.stderr, (tmp_path / "xcom.json").read_text(encoding="utf-8")]
    written += [p.read_text(encoding="utf-8") for p in (tmp_path / "evidence").rglob("*.json")]
    assert len(written) > 3, "no evidence was written"
    for text in written:
        assert VALUE not in text


@pytest.mark.parametrize("state", ["42501", "0A000", "40001"])
def test_a_trigger_raising_a_server_class_still_names_no_row_value(
    pg_dsn: str, schema: str, tmp_path: Path, state: str
) -> None:
    """A trigger that RAISEs with an SQLSTATE whose server messages name only objects (42501
    insufficient_privilege, 0A000, 40001) formats its own text from NEW: it is withheld like a
    P0001's. 40001 (a serialization failure) is retryable: Airflow tries the chunk again."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE FUNCTION {schema}.chk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.order_id = 29 THEN RAISE EXCEPTION 'customer % rejected', NEW.note "
            f"USING ERRCODE = '{state}'; END IF; RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER chk BEFORE INSERT ON {schema}.orders "
            f"FOR EACH ROW EXECUTE FUNCTION {schema}.chk()"
        )
    done = _run(pg_dsn, schema, tmp_path)
    result = json.loads((tmp_path / "xcom.json").read_text(encoding="utf-8"))
    if state == "40001":
        assert done.returncode == 4 and result["error"]["retryable"] is True, done.stderr
        assert "DPONE_BACKFILL_CHUNK_BUSY" in done.stderr
    else:
        assert done.returncode == 1 and f"SQLSTATE {state}" in done.stderr, done.stderr
        assert "message withheld" in done.stderr
    with psycopg.connect(pg_dsn) as conn:
        stored = conn.execute(
            f"SELECT coalesce(string_agg(error_message, ' '), '') FROM {schema}_audit"  # type: ignore[call-overload]
            ".chunk_transition"
        ).fetchone()
    written = [done.stdout, done.stderr, json.dumps(result), str(stored)]
    written += [p.read_text(encoding="utf-8") for p in (tmp_path / "evidence").rglob("*.json")]
    for text in written:
        assert VALUE not in text
