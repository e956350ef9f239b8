"""Shared pieces of the fuzz suite: the case budget, the in-process CLI runner and the oracle.

Every case goes through the real composition root (`dpone.cli.main`), in-process, with the
environment set exactly as a pod would see it. The oracle is the same for every target: no
traceback, an exit code from the documented set, and a ``dpone.error.v1`` record whose code is
registered (and is not DPONE_INTERNAL, which is how the CLI reports an unhandled exception).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from dpone import errors
from dpone.cli import main as dpone_main
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden"
ERROR_SCHEMA_PATH = REPO / "runtime" / "src" / "dpone" / "schemas" / "error.v1.schema.json"

# Exit codes documented in dpone.cli (docs/cli.md).
RUN_EXIT_CODES = {0, 1, 2, 3, 4, 5}
CHECK_EXIT_CODES = {0, 1, 2}

# Default CI budget: the sum of every fuzz test's share (>= 10,000 cases). DPONE_FUZZ_EXAMPLES
# scales the whole suite (`make fuzz-long` sets it to 200,000).
DEFAULT_TOTAL = 10_400
CASES: Counter[str] = Counter()


def total_budget() -> int:
    raw = os.environ.get("DPONE_FUZZ_EXAMPLES", "")
    return int(raw) if raw.strip() else DEFAULT_TOTAL


def examples(share: float) -> int:
    """This test's number of cases: its share of the total budget."""
    return max(10, round(total_budget() * share))


def fuzz_settings(share: float) -> settings:
    """Hypothesis settings of a fuzz test with this share of the budget: reproducible
    (derandomized, no example database), no deadline on a loaded machine."""
    return settings(
        max_examples=examples(share),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@cache
def error_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(ERROR_SCHEMA_PATH.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def last_stderr_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""


@contextlib.contextmanager
def patched_environ(env: Mapping[str, str | None]) -> Iterator[None]:
    """Set (value) or remove (None) variables for the duration; restores exactly afterwards."""
    saved = {key: os.environ.get(key) for key in env}
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cli(argv: list[str], env: Mapping[str, str | None] | None = None) -> CliResult:
    """`dpone.cli.main(argv)` in-process with ``env`` applied; stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with (
        patched_environ(env or {}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = dpone_main(argv)
        except SystemExit as exc:  # main() must not raise it, but report it if it does
            raise AssertionError(f"dpone.cli.main raised SystemExit({exc.code!r})") from exc
    return CliResult(code, out.getvalue(), err.getvalue())


def assert_error_record(record: Any, context: str) -> dict[str, Any]:
    """One dpone.error.v1 object: schema-valid, registered code, not an internal error."""
    problems = sorted(error_validator().iter_errors(record), key=str)
    assert not problems, f"{context}: not a dpone.error.v1 record: {problems[0].message}: {record}"
    code = record["code"]
    assert code in errors.REGISTRY, f"{context}: unregistered error code {code}"
    assert code != errors.INTERNAL, f"{context}: unhandled exception inside dpone: {record}"
    assert record["retryable"] == errors.REGISTRY[code].retryable, context
    return dict(record)


def assert_no_traceback(result: CliResult, context: str) -> None:
    for stream in (result.stdout, result.stderr):
        assert "Traceback (most recent call last)" not in stream, f"{context}: {stream[-2000:]}"


def check_run_result(result: CliResult, context: str) -> dict[str, Any] | None:
    """The oracle of `dpone run`: documented exit code; on failure the last stderr line is the
    dpone.error.v1 JSON of the primary error. Returns that record (None on exit 0)."""
    assert_no_traceback(result, context)
    assert result.code in RUN_EXIT_CODES, f"{context}: exit {result.code}: {result.stderr[-800:]}"
    if result.code == 0:
        return None
    line = result.last_stderr_line
    try:
        record = json.loads(line)
    except ValueError:
        raise AssertionError(
            f"{context}: last stderr line is not JSON: {line[:300]!r}\n{result.stderr[-800:]}"
        ) from None
    return assert_error_record(record, context)


def check_check_result(result: CliResult, context: str) -> list[dict[str, Any]]:
    """The oracle of `dpone check --format json`: exit 0 with [] or exit 1 with a non-empty list
    of dpone.error.v1 records on stdout (exit 2 only for usage errors, which fuzzing never makes).
    """
    assert_no_traceback(result, context)
    assert result.code in CHECK_EXIT_CODES, f"{context}: exit {result.code}: {result.stderr[-800:]}"
    assert result.code != 2, f"{context}: usage error: {result.stderr[-800:]}"
    try:
        records = json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"{context}: stdout is not JSON: {result.stdout[:300]!r}") from None
    assert isinstance(records, list), context
    if result.code == 0:
        assert records == [], f"{context}: exit 0 with errors {records}"
    else:
        assert records, f"{context}: exit 1 without an error record"
    return [assert_error_record(record, context) for record in records]


def count(target: str, n: int = 1) -> None:
    CASES[target] += n


def write_report(path: Path) -> None:
    """Append this session's case counts (read by docs/validation-report.md's author)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"total": sum(CASES.values()), "by_target": dict(sorted(CASES.items()))}
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def python_executable() -> str:
    return sys.executable
