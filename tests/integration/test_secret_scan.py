"""The secret scan: a unique password planted in every DSN form dpone accepts never leaves.

For each form, real `dpone run`, `dpone ledger status` (text, JSON, HTML) and `dpone ledger
cancel` processes are driven through every failure path this machine can produce against the
real Postgres: an unreachable port, a database that does not exist, bad SQL (a missing source
table), permission denied (a real role without rights on the sink), a sink connection killed
mid-chunk with pg_terminate_backend, and the ledger connection killed between the data commit and
the completion record ("ledger database connection failed during complete"). Every channel is
scanned for the secret (raw and percent-decoded): stdout, stderr, the result (XCom) file, every
evidence file, the HTML page and every row of every ledger table. Hits must be zero, and each path
must really have failed the way it was meant to (the expected error code), so a path that silently
stopped failing cannot make the scan pass.

``SCAN_FIGURES`` collects the matrix that docs/validation-report.md quotes (`-s` prints it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"
SCAN_FIGURES: Counter[str] = Counter()

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow:
      image: example/dpone:1
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: wh, table: {{schema: {s}, name: {source}}}}}
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
      connection: {ledger}
      schema: {s}_{audit}
      require_distributed_lock: true
"""


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    database: str
    user: str
    app: str


@dataclass(frozen=True)
class Parts:
    """A DSN without its password plus the password in its own variable (DPONE_CONN_<NAME>_PASSWORD)
    or in a file (DPONE_CONN_<NAME>_PASSWORD_FILE, as a mounted secret volume gives it)."""

    dsn: str
    password: str
    as_file: bool


Conn = str | Parts


#: form name -> (secret, DSN builder). Each secret is unique to its form; the builder places it.
def _forms(tag: str) -> dict[str, tuple[str, Callable[[Server], Conn]]]:
    def secret(name: str) -> str:
        return f"Sx{name}{tag}"

    names = ("ui", "qp", "qs", "pe", "pm", "op", "kv", "v6", "ob", "pv", "pf")
    s = {name: secret(name) for name in names}
    s["pe"] = s["pe"] + "/@:;?&%"
    s["ob"] = s["ob"] + "};x"
    s["pv"] = s["pv"] + "/@:?#%"
    s["pf"] = s["pf"] + "#%/@:?"
    return {
        "password_variable": (
            s["pv"],
            lambda v: Parts(
                f"postgresql://{v.user}@{v.host}:{v.port}/{v.database}?application_name={v.app}",
                s["pv"],
                as_file=False,
            ),
        ),
        "password_file": (
            s["pf"],
            lambda v: Parts(
                f"postgresql://{v.user}@{v.host}:{v.port}/{v.database}?application_name={v.app}",
                s["pf"],
                as_file=True,
            ),
        ),
        "url_userinfo": (
            s["ui"],
            lambda v: f"postgresql://{v.user}:{s['ui']}@{v.host}:{v.port}/{v.database}"
            f"?application_name={v.app}",
        ),
        "url_query_password": (
            s["qp"],
            lambda v: f"postgresql://{v.user}@{v.host}:{v.port}/{v.database}"
            f"?password={s['qp']}&application_name={v.app}",
        ),
        "url_query_sslpassword": (
            s["qs"],
            lambda v: f"postgresql://{v.user}@{v.host}:{v.port}/{v.database}"
            f"?application_name={v.app}&sslpassword={s['qs']}",
        ),
        "percent_encoded": (
            s["pe"],
            lambda v: f"postgresql://{v.user}:{quote(s['pe'], safe='')}@{v.host}:{v.port}/"
            f"{v.database}?application_name={v.app}",
        ),
        "percent_malformed": (
            s["pm"],
            lambda v: f"postgresql://{v.user}:{s['pm']}%zz@{v.host}:{v.port}/{v.database}",
        ),
        "url_options": (
            s["op"],
            lambda v: f"postgresql://{v.user}@{v.host}:{v.port}/{v.database}"
            f"?options=-c%20dpone.scan%3D{s['op']}&application_name={v.app}",
        ),
        "libpq_keyword_value": (
            s["kv"],
            lambda v: f"host={v.host} port={v.port} dbname={v.database} user={v.user} "
            f"password='{s['kv']}' application_name={v.app}",
        ),
        "ipv6_malformed": (
            s["v6"],
            lambda v: f"postgresql://{v.user}:{s['v6']}@[::1/{v.database}",
        ),
        "odbc_pwd": (
            s["ob"],
            lambda v: f"odbc://DRIVER={{FreeTDS}};SERVER={v.host},{v.port};UID={v.user};"
            f"PWD={{{s['ob'].replace('}', '}}')}}};DATABASE={v.database}",
        ),
        "odbc_Pwd": (
            s["ob"] + "b",
            lambda v: f"odbc://DRIVER={{FreeTDS}};SERVER={v.host},{v.port};UID={v.user};"
            f"Pwd={s['ob'].replace('}', '').replace(';', '')}b;DATABASE={v.database}",
        ),
        "mssql_url": (
            s["ob"] + "m",
            lambda v: f"mssql://{v.user}:{quote(s['ob'] + 'm', safe='')}@{v.host}:{v.port}/"
            f"{v.database}",
        ),
    }


