"""CLI manners, checked on the real `dpone` executable of the project .venv.

- `--version` works; `--help` of every command shows an example and exits 0;
- every option a command accepts is documented in docs/cli.md;
- the examples that need no server run as printed;
- usage errors exit 2 with a dpone.error.v1 line;
- colour only on a terminal (a real pseudo-terminal here), and NO_COLOR turns it off.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import dpone
import pytest
from docs_markdown import ROOT

DPONE = ROOT / ".venv" / "bin" / "dpone"
COMMANDS = [
    ["run"],
    ["ledger"],
    ["ledger", "status"],
    ["ledger", "cancel"],
    ["ledger", "list"],
    ["verify"],
    ["check"],
    ["preview"],
    ["generate"],
]
ESC = "\033["
DEMO_CATALOG = ROOT / "golden" / "internal_default" / "workloads.yaml"


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DPONE_") and k not in ("NO_COLOR", "FORCE_COLOR")
    }
    env.update(extra)
    return env


def dpone_cli(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DPONE), *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def in_terminal(*args: str, cwd: Path = ROOT, **env: str) -> tuple[int, str]:
    """Run dpone with stdin, stdout and stderr on a pseudo-terminal; (exit code, screen text)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [str(DPONE), *args],
        cwd=cwd,
        env=clean_env(TERM="xterm-256color", **env),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_the_project_executable_exists() -> None:
    assert DPONE.is_file(), f"{DPONE} is missing: run bash scripts/bootstrap.sh"


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    done = dpone_cli(flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"dpone {dpone.__version__}\n"


def test_top_level_help_lists_every_command_with_examples() -> None:
    done = dpone_cli("--help")
    assert done.returncode == 0
    for command in ("run", "ledger", "verify", "check", "preview", "generate"):
        assert re.search(rf"^  {command} ", done.stdout, re.M), command
    assert "examples:" in done.stdout
    bare = dpone_cli()
    assert bare.returncode == 2 and "usage: dpone <command>" in bare.stdout


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_help_has_an_example_and_documented_options(command: list[str]) -> None:
    done = dpone_cli(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"^examples?:", done.stdout, re.M
    ), f"`dpone {' '.join(command)} --help` has no example"
    assert f"dpone {' '.join(command)}" in done.stdout
    cli_md = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", done.stdout)) - {"--help"}
    undocumented = sorted(o for o in options if f"`{o}" not in cli_md and f" {o}" not in cli_md)
    assert not undocumented, f"options missing from docs/cli.md: {undocumented}"


def _examples(help_text: str) -> list[str]:
    """Example lines of a help text that start with `dpone `."""
    return [
        line.strip().split("  #")[0].strip()
        for line in help_text.splitlines()
        if line.strip().startswith("dpone ")
    ]


def test_offline_examples_run_as_printed() -> None:
    """The check and preview examples in every help text work when pasted in the repo root."""
    seen = []
    for command in [[], *COMMANDS]:
        help_text = dpone_cli(*command, "--help").stdout
        for example in _examples(help_text):
            if example.split()[1] in ("check", "preview"):
                seen.append(example)
                done = dpone_cli(*example.split()[1:])
                assert done.returncode == 0, f"{example}\n{done.stderr}"
    assert seen, "no check/preview example found in any help text"


@pytest.mark.parametrize(
    "args",
    [["run"], ["nosuch"], ["check"], ["ledger", "status", "--catalog", "x.yaml"]],
    ids=" ".join,
)
def test_usage_errors_exit_2_with_a_structured_line(args: list[str]) -> None:
    done = dpone_cli(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    last = json.loads(done.stderr.strip().splitlines()[-1])
    assert last["schema"] == "dpone.error.v1" and last["code"] == "DPONE_USAGE"


def test_unknown_workload_is_a_usage_error() -> None:
    done = dpone_cli("run", "--catalog", str(DEMO_CATALOG), "--workload", "nope")
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1])["code"] == "DPONE_USAGE"


