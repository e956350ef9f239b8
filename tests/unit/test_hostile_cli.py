"""User mistakes and hostile inputs get a specific registered code and exit status, never
DPONE_INTERNAL: option ranges, a closed stdout pipe, an ASCII-only terminal, malformed DSNs,
unusable state paths, strict identity parsing and a bounded, validated cancel reason.

Pipes, encodings and undecodable argv bytes only behave for real in a real process, so those
cases run the installed `dpone` executable.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from dpone import errors
from dpone.cli import main
from dpone.errors import DponeError
from dpone.observability.reporting import debug_enabled
from dpone.task.identity import parse_run_identity

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"
GOLDEN = ROOT / "golden" / "internal_default"


def _error(stderr: str) -> dict[str, object]:
    line = [x for x in stderr.splitlines() if x.startswith("{")][-1]
    doc: dict[str, object] = json.loads(line)
    return doc


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The internal_default golden project in a folder of its own (its local_file ledger too)."""
    for name in ("workloads.yaml", "orders_history.yaml"):
        shutil.copy(GOLDEN / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "PYTHONIO"))}
    env["DPONE_CONN_DEMO"] = f"sqlite:///{tmp_path / 'demo.db'}"
    return tmp_path, env


def _dpone(cwd: Path, env: dict[str, str], *args: str | bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [os.fsencode(str(DPONE)), *(a if isinstance(a, bytes) else a.encode() for a in args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


STATUS = ("ledger", "status", "--catalog", "workloads.yaml", "--workload", "orders_history")
CANCEL = ("ledger", "cancel", "--catalog", "workloads.yaml", "--workload", "orders_history")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e309", "-1", "86401", "soon"])
def test_lock_timeout_outside_its_range_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", "--catalog", "x.yaml", "--workload", "w", f"--lock-timeout={value}"]
    assert main(args) == 2
    err = _error(capsys.readouterr().err)
    assert err["code"] == "DPONE_USAGE" and "--lock-timeout" in str(err["message"])


@pytest.mark.parametrize(
    ("value", "on"),
    [("", False), ("0", False), ("false", False), ("No", False), ("off", False), ("1", True)],
)
def test_dpone_debug_reads_0_false_no_as_off(
    value: str, on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPONE_DEBUG", value)
    assert debug_enabled() is on


@pytest.mark.parametrize(
    "command",
    [
        ("preview", "--format", "json", "workloads.yaml"),
        STATUS,
        (*STATUS, "--format", "json"),
    ],
)
def test_a_closed_stdout_pipe_ends_quietly_with_141(
    command: tuple[str, ...], demo: tuple[Path, dict[str, str]]
) -> None:
    cwd, env = demo
    with subprocess.Popen(
        [str(DPONE), *command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader went away before dpone wrote (`| head` that exited)
        stderr = proc.stderr.read()
        code = proc.wait(timeout=60)
    assert code == 141, stderr
    assert stderr == ""


def test_an_ascii_only_terminal_gets_ascii_cells(demo: tuple[Path, dict[str, str]]) -> None:
    cwd, env = demo
    result = _dpone(cwd, {**env, "PYTHONIOENCODING": "ascii"}, *STATUS)
    assert result.returncode == 0, result.stderr
    assert "legend: # committed  ~ running  x failed  . pending" in result.stdout
    assert "........" in result.stdout
    utf8 = _dpone(cwd, {**env, "PYTHONIOENCODING": "utf-8"}, *STATUS)
    assert "· pending" in utf8.stdout


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        ("x" * 501, "at most 500"),
        ("line\nbreak", "U+000A, a control"),
        ("bell\x07", "U+0007, a control"),
        ("right\u202eto left", "U+202E, a control, format"),  # a bidi override reorders a line
        ("para\u2029graph", "U+2029, a control, format or line-break"),
        (b"caf\xe9", "not valid UTF-8"),
        ("   ", "empty"),
    ],
)
def test_cancel_reason_is_bounded_and_validated(
    reason: str | bytes, why: str, demo: tuple[Path, dict[str, str]]
) -> None:
    cwd, env = demo
    result = _dpone(cwd, env, *CANCEL, "--reason", reason)
    assert result.returncode == 2, result.stderr
    err = _error(result.stderr)
    assert err["code"] == "DPONE_USAGE" and why in str(err["message"])
    assert "Traceback" not in result.stderr


def _run_demo(cwd: Path, env: dict[str, str]) -> None:
    """The demo's tables seeded as scripts/demo.sh seeds them, then one run: the campaign."""
    seed = [sys.executable, str(ROOT / "scripts" / "demo_seed.py"), str(cwd / "demo.db")]
    subprocess.run(seed, check=True, capture_output=True, timeout=60)
    done = _dpone(cwd, env, "run", "--catalog", "workloads.yaml", "--workload", "orders_history")
    assert done.returncode == 0, done.stderr


def test_a_500_character_reason_is_accepted(demo: tuple[Path, dict[str, str]]) -> None:
    cwd, env = demo
    _run_demo(cwd, env)
    result = _dpone(cwd, env, *CANCEL, "--reason", "é" * 500)
    assert result.returncode == 0, result.stderr


def test_a_reason_with_a_no_break_space_is_text(demo: tuple[Path, dict[str, str]]) -> None:
    """French writes a no-break space before ':'; it is kept and shown as it is."""
    cwd, env = demo
    _run_demo(cwd, env)
    reason = "source corrigée\u00a0: relancer\u202fvite"
    result = _dpone(cwd, env, *CANCEL, "--reason", reason)
    assert result.returncode == 0, result.stderr
    status = _dpone(cwd, env, *STATUS)
    assert f"[CANCELLED: {reason}]" in status.stdout, status.stdout


@pytest.mark.parametrize(
    ("dsn", "fragment"),
    [
        ("postgresql://u:p@[::1/db", "invalid IPv6 host"),
        ("mssql://u:p@[::1/db", "invalid IPv6 host"),
        ("mssql://u:p@host:14x33/db", "invalid host or port"),
        ("host=db password=p dbname=x", "not a URL"),
    ],
)
def test_malformed_dsns_are_config_errors(
    dsn: str, fragment: str, demo: tuple[Path, dict[str, str]]
) -> None:
    cwd, env = demo
    result = _dpone(
        cwd,
        {**env, "DPONE_CONN_DEMO": dsn},
        "run",
        "--catalog",
        "workloads.yaml",
        "--workload",
        "orders_history",
    )
    assert result.returncode == 3, result.stderr
    err = _error(result.stderr)
    assert err["code"] == "DPONE_CONFIG_INVALID" and fragment in str(err["message"])
    assert ":p@" not in result.stderr and "password=p" not in result.stderr


def test_an_unusable_local_file_state_path_is_ledger_unavailable(
    demo: tuple[Path, dict[str, str]],
) -> None:
    cwd, env = demo
    (cwd / "orders_history.yaml").write_text(
        (cwd / "orders_history.yaml")
        .read_text(encoding="utf-8")
        .replace("path: .dpone-demo/ledger", "path: workloads.yaml/ledger"),
        encoding="utf-8",
    )
    result = _dpone(cwd, env, *STATUS)
    assert result.returncode == 3, result.stderr
    err = _error(result.stderr)
    assert err["code"] == "DPONE_LEDGER_UNAVAILABLE" and "cannot create its files" in str(
        err["message"]
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"schema": "a", "schema": "b"}', "duplicate key 'schema'"),
        ('{"s3cr3t-key": 1, "s3cr3t-key": 2}', "a duplicate key"),
        ('{"s3cr3t-key": 1}', "1 unknown field(s); allowed: schema, dag_id"),
        ('{"schema": NaN}', "non-standard number NaN"),
    ],
)
def test_the_run_identity_parser_is_as_strict_as_the_item_parser(raw: str, message: str) -> None:
    with pytest.raises(DponeError) as caught:
        parse_run_identity(raw)
    assert caught.value.code == errors.RUN_IDENTITY_INVALID
    assert message in caught.value.message
    assert "s3cr3t" not in caught.value.message


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (
            ("run", "--catalog", "workloads.yaml", "--workload", "orders_history"),
            "CONNECTION_MISSING",
        ),
        (("run", "--catalog", "workloads.yaml", "--bogus"), "USAGE"),
        (("ledger", "status", "--catalog", "gone.yaml", "--workload", "x"), "FILE_NOT_FOUND"),
    ],
)
def test_a_refusal_in_json_log_mode_writes_json_lines_only(
    demo: tuple[Path, dict[str, str]], args: tuple[str, ...], code: str
) -> None:
    root, env = demo
    env = {k: v for k, v in env.items() if k != "DPONE_CONN_DEMO"}
    done = _dpone(root, {**env, "DPONE_LOG_FORMAT": "JSON"}, *args)
    lines = done.stderr.splitlines()
    assert lines, done
    records = [json.loads(line) for line in lines]  # no usage text, no "error:" line
    assert records[-1]["code"] == getattr(errors, code), records
    assert all(r["schema"] == "dpone.error.v1" for r in records), records


