"""The only step that touches the output folder: compare, then write atomically or report a diff.

Ownership is read from the files themselves. A ``.py`` file is dpone's when its first line is the
generated marker; it belongs to a catalog when its ``# catalog:`` header line names it. dpone
replaces its own files, removes the ones of the same catalog that are no longer produced (stale),
and never overwrites or removes a file it did not write (DPONE_GENERATE_CONFLICT). The pools file
is recognised by its shape (see pools.is_pools_document).

One catalog owns a folder: the owner file (``.dpone-owner``) names it by its repository-relative
path (build.catalog_identity). A second catalog is refused before anything is written, so its
run can neither remove the first one's DAG files as stale nor replace its pools file.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dpone import errors
from dpone.errors import ErrorRecord, Location

from .dagspec import GENERATED_MARKER, POOLS_FILE_NAME
from .pools import is_pools_document

CATALOG_LINE = "# catalog: "
OWNER_FILE_NAME = ".dpone-owner"
OWNER_LINE = "catalog: "
HEADER_LINES = 8
NEW_FILE_MODE = 0o644


@dataclass(frozen=True)
class OutputFile:
    """One file the generator produces: its name inside the output folder and its exact text."""

    name: str
    text: str


@dataclass(frozen=True)
class Change:
    """One difference between the folder and the generator's output."""

    name: str
    kind: str  # "missing" | "changed" | "stale"
    old: str | None
    new: str | None


@dataclass(frozen=True)
class EmitPlan:
    out_dir: Path
    changes: tuple[Change, ...]
    unchanged: tuple[str, ...]

    @property
    def up_to_date(self) -> bool:
        return not self.changes

    def count(self, kind: str) -> int:
        return sum(1 for change in self.changes if change.kind == kind)


def header_catalog(text: str) -> str | None:
    """The catalog a generated file names, or None when the file is not dpone's."""
    lines = text.split("\n", HEADER_LINES)
    if not lines or lines[0] != GENERATED_MARKER:
        return None
    for line in lines[1:HEADER_LINES]:
        if line.startswith(CATALOG_LINE):
            return line[len(CATALOG_LINE) :]
    return None


def owner_document(catalog: str) -> str:
    """The owner file's text: which catalog generates every file of this folder."""
    return (
        "# Written by dpone generate: the DAG files and the pools file of this folder are\n"
        "# generated from one catalog. Another catalog needs another --out folder.\n"
        f"{OWNER_LINE}{catalog}\n"
    )


def owner_of(text: str) -> str | None:
    """The catalog an owner file names, or None when the text is not an owner file."""
    for line in text.splitlines():
        if line.startswith(OWNER_LINE):
            return line[len(OWNER_LINE) :]
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None


def _conflict(display: str, why: str) -> ErrorRecord:
    return ErrorRecord(
        errors.GENERATED_FILE_CONFLICT,
        f"{display}: {why}; dpone never overwrites a file it did not generate for this catalog "
        f"(rename the dag_id, or move or delete the file)",
        Location(display),
    )


def plan_emit(
    out_dir: Path, out_display: str, files: Sequence[OutputFile], catalog: str
) -> tuple[EmitPlan | None, list[ErrorRecord]]:
    """Compare the folder with ``files``: what is missing, changed, stale; or the conflicts."""
    problems: list[ErrorRecord] = []
    changes: list[Change] = []
    unchanged: list[str] = []
    wanted = {f.name for f in files}
    try:
        if out_dir.exists() and not out_dir.is_dir():
            where = Location(out_display)
            message = f"--out {out_display} is a file, not a folder"
            return None, [ErrorRecord(errors.GENERATE_OUTPUT_FAILED, message, where)]
        if out_dir.is_dir() and not (out_dir / OWNER_FILE_NAME).exists():
            for path in sorted(out_dir.glob("*.py")):
                old = _read_text(path) if path.is_file() and not path.is_symlink() else None
                other = header_catalog(old) if old is not None else None
                if other is not None and other != catalog:
                    problems.append(
                        _conflict(
                            f"{out_display}/{path.name}",
                            f"was generated from another catalog ({other}): this folder "
                            "belongs to it; give each catalog its own --out folder",
                        )
                    )
            if problems:
                return None, problems
        for output in sorted(files, key=lambda f: f.name != OWNER_FILE_NAME):
            path = out_dir / output.name
            display = f"{out_display}/{output.name}"
            if not path.exists() and not path.is_symlink():
                changes.append(Change(output.name, "missing", None, output.text))
                continue
            if path.is_symlink() or not path.is_file():
                problems.append(_conflict(display, "exists and is not a regular file"))
                continue
            old = _read_text(path)
            if old is None:
                problems.append(_conflict(display, "exists and is not UTF-8 text"))
                continue
            if output.name == OWNER_FILE_NAME:
                owner = owner_of(old)
                if owner != catalog:
                    line = next(
                        (
                            i
                            for i, text in enumerate(old.splitlines(), 1)
                            if text.startswith(OWNER_LINE)
                        ),
                        1,
                    )
                    return None, [
                        ErrorRecord(
                            errors.GENERATED_FILE_CONFLICT,
                            f"{display}: this folder belongs to catalog {owner!r}, not "
                            f"{catalog!r}; give each catalog its own --out folder",
                            Location(display, line, 1),
                        )
                    ]
            elif output.name == POOLS_FILE_NAME:
                if not is_pools_document(old):
                    problems.append(_conflict(display, "exists and is not a dpone pools file"))
                    continue
            else:
                owner = header_catalog(old)
                if owner is None:
                    problems.append(_conflict(display, "exists and was not generated by dpone"))
                    continue
                if owner != catalog:
                    problems.append(
                        _conflict(display, f"was generated from another catalog ({owner})")
                    )
                    continue
            if old == output.text:
                unchanged.append(output.name)
            else:
                changes.append(Change(output.name, "changed", old, output.text))
        if out_dir.is_dir():
            for path in sorted(out_dir.glob("*.py")):
                if path.name in wanted or path.is_symlink() or not path.is_file():
                    continue
                old = _read_text(path)
                if old is not None and header_catalog(old) == catalog:
                    changes.append(Change(path.name, "stale", old, None))
    except OSError as exc:
        message = f"cannot read {out_display}: {exc.strerror or exc}"
        return None, [ErrorRecord(errors.GENERATE_OUTPUT_FAILED, message, Location(out_display))]
    if problems:
        return None, problems
    changes.sort(key=lambda change: change.name)
    return EmitPlan(out_dir, tuple(changes), tuple(sorted(unchanged))), []


