"""Fuzz the connection string: every DSN form dpone accepts, well-formed and broken, with a
secret planted in it, through the real `dpone run` and `dpone ledger status` in-process.

Forms: URL userinfo, URL query parameters (password, sslpassword, a percent-encoded key), libpq
keyword/value, ODBC ``PWD=``/``Pwd=`` (braced or not), mssql URLs; broken hosts (an unclosed IPv6
bracket, a bad port, a bad percent escape) and junk around them. Hosts are 127.0.0.1:1 (refused at
once) or unparsable, so no case reaches a real database. The oracle is the suite's (documented
exit code, a registered code that is not DPONE_INTERNAL, no traceback) plus the secret scan: the
secret, raw or percent-decoded, is in no output channel (stdout, stderr, the result file, the
evidence folder).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import quote, unquote, unquote_plus

import fuzzkit
import pytest
from dpone import errors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SECRET_ALPHABET = "abcdefXYZ0123456789%/@:;?&={}'\" \\+#[]"
EXPECTED = {
    errors.CONFIG_INVALID,
    errors.CONNECTION_FAILED,
    errors.LEDGER_UNAVAILABLE,
    errors.DRIVER_MISSING,
}
MANIFEST_STATE = (
    "    state:\n      backend: audit_schema\n      connection: demo\n      schema: fz\n"
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The internal_default golden project with its ledger on the fuzzed connection."""
    root = tmp_path_factory.mktemp("fuzz_dsn")
    golden = fuzzkit.GOLDEN / "internal_default"
    shutil.copy(golden / "workloads.yaml", root / "workloads.yaml")
    manifest = (golden / "orders_history.yaml").read_text(encoding="utf-8")
    head, _, _ = manifest.partition("    state:\n")
    (root / "orders_history.yaml").write_text(head + MANIFEST_STATE, encoding="utf-8")
    return root


def _secrets() -> st.SearchStrategy[str]:
    return st.text(SECRET_ALPHABET, min_size=4, max_size=16).map(lambda s: "Fz" + s + "Q9")


@st.composite
def planted_dsn(draw: st.DrawFn) -> tuple[str, str]:
    secret = draw(_secrets())
    encoded = draw(st.booleans())
    pw = quote(secret, safe="") if encoded else secret
    host = draw(st.sampled_from(["127.0.0.1:1", "[::1", "[::1]:1", "127.0.0.1:x", "h%zz:1", ""]))
    user = draw(st.sampled_from(["etl", "", "e%zz", "a:b"]))
    junk = draw(st.text("abc=&;?%:/@ ", max_size=6))
    form = draw(
        st.sampled_from(
            [
                f"postgresql://{user}:{pw}@{host}/db{junk}",
                f"postgresql://{user}@{host}/db?password={pw}{junk}",
                f"postgresql://{user}@{host}/db?sslmode=bogus&sslpassword={pw}",
                f"postgresql://{user}@{host}/db?pass%77ord={pw}&{junk}",
                f"postgresql://{user}@{host}/db?options=-c%20x%3D{pw}",
                f"postgres://{user}:{pw}%zz@{host}/db",
                f"host=127.0.0.1 port=1 user={user} password='{secret}' {junk}",
                f"host=127.0.0.1 password={secret}",
                f"odbc://DRIVER={{FreeTDS}};SERVER=127.0.0.1,1;UID={user};"
                f"PWD={{{secret.replace('}', '}}')}}};{junk}",
                f"odbc://Server=127.0.0.1,1;Uid={user};Pwd={secret}",
                f"mssql://{user}:{quote(secret, safe='')}@{host}/db",
                f"mssql+pyodbc://{user}:{pw}@{host}/db?TrustServerCertificate=yes{junk}",
            ]
        )
    )
    return form, secret


def _needles(secret: str) -> set[str]:
    return {secret, unquote(secret), unquote_plus(secret), quote(secret, safe="")}


def _scan(secret: str, texts: dict[str, str], context: str) -> None:
    for channel, text in texts.items():
        for needle in _needles(secret):
            assert needle not in text, f"{context}: secret in {channel}: {text[-600:]}"


@given(case=planted_dsn(), status=st.booleans())
@settings(
    max_examples=fuzzkit.examples(0.01),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_fuzz_dsn_forms_never_leak_their_secret(
    case: tuple[str, str], status: bool, project: Path
) -> None:
    dsn, secret = case
    out = project / "out"
    shutil.rmtree(out, ignore_errors=True)
    command = ["ledger", "status"] if status else ["run"]
    argv = [*command, "--catalog", str(project / "workloads.yaml"), "--workload", "orders_history"]
    env: dict[str, str | None] = {
        "DPONE_CONN_DEMO": dsn,
        "DPONE_XCOM_PATH": str(out / "xcom.json"),
        "DPONE_EVIDENCE_DIR": str(out / "evidence"),
        "DPONE_AIRFLOW_MAPPING_ITEM": None,
        "DPONE_AIRFLOW_RUN_IDENTITY": None,
        "DPONE_DEBUG": None,
        "DPONE_TEST_FAULT": None,
    }
    result = fuzzkit.run_cli(argv, env)
    context = f"{' '.join(command)} with DSN {dsn!r}"
    record = fuzzkit.check_run_result(result, context)
    assert record is not None, f"{context}: passed against an unreachable server"
    assert record["code"] in EXPECTED, f"{context}: {record}"
    channels = {"stdout": result.stdout, "stderr": result.stderr}
    if out.exists():
        for path in sorted(out.rglob("*")):
            if path.is_file():
                channels[str(path.relative_to(out))] = path.read_text(errors="replace")
    _scan(secret, channels, context)
    fuzzkit.count("dsn_secret_scan")