DEMO = ("--catalog", str(DEMO_CATALOG), "--workload", "orders_history")


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--catalog", str(DEMO_CATALOG), "--workload", "a", "--workload=orders_history"],
        ["ledger", "restate", *DEMO, "--chunks", "4", "--chunks", "5", "--reason", "r"],
        ["ledger", "status", *DEMO, "--format", "json", "--format", "text"],
        ["verify", "--catalog", str(DEMO_CATALOG), "--catalog", str(DEMO_CATALOG)],
        ["check", str(DEMO_CATALOG), "--format", "json", "--format=json"],
        ["ledger", "restate", *DEMO, "--chunks", "4", "--chunk", "5", "--reason", "r"],
        ["ledger", "status", *DEMO, "--form", "json", "--format", "text"],
    ],
    ids=["run", "restate", "status", "verify", "check", "abbreviated", "abbreviated-first"],
)
def test_an_option_of_one_value_given_twice_is_a_usage_error(args: list[str]) -> None:
    """Regression: the last one was kept silently (`--chunks 4 --chunks 5` restated chunk 5
    only), as if the first had not been typed."""
    done = dpone_cli(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    last = json.loads(done.stderr.strip().splitlines()[-1])
    assert last["code"] == "DPONE_USAGE" and "is given twice" in last["message"], last


# --- colour -------------------------------------------------------------------------------------


def test_error_colour_only_on_a_terminal() -> None:
    args = ("run", "--catalog", "missing/workloads.yaml", "--workload", "w")
    piped = dpone_cli(*args)
    assert piped.returncode == 3 and ESC not in piped.stderr and "error:" in piped.stderr
    code, screen = in_terminal(*args)
    assert code == 3
    assert "\033[31merror\033[0m:" in screen, screen
    code, screen = in_terminal(*args, NO_COLOR="1")
    assert code == 3 and ESC not in screen and "error:" in screen


def test_ledger_status_colour_only_on_a_terminal(tmp_path: Path) -> None:
    """The demo catalog's local_file ledger path is relative to the working directory: in an
    empty folder there is no ledger yet, and the legend still shows the coloured cells."""
    args = ("ledger", "status", "--catalog", str(DEMO_CATALOG), "--workload", "orders_history")
    piped = dpone_cli(*args, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert ESC not in piped.stdout and "9 pending" in piped.stdout
    code, screen = in_terminal(*args, cwd=tmp_path)
    assert code == 0, screen
    assert "\033[32m" in screen and "\033[2m·\033[0m" in screen, screen
    code, screen = in_terminal(*args, cwd=tmp_path, NO_COLOR="1")
    assert code == 0 and ESC not in screen and "9 pending" in screen
    code, screen = in_terminal(*args, cwd=tmp_path, NO_COLOR="")
    assert code == 0 and "\033[32m" in screen, "an empty NO_COLOR does not turn colour off"


def test_check_and_preview_never_colour_piped_output() -> None:
    for args in (["check", str(DEMO_CATALOG)], ["preview", str(DEMO_CATALOG)]):
        done = dpone_cli(*args)
        assert done.returncode == 0 and ESC not in done.stdout + done.stderr


def test_run_progress_lines_are_plain_and_in_order(tmp_path: Path) -> None:
    """Piped output (an Airflow log) gets plain progress lines: the start line first, then the
    counts, then the summary, also when a second run only finds already committed chunks."""
    seeded = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "scripts" / "demo_seed.py"), "demo.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stderr
    args = ("run", "--catalog", str(DEMO_CATALOG), "--workload", "orders_history")
    env = {"DPONE_CONN_DEMO": "sqlite:///demo.db"}
    for committed, skipped in ((9, 0), (0, 9)):
        done = dpone_cli(*args, cwd=tmp_path, **env)
        assert done.returncode == 0, done.stderr
        lines = done.stderr.strip().splitlines()
        assert lines[0] == "dpone: orders_history/orders: 9 chunk(s) selected", lines
        assert lines[-1].startswith(
            f"dpone: orders_history/orders: passed — {committed} committed, "
            f"{skipped} already committed, 0 failed"
        ), lines
        assert all(line.startswith("dpone: orders_history/orders: ") for line in lines), lines
        assert ESC not in done.stderr