RUN = ("run", "--no-progress", "--catalog", "workloads.yaml", "--workload", "orders_history")


@pytest.mark.parametrize("kind", ["fifo", "device", "name too long"])
def test_a_result_path_that_is_no_file_is_refused_and_left_as_it_is(
    demo: tuple[Path, dict[str, str]], kind: str
) -> None:
    cwd, env = demo
    target = cwd / ("a" * 300 if kind == "name too long" else kind)
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":  # a node of /dev/null's kind, here: the test must not risk the real one
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    before = None if kind == "name too long" else os.stat(target).st_mode
    seed = [sys.executable, str(ROOT / "scripts" / "demo_seed.py"), str(cwd / "demo.db")]
    subprocess.run(seed, check=True, capture_output=True, timeout=60)
    done = _dpone(cwd, {**env, "DPONE_XCOM_PATH": str(target)}, *RUN)
    assert done.returncode == 3, done.stderr
    assert _error(done.stderr)["code"] == "DPONE_OUTPUT_UNWRITABLE", done.stderr
    if before is not None:
        assert os.stat(target).st_mode == before  # still the pipe, the device
    ledger = _dpone(cwd, env, *STATUS)
    assert "0 committed" in ledger.stdout or "no campaign" in ledger.stdout, ledger.stdout