def _staged(path: Path, text: str) -> str:
    """``text`` in a temp file beside ``path`` (synced, with the mode ``path`` has or a new
    file's): the name to move over ``path``."""
    mode = path.stat().st_mode & 0o777 if path.exists() else NEW_FILE_MODE
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _write_atomic(path: Path, text: str) -> None:
    """Temp file in the same folder + os.replace: readers (Airflow's parser) never see half a file."""
    tmp = _staged(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def apply_emit(plan: EmitPlan, out_display: str) -> tuple[list[ErrorRecord], bool]:
    """All or nothing: every new text is staged in a temp file first, then each is moved over
    its file (atomically: Airflow's parser never sees half a file) and the stale files are
    removed. When one step fails, the files already changed get their old text back, so the
    folder is as it was; the error names the file that failed. Returns the errors and whether
    the folder is as it was before."""
    created = not plan.out_dir.exists()
    try:
        plan.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [_output_failed(out_display, exc)], True
    staged: dict[str, str] = {}
    done: list[Change] = []  # changes already made, to undo in reverse
    failed = out_display
    try:
        for change in plan.changes:
            if change.new is not None:
                failed = f"{out_display}/{change.name}"
                staged[change.name] = _staged(plan.out_dir / change.name, change.new)
        for change in plan.changes:
            failed = f"{out_display}/{change.name}"
            if change.new is not None:
                os.replace(staged[change.name], plan.out_dir / change.name)
                del staged[change.name]
            else:  # stale
                (plan.out_dir / change.name).unlink(missing_ok=True)
            done.append(change)
    except OSError as exc:
        for tmp in staged.values():
            Path(tmp).unlink(missing_ok=True)
        kept = _undo(plan.out_dir, done)
        record = _output_failed(failed, exc)
        if kept:
            record = ErrorRecord(
                record.code,
                f"{record.message}; {len(kept)} file(s) already changed could not be put back: "
                f"{', '.join(kept)}",
                record.location,
            )
        elif created:
            with contextlib.suppress(OSError):
                plan.out_dir.rmdir()
        return [record], not kept
    return [], True


def _undo(out_dir: Path, done: list[Change]) -> list[str]:
    """Put back the old text of each change made (a new file removed); the names it could not."""
    kept: list[str] = []
    for change in reversed(done):
        path = out_dir / change.name
        try:
            if change.old is None:
                path.unlink(missing_ok=True)
            else:
                _write_atomic(path, change.old)
        except OSError:
            kept.append(change.name)
    return sorted(kept)


def _output_failed(where: str, exc: OSError) -> ErrorRecord:
    return ErrorRecord(
        errors.GENERATE_OUTPUT_FAILED,
        f"cannot write {where}: {exc.strerror or exc}",
        Location(where),
    )


def unified_diff(change: Change, out_display: str) -> str:
    """A reviewable diff of one change (``/dev/null`` stands for a missing side)."""
    side = "" if out_display.startswith("/") else "{}/"  # an absolute folder stays as it is
    path = f"{out_display.rstrip('/')}/{change.name}"
    old_name = side.format("a") + path if change.old is not None else "/dev/null"
    new_name = side.format("b") + path if change.new is not None else "/dev/null"
    lines = difflib.unified_diff(
        (change.old or "").splitlines(keepends=True),
        (change.new or "").splitlines(keepends=True),
        fromfile=old_name,
        tofile=new_name,
    )
    text = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
    return text
