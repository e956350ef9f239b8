"""The one `dpone` command. The pod needs only `run` and `ledger`; `check`, `preview` and
`generate` come with the `dpone` distribution (the generator) and say how to get it when absent.

Exit codes (docs/cli.md): 0 passed / clean; 1 the run failed or check found errors or generate
--check found differences; 2 usage error; 3 refused before any data I/O (invalid input, plan or
pack mismatch); 4 transient (database unreachable, campaign busy, lease lost): retry; 5 cancelled;
130 / 143 stopped by SIGINT / SIGTERM (the chunk in flight rolled back and its lease released).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from dpone import __version__, errors
from dpone.errors import DponeError, ErrorRecord, error_json_line
from dpone.redaction import redact_text

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_TRANSIENT, EXIT_CANCELLED = 0, 1, 2, 3, 4, 5
#: the reader of stdout went away (``dpone preview | head``): the shell's status for SIGPIPE
EXIT_BROKEN_PIPE = 141
GENERATOR_COMMANDS = ("check", "preview", "generate")
TRANSIENT_CODES = {
    errors.CONNECTION_FAILED,
    errors.MAPPING_CAMPAIGN_BUSY,
    errors.CHUNK_LEASE_LOST,
    errors.CHUNK_BUSY,
    errors.RUN_INTERRUPTED,
}

HELP = f"""dpone {__version__} — bounded Airflow backfills over a durable chunk ledger

usage: dpone <command> [options]

commands:
  run        move a backfill chunk by chunk under the ledger (what every pod runs)
  ledger     show (status) or cancel a campaign's ledger
  check      validate a catalog and its manifests             [dpone distribution]
  preview    show the chunk and mapping plans                 [dpone distribution]
  generate   write the frozen Airflow DAG files and pools     [dpone distribution]

examples:
  dpone check golden/summary_365_into_40/workloads.yaml
  dpone preview golden/summary_365_into_40/workloads.yaml
  dpone run --catalog golden/internal_default/workloads.yaml --workload orders_history
  dpone ledger status --catalog golden/internal_default/workloads.yaml --workload orders_history

`dpone <command> --help` shows each command's options; exit codes are in docs/cli.md.
"""


def use_colour(stream: Any) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to a non-empty value
    (https://no-color.org)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def report_error(record: ErrorRecord, *, extra: Sequence[ErrorRecord] = ()) -> None:
    """Human lines first, then the dpone.error.v1 JSON of the primary error as the last line."""
    red, reset = ("\033[31m", "\033[0m") if use_colour(sys.stderr) else ("", "")
    for rec in (record, *extra):
        print(f"{red}error{reset}: {redact_text(str(rec))}", file=sys.stderr)
    safe = ErrorRecord(record.code, redact_text(record.message), record.location)
    print(error_json_line(safe), file=sys.stderr, flush=True)


def debug_enabled() -> bool:
    """DPONE_DEBUG shows tracebacks of internal errors; empty, 0, false, no and off mean off."""
    value = os.environ.get("DPONE_DEBUG", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def exit_code_for(code: str) -> int:
    if code == errors.USAGE:
        return EXIT_USAGE
    if code in TRANSIENT_CODES:
        return EXIT_TRANSIENT
    if code == errors.CAMPAIGN_CANCELLED:
        return EXIT_CANCELLED
    if code in (errors.SINK_FAILED, errors.SOURCE_FAILED, errors.CHUNK_FAILED):
        return EXIT_FAILED
    return EXIT_REFUSED


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as dpone.error.v1 with exit 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        report_error(ErrorRecord(errors.USAGE, f"{self.prog}: {message}"))
        raise SystemExit(EXIT_USAGE)


LOCK_TIMEOUT_MAX = 86_400.0


def lock_timeout(text: str) -> float:
    """--lock-timeout: a finite number of seconds in [0, 86400] (nan, inf and negatives refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0.0 <= value <= LOCK_TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not between 0 and {LOCK_TIMEOUT_MAX:.0f} seconds"
        )
    return value