def test_a_result_path_that_is_a_link_is_written_through(
    demo: tuple[Path, dict[str, str]],
) -> None:
    cwd, env = demo
    (cwd / "result.json").symlink_to("real.json")
    _run_demo(cwd, {**env, "DPONE_XCOM_PATH": str(cwd / "result.json")})
    assert (cwd / "result.json").is_symlink()
    assert json.loads((cwd / "real.json").read_text(encoding="utf-8"))["status"] == "passed"


@pytest.mark.parametrize("part", [None, "PASSWORD", "USER", "DBNAME"])
def test_a_dsn_that_is_not_utf8_is_a_configuration_error(
    demo: tuple[Path, dict[str, str]], part: str | None
) -> None:
    """A byte the environment cannot decode (here 0xff in the password, or in a part given in
    a variable of its own): refused as the configuration error it is, with the run's result
    written, and nothing of it shown."""
    cwd, env = demo
    dsn = "postgresql://u:p\udcffq@127.0.0.1:1/db"  # what Python makes of the byte 0xff
    given = {"DPONE_CONN_DEMO": dsn}
    if part is not None:
        given = {"DPONE_CONN_DEMO": "postgresql://u@127.0.0.1:1/db"}
        given[f"DPONE_CONN_DEMO_{part}"] = "p\udcffq"
    result = cwd / "result.json"
    done = _dpone(cwd, {**env, **given, "DPONE_XCOM_PATH": str(result)}, *RUN)
    assert done.returncode == 3, done.stderr
    assert _error(done.stderr)["code"] == "DPONE_CONFIG_INVALID", done.stderr
    assert json.loads(result.read_text(encoding="utf-8"))["error"]["retryable"] is False
    listed = _dpone(cwd, {**env, "DPONE_CONN_PG": dsn}, "ledger", "list", "--connection", "pg")
    assert _error(listed.stderr)["code"] == "DPONE_CONFIG_INVALID", listed.stderr
    for text in (done.stderr, listed.stderr, result.read_text(encoding="utf-8")):
        assert "\\udcff" not in text and "\\xff" not in text and "pq@" not in text