#: forms the Postgres server accepts (trust authentication ignores the planted password)
LIVE_FORMS = (
    "password_variable",
    "password_file",
    "url_userinfo",
    "url_query_password",
    "url_query_sslpassword",
    "percent_encoded",
    "url_options",
)
ALL_FORMS = (
    *LIVE_FORMS,
    "percent_malformed",
    "libpq_keyword_value",
    "ipv6_malformed",
    "odbc_pwd",
    "odbc_Pwd",
    "mssql_url",
)


@dataclass
class Project:
    root: Path
    schema: str
    pg: Server
    role: str

    def write(self, audit: str, source: str = "raw_orders", ledger: str = "wh") -> None:
        """The project for one path; each path gets its own audit schema (its own campaign)."""
        (self.root / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
        (self.root / "orders.yaml").write_text(
            MANIFEST.format(s=self.schema, source=source, ledger=ledger, audit=audit),
            encoding="utf-8",
        )


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[Project]:
    schema = "scan_" + uuid.uuid4().hex[:10]
    role = schema + "_ro"
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    server = Server(
        str(info.get("host", "127.0.0.1")),
        int(info.get("port", 5432)),
        str(info.get("dbname", "test")),
        str(info.get("user", "postgres")),
        schema,
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.raw_orders (order_id bigint PRIMARY KEY, "
            "order_date date NOT NULL, amount integer NOT NULL)"
        )
        conn.execute(f"CREATE TABLE {schema}.orders (LIKE {schema}.raw_orders)")
        conn.execute(f"CREATE INDEX ON {schema}.orders (order_date)")
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 3), g "
            "FROM generate_series(1, 300) g"
        )
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT ON {schema}.raw_orders, {schema}.orders TO {role}")
    (tmp_path / "p").mkdir()
    yield Project(tmp_path / "p", schema, server, role)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name "
            "LIKE %s",
            (schema + "%",),
        )
        for (name,) in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s OR nspname LIKE %s",
            (schema, schema + "\\_%"),
        ).fetchall():
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        conn.execute(f"DROP ROLE IF EXISTS {role}")