def _run_parser() -> _Parser:
    parser = _Parser(
        prog="dpone run",
        description="Re-verify the plan, then move the selected chunks under the ledger.",
        epilog=(
            "example: DPONE_CONN_DEMO=sqlite:///demo.db dpone run --catalog "
            "golden/internal_default/workloads.yaml --workload orders_history\n"
            "env: DPONE_AIRFLOW_MAPPING_ITEM (one mapped item; absent = internal),\n"
            "     DPONE_AIRFLOW_RUN_IDENTITY (pack identity from the DAG), DPONE_CONN_<NAME>,\n"
            "     DPONE_XCOM_PATH, DPONE_EVIDENCE_DIR"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--catalog", required=True, help="path of the workload catalog")
    parser.add_argument("--workload", required=True, help="workload name in the catalog")
    parser.add_argument("--process", help="process name (default: every process, in order)")
    parser.add_argument(
        "--lock-timeout",
        type=lock_timeout,
        default=30.0,
        help="campaign lock wait, seconds, 0..86400 (30)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar or progress lines"
    )
    return parser


def cmd_run(argv: Sequence[str]) -> int:
    from dpone.runner import run_command

    args = _run_parser().parse_args(argv)
    if os.environ.get("DPONE_TIMING"):  # opt-in phase timing (bench/campaign_bench.py)
        from dpone.timing import install

        install(os.environ["DPONE_TIMING"])
    return run_command(args)


def cmd_ledger(argv: Sequence[str]) -> int:
    from dpone.status import ledger_command

    return ledger_command(argv, _Parser)


def _generator(command: str, argv: Sequence[str]) -> int:
    try:
        from dpone_generator import commands
    except ImportError:
        report_error(
            ErrorRecord(
                errors.USAGE,
                f"`dpone {command}` is part of the `dpone` distribution (the generator); this "
                f"environment has only dpone-runtime. Install it with: pip install dpone",
            )
        )
        return EXIT_USAGE
    result: int = commands.main(command, list(argv))
    return result


def _tolerate_encoding() -> None:
    """On a stream whose encoding cannot show a character (PYTHONIOENCODING=ascii), write an
    escape instead of failing: dpone's own output falls back to ASCII where it matters."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "strict") == "strict":
            reconfigure(errors="backslashreplace")


def _quiet_broken_pipe() -> int:
    """The reader closed stdout: end quietly, and keep the interpreter's final flush silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        _tolerate_encoding()
        return _main(argv)
    except BrokenPipeError:
        return _quiet_broken_pipe()


def _main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(HELP, end="")
        return EXIT_OK if args else EXIT_USAGE
    if args[0] in ("-V", "--version"):
        print(f"dpone {__version__}")
        return EXIT_OK
    command, rest = args[0], args[1:]
    try:
        if command == "run":
            return cmd_run(rest)
        if command == "ledger":
            return cmd_ledger(rest)
        if command in GENERATOR_COMMANDS:
            return _generator(command, rest)
    except DponeError as exc:
        report_error(exc.records[0], extra=exc.records[1:])
        return exit_code_for(exc.code)
    except KeyboardInterrupt:
        print("dpone: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    except BrokenPipeError:
        raise
    except Exception as exc:  # a bug: still one structured line, traceback only on request
        if debug_enabled():
            import traceback

            print(redact_text("".join(traceback.format_exception(exc))), file=sys.stderr)
        report_error(
            ErrorRecord(
                errors.INTERNAL,
                f"{type(exc).__name__}: {str(exc)[:300]} (DPONE_DEBUG=1 " f"shows the traceback)",
            )
        )
        return EXIT_REFUSED
    report_error(ErrorRecord(errors.USAGE, f"unknown command {command!r}; see `dpone --help`"))
    return EXIT_USAGE


def entry() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    entry()
