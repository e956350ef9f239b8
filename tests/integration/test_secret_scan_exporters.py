"""The secret scan through the exporters: passwords holding ``/ @ : ? #`` and ``%`` raw, and all
of them percent-encoded, in a real `dpone run` against the real Postgres with OpenLineage and OTLP
metrics both pointed at a real capture server (every byte of every POST kept). No fragment of the
password, and not the connection's user name, may appear in stderr, stdout, the result (XCom),
the evidence, the ledger's rows, a lineage event or a metrics request.

libpq splits such DSNs its own way (``u:p@ss@host`` connects to the host ``ss@host``; a raw ``/``
makes the user the host and the password's head the port), so some forms fail to connect: the
driver's error then quotes a piece of the password, which is what the redaction must catch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from tests.observability.receiver import receiver

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
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-04}}
      inner_mode: replace
    state:
      backend: audit_schema
      connection: ledger
      schema: {s}_{audit}
"""
#: form -> (password, whether it goes into the DSN percent-encoded)
FORMS = {
    "raw_slash": ("Qa{t}/Zb{t}", False),
    "raw_at": ("Qc{t}@Zd{t}", False),
    "raw_colon": ("Qe{t}:Zf{t}", False),
    "raw_question": ("Qg{t}?Zh{t}", False),
    "raw_hash": ("Qi{t}#Zj{t}", False),
    "raw_percent": ("Qk{t}%zzZl{t}", False),
    "encoded_all": ("Qm{t}/@:?#%Zn{t}", True),
}


@pytest.fixture
def scan_project(tmp_path: Path, pg_dsn: str) -> Iterator[dict[str, Any]]:
    tag = uuid.uuid4().hex[:8]
    schema, user = f"t_expscan_{tag}", f"dpone_scan_u{tag}"
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.raw_orders (order_id bigint PRIMARY KEY, "
            "order_date date NOT NULL, amount integer NOT NULL)"
        )
        conn.execute(f"CREATE TABLE {schema}.orders (LIKE {schema}.raw_orders)")
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 3), g "
            "FROM generate_series(1, 300) g"
        )
        conn.execute(f"CREATE ROLE {user} LOGIN")
        conn.execute(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {user}")
        conn.execute(f"GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA {schema} TO {user}")
    (tmp_path / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    yield {
        "root": tmp_path,
        "schema": schema,
        "user": user,
        "tag": tag,
        "server": (info.get("host", "127.0.0.1"), info.get("port", "5432"), info["dbname"]),
        "pg": pg_dsn,
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s OR nspname LIKE %s",
            (schema, schema + "\\_%"),
        ).fetchall():
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        conn.execute(f"DROP ROLE IF EXISTS {user}")


def needles(password: str, user: str) -> set[str]:
    """The password, its pieces between delimiters, their percent-encodings, the user name."""
    pieces = {piece for piece in re.split(r"[/@:?#%]", password) if len(piece) >= 4}
    found = {password, quote(password, safe=""), quote(password), user, *pieces}
    return {needle for needle in found if needle}


def ledger_text(project: dict[str, Any], audit: str) -> str:
    with psycopg.connect(project["pg"]) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema = %s",
            (f"{project['schema']}_{audit}",),
        ).fetchall()
        return "\n".join(
            row[0]
            for schema, table in tables
            for row in conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t').fetchall()
        )


@pytest.mark.parametrize("form", sorted(FORMS))
def test_no_password_fragment_in_any_exported_byte(form: str, scan_project: dict[str, Any]) -> None:
    project = scan_project
    template, encoded = FORMS[form]
    password = template.format(t=project["tag"])
    host, port, database = project["server"]
    written = quote(password, safe="") if encoded else password
    dsn = f"postgresql://{project['user']}:{written}@{host}:{port}/{database}"
    audit = "a_" + form
    root: Path = project["root"]
    (root / "orders.yaml").write_text(
        MANIFEST.format(s=project["schema"], audit=audit), encoding="utf-8"
    )
    out = root / "out" / form
    with receiver() as (url, got):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OTEL_"))}
        env.update(
            {
                "DPONE_CONN_WH": dsn,
                "DPONE_CONN_LEDGER": project["pg"],
                "DPONE_XCOM_PATH": str(out / "xcom.json"),
                "DPONE_EVIDENCE_DIR": str(out / "evidence"),
                "OPENLINEAGE_URL": url,
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            }
        )
        result = subprocess.run(
            [str(DPONE), "run", "--catalog", "workloads.yaml", "--workload", "orders"],
            cwd=root,
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        posts = list(got.posts)
    stderr = result.stderr.decode()
    if form in ("raw_colon", "raw_question", "raw_hash", "encoded_all"):
        assert result.returncode == 0, stderr  # libpq reads the whole password: it connects
    else:
        assert result.returncode != 0 and '"code":"DPONE_' in stderr, stderr
    lineage = [body for path, _, body in posts if path == "/api/v1/lineage"]
    assert lineage, stderr  # START and COMPLETE / FAIL reached the capture server
    if result.returncode == 0:
        assert [p for p, _, _ in posts if p == "/v1/metrics"], stderr
    channels: dict[str, bytes] = {
        "stderr": result.stderr,
        "stdout": result.stdout,
        "ledger": ledger_text(project, audit).encode(),
    }
    for path in sorted(out.rglob("*")):
        if path.is_file():
            channels[str(path.relative_to(out))] = path.read_bytes()
    for index, (path, headers, body) in enumerate(posts):
        channels[f"post {index} {path}"] = body + json.dumps(headers).encode()
    assert "xcom.json" in channels, stderr
    hits = [
        f"{channel}: {needle!r}"
        for channel, data in channels.items()
        for needle in needles(password, project["user"])
        if needle.encode() in data
    ]
    assert hits == [], hits
    for body in lineage:  # names come from validated parts: a host, a port, a database
        event = json.loads(body)
        for dataset in event["inputs"] + event["outputs"]:
            assert re.fullmatch(r"postgres://([A-Za-z0-9.\-]+:\d+|unknown)", dataset["namespace"])