def _env(project: Project, conns: dict[str, Conn], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    for name, conn in conns.items():
        key = f"DPONE_CONN_{name.upper()}"
        if isinstance(conn, str):
            env[key] = conn
            continue
        env[key] = conn.dsn
        if conn.as_file:  # outside out/: the mounted secret itself is not an output channel
            secrets = project.root / "secrets"
            secrets.mkdir(exist_ok=True)
            (secrets / name).write_text(conn.password + "\n", encoding="utf-8")
            env[key + "_PASSWORD_FILE"] = str(secrets / name)
        else:
            env[key + "_PASSWORD"] = conn.password
    env["DPONE_XCOM_PATH"] = str(project.root / "out" / "xcom.json")
    env["DPONE_EVIDENCE_DIR"] = str(project.root / "out" / "evidence")
    env.update(extra)
    return env


def _dpone(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    try:
        return _spawn(env, cwd, *args)
    finally:
        SCAN_FIGURES[f"ms:{' '.join(args[:2])}"] += round(1000 * (time.monotonic() - started))


def _spawn(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DPONE), *args, "--catalog", "workloads.yaml", "--workload", "orders"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _last_code(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("{")]
    return str(json.loads(lines[-1])["code"]) if lines else ""


def _stopped_run(
    env: dict[str, str], project: Project, point: str, victim_app: str, pg_dsn: str
) -> subprocess.CompletedProcess[str]:
    """`dpone run` stopped at a fault point; the victim's backends are terminated; resumed."""
    err_path = project.root / "out" / f"stopped-{point}.err"
    err_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        err_path.open("w") as err,
        subprocess.Popen(
            [str(DPONE), "run", "--catalog", "workloads.yaml", "--workload", "orders"],
            cwd=project.root,
            env={**env, "DPONE_TEST_FAULT": f"{point}:1:stop"},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as proc,
    ):
        deadline = time.monotonic() + 60
        while "SIGSTOP" not in err_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, err_path.read_text()
            time.sleep(0.05)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (victim_app,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1, "no backend to kill"
        os.kill(proc.pid, signal.SIGCONT)
        while proc.poll() is None:  # later chunks stop at the same point: let them pass
            with contextlib.suppress(OSError):
                if Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1].startswith("T"):
                    os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.05)
        stdout = proc.stdout.read() if proc.stdout else ""
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, err_path.read_text())


class Scan:
    """Every channel's text, searched for the secret's raw and decoded forms."""

    def __init__(self, secret: str, pg_dsn: str, project: Project) -> None:
        self.needles = {secret, quote(secret, safe=""), quote(secret)}
        self.pg_dsn = pg_dsn
        self.project = project
        self.hits: list[str] = []

    def text(self, channel: str, text: str) -> None:
        SCAN_FIGURES[f"channel:{channel}"] += 1
        for needle in self.needles:
            if needle in text:
                self.hits.append(f"{channel}: ...{text[max(0, text.find(needle) - 80):][:200]}")

    def files(self, channel: str, folder: Path) -> None:
        for path in sorted(folder.rglob("*")) if folder.exists() else []:
            if path.is_file():
                self.text(f"{channel}:{path.name}", path.read_text(errors="replace"))

    def ledger(self) -> None:
        """Every row of every audit-schema table, and the sink's fence table."""
        with psycopg.connect(self.pg_dsn) as conn:
            tables = conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_schema LIKE %s OR (table_schema = %s AND table_name = %s)",
                (self.project.schema + "\\_a\\_%", self.project.schema, "dpone_chunk_fence"),
            ).fetchall()
            assert tables, "no ledger table to scan"
            for schema, table in tables:
                rows = conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t').fetchall()
                SCAN_FIGURES["ledger_rows"] += len(rows)
                self.text(f"ledger:{table}", "\n".join(r[0] for r in rows))

    def process(self, name: str, result: subprocess.CompletedProcess[str]) -> None:
        self.text(f"{name}:stdout", result.stdout)
        self.text(f"{name}:stderr", result.stderr)
        assert "Traceback" not in result.stderr, result.stderr


