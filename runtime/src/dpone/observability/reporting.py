"""How a `dpone` command reports its outcome: exit codes, error lines on stderr, and the argparse
that reports usage errors the same way.

Every command (the `dpone` entry point, `run`, `ledger`, and the generator's `check`, `preview`
and `generate`) depends on this module; it depends on nothing but the error registry, so the
composition roots only ever import downward.

Exit codes (docs/cli.md): 0 passed / clean; 1 the run failed or check found errors or generate
--check found differences; 2 usage error; 3 refused before any data I/O (invalid input, plan or
pack mismatch); 4 transient (database unreachable, campaign busy, lease lost): retry; 5 cancelled;
130 / 143 stopped by SIGINT / SIGTERM (the chunk in flight rolled back and its lease released);
141 stdout closed by its reader (``dpone preview | head``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from dpone import errors
from dpone.credentials.redaction import redact_text
from dpone.errors import ErrorRecord, error_json_line

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_TRANSIENT, EXIT_CANCELLED = 0, 1, 2, 3, 4, 5
#: the reader of stdout went away (``dpone preview | head``): the shell's status for SIGPIPE
EXIT_BROKEN_PIPE = 141
#: stopped by SIGTERM / SIGINT: the shell's 128 + the signal number (dpone.lifecycle.interrupt)
EXIT_SIGTERM, EXIT_SIGINT = 143, 130
TRANSIENT_CODES = {
    errors.CONNECTION_FAILED,
    errors.MAPPING_CAMPAIGN_BUSY,
    errors.CHUNK_LEASE_LOST,
    errors.CHUNK_BUSY,
}


def use_colour(stream: Any) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to a non-empty value
    (https://no-color.org)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def json_lines() -> bool:
    """``DPONE_LOG_FORMAT=json`` (any case): every line dpone writes to stderr is JSON."""
    return os.environ.get("DPONE_LOG_FORMAT", "").strip().lower() == "json"


def report_error(record: ErrorRecord, *, extra: Sequence[ErrorRecord] = ()) -> None:
    """Human lines first, then the dpone.error.v1 JSON of the primary error as the last line;
    in JSON log mode the records alone (the others first), so every line is JSON."""
    if json_lines():
        for rec in extra:
            print(error_json_line(_redacted(rec)), file=sys.stderr)
    else:
        red, reset = ("\033[31m", "\033[0m") if use_colour(sys.stderr) else ("", "")
        for rec in (record, *extra):
            print(f"{red}error{reset}: {redact_text(str(rec))}", file=sys.stderr)
    print(error_json_line(_redacted(record)), file=sys.stderr, flush=True)


def _redacted(record: ErrorRecord) -> ErrorRecord:
    return ErrorRecord(record.code, redact_text(record.message), record.location)


def debug_enabled() -> bool:
    """DPONE_DEBUG shows tracebacks of internal errors; empty, 0, false, no and off mean off."""
    value = os.environ.get("DPONE_DEBUG", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def exit_code_for(code: str) -> int:
    """The exit code of a command that ``code`` stopped; an interrupted run exits with its
    signal's status (130 for SIGINT), the SIGTERM one when the signal is not known here."""
    if code == errors.USAGE:
        return EXIT_USAGE
    if code == errors.RUN_INTERRUPTED:
        return EXIT_SIGTERM
    if code in TRANSIENT_CODES:
        return EXIT_TRANSIENT
    if code == errors.CAMPAIGN_CANCELLED:
        return EXIT_CANCELLED
    if code in (
        errors.SINK_FAILED,
        errors.SOURCE_FAILED,
        errors.CHUNK_FAILED,
        errors.READ_BACK_MISMATCH,  # a chunk failed after its rows moved (and rolled back)
        errors.APPEND_ALREADY_WRITTEN,  # a chunk failed: its rows are there from an earlier try
        errors.RESULT_WRITE_FAILED,  # chunks committed, the result could not be written
        errors.VERIFY_MISMATCH,
    ):
        return EXIT_FAILED
    return EXIT_REFUSED


def documented_exit(code: str) -> str:
    """The exit code(s) docs/errors.md gives for ``code``: both signals' for an interruption."""
    if code == errors.RUN_INTERRUPTED:
        return f"{EXIT_SIGTERM} / {EXIT_SIGINT}"
    return str(exit_code_for(code))


class CommandParser(argparse.ArgumentParser):
    """argparse that reports usage errors as dpone.error.v1 with exit 2 (and keeps the record
    in ``refusals``, for the run result of a refused `dpone run`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusals: list[ErrorRecord] = []

    def error(self, message: str) -> NoReturn:
        record = ErrorRecord(errors.USAGE, f"{self.prog}: {message}")
        self.refusals.append(record)
        if not json_lines():
            self.print_usage(sys.stderr)
        report_error(record)
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, refusing an option that takes one value given twice (``--chunks 4
        --chunks 5`` kept the last silently, as if the first had not been typed)."""
        given = list(sys.argv[1:] if args is None else args)
        seen: set[argparse.Action] = set()
        for token in given:
            if token == "--":
                break
            action = self._option_of(token.split("=", 1)[0])
            if not isinstance(action, argparse._StoreAction):
                continue
            if action in seen:
                self.error(f"{action.option_strings[-1]} is given twice: give it once")
            seen.add(action)
        return super().parse_known_args(given, namespace)

    def _option_of(self, name: str) -> argparse.Action | None:
        """The option ``name`` stands for, as argparse reads it: its own name, or a long
        option's unambiguous prefix (``--chunk`` for ``--chunks``)."""
        found = self._option_string_actions.get(name)
        if found is not None or not name.startswith("--") or not self.allow_abbrev:
            return found
        matches = {a for o, a in self._option_string_actions.items() if o.startswith(name)}
        return matches.pop() if len(matches) == 1 else None

    def add_catalog(self, help_text: str) -> None:
        """The catalog as a positional argument or as ``--catalog`` (the form of `run`,
        `ledger` and `verify`); read it back with :meth:`catalog_of`."""
        self.add_argument("catalog", nargs="?", metavar="CATALOG", help=help_text)
        self.add_argument(
            "--catalog", dest="catalog_option", metavar="CATALOG", help="the same, as an option"
        )

    def catalog_of(self, args: argparse.Namespace) -> str:
        given = [c for c in (args.catalog, args.catalog_option) if c is not None]
        if not given:
            self.error("the catalog is required (CATALOG or --catalog CATALOG)")
        if len(given) == 2 and given[0] != given[1]:
            self.error("give the catalog once: CATALOG or --catalog CATALOG, not both")
        catalog: str = given[0]
        return catalog
