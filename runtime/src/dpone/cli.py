"""The one `dpone` command. The pod needs only `run` and `ledger`; `check`, `preview` and
`generate` come with the `dpone` distribution (the generator) and say how to get it when absent.

Exit codes and error reporting live in dpone.observability.reporting; this module only dispatches. It imports
`run` and `ledger` lazily so `dpone --help` stays fast.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from dpone import __version__, errors
from dpone.credentials.redaction import redact_text
from dpone.errors import DponeError, ErrorRecord
from dpone.lifecycle.collection import hold_while_starting
from dpone.observability.reporting import (
    EXIT_BROKEN_PIPE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandParser,
    debug_enabled,
    exit_code_for,
    report_error,
)

GENERATOR_COMMANDS = ("check", "preview", "generate")

HELP = f"""dpone {__version__} — bounded Airflow backfills over a durable chunk ledger

usage: dpone <command> [options]

commands:
  run        move a backfill chunk by chunk under the ledger (what every pod runs)
  ledger     status, cancel, restate or list the campaigns of a ledger
  verify     compare every chunk's source and target rows (count + checksum), read-only
  check      validate a catalog and its manifests             [dpone distribution]
  preview    show the chunk and mapping plans                 [dpone distribution]
  generate   write the frozen Airflow DAG files and pools     [dpone distribution]

examples:
  dpone check golden/summary_365_into_40/workloads.yaml
  dpone preview golden/summary_365_into_40/workloads.yaml
  dpone run --catalog golden/internal_default/workloads.yaml --workload orders_history
  dpone ledger status --catalog golden/internal_default/workloads.yaml --workload orders_history
  dpone verify --catalog golden/internal_default/workloads.yaml --workload orders_history

`dpone <command> --help` shows each command's options; exit codes are in docs/cli.md.
"""


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


def _workload_parser(prog: str, description: str, epilog: str) -> CommandParser:
    """A command over one workload of a catalog: --catalog and --workload, the epilog as written."""
    parser = CommandParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--catalog", required=True, help="path of the workload catalog")
    parser.add_argument("--workload", required=True, help="workload name in the catalog")
    return parser


def _run_parser() -> CommandParser:
    parser = _workload_parser(
        "dpone run",
        description="Re-verify the plan, then move the selected chunks under the ledger.",
        epilog=(
            "examples:\n"
            "  DPONE_CONN_DEMO=sqlite:///.dpone-demo/demo.db dpone run --catalog "
            "golden/internal_default/workloads.yaml --workload orders_history\n"
            "  dpone run --catalog golden/summary_365_into_40/workloads.yaml "
            "--workload orders_history --process orders --item 7\n"
            "env: DPONE_AIRFLOW_MAPPING_ITEM (one mapped item; absent = internal),\n"
            "     DPONE_AIRFLOW_RUN_IDENTITY (pack identity from the DAG), DPONE_CONN_<NAME>,\n"
            "     DPONE_XCOM_PATH, DPONE_EVIDENCE_DIR\n"
            "exit codes:\n"
            "  0  passed\n"
            "  1  a chunk failed (DPONE_BACKFILL_CHUNK_FAILED, DPONE_SINK_FAILED, ...)\n"
            "  2  usage error (DPONE_USAGE)\n"
            "  3  refused before any data moved (invalid catalog, plan or pack mismatch,\n"
            "     missing connection, missing table or chunk column)\n"
            "  4  transient: retry (database unreachable, campaign busy, lease lost)\n"
            "  5  the campaign is cancelled (DPONE_BACKFILL_CANCELLED)\n"
            "  130 / 143  stopped by SIGINT / SIGTERM: the chunk in flight rolled back and its\n"
            "     lease released (DPONE_RUN_INTERRUPTED)\n"
            "  every error code's exit code: docs/errors.md"
        ),
    )
    parser.add_argument("--process", help="process name (default: every process, in order)")
    parser.add_argument(
        "--item",
        type=int,
        metavar="N",
        help="re-run mapped item N (its Airflow map index) with exactly the env its generated "
        "task passes, computed from the plan",
    )
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
    from dpone.run.refusal import refusals_leave_a_result
    from dpone.run.runner import run_command

    parser = _run_parser()
    with refusals_leave_a_result(parser.refusals) as scope:
        args = parser.parse_args(argv)
        scope.note(workload=args.workload, process=args.process)
        if os.environ.get("DPONE_TIMING"):  # opt-in phase timing (bench/campaign_bench.py)
            from dpone.observability.timing import install

            install(os.environ["DPONE_TIMING"])
        return run_command(args)


def _verify_parser() -> CommandParser:
    parser = _workload_parser(
        "dpone verify",
        description=(
            "Prove a backfill: per chunk, compare the source's and the target's row count and "
            "order-independent checksum, computed read-only. Prints the mismatched chunks with "
            "their ranges and a summary; exit 0 only when every checked chunk matches."
        ),
        epilog=(
            "examples:\n"
            "  DPONE_CONN_DEMO=sqlite:///.dpone-demo/demo.db dpone verify --catalog "
            "golden/internal_default/workloads.yaml --workload orders_history\n"
            "  dpone verify --catalog workloads.yaml --workload orders_history --chunks 1-40 "
            "--format json\n"
            "exit codes: 0 every chunk matches, 1 a chunk differs (DPONE_VERIFY_MISMATCH),\n"
            "  2 usage, 3 refused (invalid catalog, missing connection), 4 database unreachable"
        ),
    )
    parser.add_argument("--process", help="only this process (default: every process)")
    parser.add_argument(
        "--chunks", metavar="RANGES", help="only these chunks: 1-40, 7 or 1-5,9 (default: all)"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output (text)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    return parser


def cmd_verify(argv: Sequence[str]) -> int:
    from dpone.campaign.reconcile import verify_command

    return verify_command(_verify_parser().parse_args(argv))


def cmd_ledger(argv: Sequence[str]) -> int:
    from dpone.campaign.status import ledger_command

    return ledger_command(argv, CommandParser)


def _generator(command: str, argv: Sequence[str]) -> int:
    try:
        from dpone_generator import commands
    except ImportError:
        report_error(
            ErrorRecord(
                errors.USAGE,
                f"`dpone {command}` is part of the `dpone` distribution (the generator); this "
                f"environment has only dpone-runtime. Install its wheel by path (`bash "
                f"scripts/build.sh` writes dist/dpone-{__version__}-py3-none-any.whl), never by "
                f"the bare name: `dpone` on PyPI is another project",
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
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe surfaces here, not in the interpreter's final flush
    except BrokenPipeError:
        return _quiet_broken_pipe()
    if argv is None:  # the process's own command: it exits next
        _skip_final_collections()
    return code


def _skip_final_collections() -> None:
    """Tearing the imported drivers and exporter libraries down object by object costs up to a
    second at exit (0.7 s for openlineage-python alone on a loaded VM); every file and connection
    is closed by now, so the interpreter's final garbage collections are skipped."""
    gc.freeze()


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
            if argv is None:  # the process's own run: no collection while it starts
                hold_while_starting()
            return cmd_run(rest)
        if command == "ledger":
            return cmd_ledger(rest)
        if command == "verify":
            return cmd_verify(rest)
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