def _exercise(
    form: str, pg_dsn: str, project: Project, with_ledger: bool
) -> tuple[Scan, dict[str, str]]:
    secret, build = _forms(project.schema[-10:])[form]
    scan = Scan(secret, pg_dsn, project)
    pg = project.pg
    good = build(pg)
    codes: dict[str, str] = {}

    def run(path: str, conns: dict[str, Conn], source: str = "raw_orders") -> None:
        ledger = "ledger" if "ledger" in conns else "wh"
        project.write(f"a_{path}", source=source, ledger=ledger)
        env = _env(project, conns)
        result = _dpone(env, project.root, "run")
        codes[path] = _last_code(result.stderr)
        scan.process(f"{path}:run", result)
        status_paths(path, env)

    def status_paths(path: str, env: dict[str, str]) -> None:
        html = project.root / "out" / "status.html"
        for args in (
            ("ledger", "status"),
            ("ledger", "status", "--format", "json", "--html", str(html)),
            ("ledger", "cancel", "--reason", "scan"),
            ("ledger", "cancel", "--undo"),
        ):
            scan.process(f"{path}:{' '.join(args[:2])}", _dpone(env, project.root, *args))
        scan.files(f"{path}:out", project.root / "out")
        SCAN_FIGURES[f"path:{path}"] += 1

    run("unreachable_port", {"wh": build(Server(pg.host, 1, pg.database, pg.user, pg.app))})
    if with_ledger:  # a refused form fails before any connection: one path says it all
        run(
            "bad_database",
            {"wh": build(Server(pg.host, pg.port, "nosuch_" + project.schema, pg.user, pg.app))},
        )
        run("bad_sql", {"wh": good}, source="raw_missing")
        restricted = build(Server(pg.host, pg.port, pg.database, project.role, pg.app + "_ro"))
        ledger = build(Server(pg.host, pg.port, pg.database, pg.user, pg.app + "_ledger"))
        run("permission_denied", {"wh": restricted, "ledger": ledger})
        project.write("a_killed_connection", ledger="wh")
        env = _env(project, {"wh": good})
        result = _stopped_run(env, project, "chunk_written", pg.app, pg_dsn)
        codes["killed_connection"] = _last_code(result.stderr)
        scan.process("killed_connection:run", result)
        status_paths("killed_connection", env)
        project.write("a_ledger_lost_mid_run", ledger="ledger")
        env = _env(project, {"wh": good, "ledger": ledger})
        result = _stopped_run(env, project, "data_committed", pg.app + "_ledger", pg_dsn)
        codes["ledger_lost_mid_run"] = _last_code(result.stderr)
        assert "failed during complete" in result.stderr, result.stderr
        scan.process("ledger_lost_mid_run:run", result)
        status_paths("ledger_lost_mid_run", env)
        scan.ledger()
    return scan, codes


@pytest.mark.parametrize("form", LIVE_FORMS)
def test_secret_never_leaves_on_any_failure_path(form: str, pg_dsn: str, project: Project) -> None:
    scan, codes = _exercise(form, pg_dsn, project, with_ledger=True)
    assert codes == {
        "unreachable_port": "DPONE_CONNECTION_FAILED",
        "bad_database": "DPONE_CONNECTION_FAILED",
        "bad_sql": "DPONE_PREFLIGHT_FAILED",  # a missing source table, refused before any lease
        "permission_denied": "DPONE_SINK_FAILED",
        "killed_connection": "DPONE_CONNECTION_FAILED",
        "ledger_lost_mid_run": "DPONE_CONNECTION_FAILED",
    }
    SCAN_FIGURES[f"form:{form}"] += 1
    SCAN_FIGURES["hits"] += len(scan.hits)
    assert scan.hits == []


@pytest.mark.parametrize("form", [f for f in ALL_FORMS if f not in LIVE_FORMS])
def test_secret_never_leaves_from_a_refused_or_unreachable_form(
    form: str, pg_dsn: str, project: Project
) -> None:
    scan, codes = _exercise(form, pg_dsn, project, with_ledger=False)
    # an MSSQL form: its ODBC driver is not installed here (DRIVER_MISSING), or no server answers
    expected = (
        {"DPONE_CONNECTION_FAILED", "DPONE_DRIVER_MISSING"}
        if form.startswith(("odbc", "mssql"))
        else {"DPONE_CONFIG_INVALID"}
    )
    assert set(codes.values()) <= expected | {"DPONE_LEDGER_UNAVAILABLE"}, codes
    SCAN_FIGURES[f"form:{form}"] += 1
    SCAN_FIGURES["hits"] += len(scan.hits)
    assert scan.hits == []


def test_zz_print_figures() -> None:
    """The matrix the validation report quotes (run with -s)."""
    print(json.dumps(dict(sorted(SCAN_FIGURES.items())), indent=1))
