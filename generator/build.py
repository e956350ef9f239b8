"""The whole generator on one screen: load -> validate -> plan -> render -> format -> files.

Nothing here touches the output folder (emit does); the same Build serves `dpone generate`,
`--check`, the golden tests and the benchmark.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dpone import errors
from dpone.errors import DponeError, ErrorRecord
from dpone.packing.pack import WorkloadPack

from .check import catalog_problems
from .dagspec import POOLS_FILE_NAME, DagFile, dag_file
from .emit import OWNER_FILE_NAME, OutputFile, owner_document
from .format import FormatError, format_rendered
from .pools import PoolSpec, plan_pools, pools_document
from .render import comment_text, render_dag


@dataclass(frozen=True)
class Build:
    """What one catalog generates, or every error that stops it."""

    catalog: str  # display form written into headers
    dags: tuple[DagFile, ...]
    pools: tuple[PoolSpec, ...]
    files: tuple[OutputFile, ...]
    errors: tuple[ErrorRecord, ...]
    packs: tuple[WorkloadPack, ...] = ()  # what the files were made from (campaign changes)

    @property
    def owner(self) -> str:
        """The catalog as a header's ``# catalog:`` line spells it (how emit recognises ours)."""
        return comment_text(self.catalog)


def catalog_identity(path: str) -> str:
    """Which catalog owns an output folder: its path relative to the repository root (the nearest
    folder above the catalog that holds ``.git``), so neither the working directory nor an
    absolute or relative spelling changes it. Outside a git checkout: ``display_path``."""
    try:
        real = Path(path).resolve()
    except (OSError, RuntimeError):
        return display_path(path)
    for parent in real.parents:
        if (parent / ".git").exists():
            return real.relative_to(parent).as_posix()
    return display_path(path)


def display_path(path: str) -> str:
    """The catalog path as headers show it: as given, POSIX, relative (never a machine's root).

    An absolute path is made relative to the working directory, so a CI checkout and a laptop
    write the same header when both run from the repository root.
    """
    raw = Path(path)
    if raw.is_absolute():
        try:
            raw = Path(os.path.relpath(raw, Path.cwd()))
        except ValueError:  # another drive (Windows): the file name is all that is portable
            raw = Path(raw.name)
    text = PurePosixPath(*raw.parts).as_posix() if raw.parts else "."
    return os.path.normpath(text).replace(os.sep, "/")


PARALLEL_MIN_FILES = 48
JOBS_ENV = "DPONE_GENERATE_JOBS"
MAX_JOBS = 64


def render_file(dag: DagFile) -> OutputFile:
    return OutputFile(dag.file_name, format_rendered(render_dag(dag)))


def configured_jobs() -> int | None:
    """DPONE_GENERATE_JOBS as a whole number from 1 to MAX_JOBS, None when unset or blank; a
    malformed value is refused, not ignored, so a typo does not silently change the worker count."""
    raw = os.environ.get(JOBS_ENV, "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) < 10 and 1 <= int(raw) <= MAX_JOBS):
        raise DponeError(
            errors.CONFIG_INVALID,
            f"{JOBS_ENV} must be a whole number of worker processes from 1 to {MAX_JOBS} "
            f"(unset: one per usable CPU for big catalogs); got {raw[:40]!r}",
        )
    return int(raw)


def render_jobs(count: int) -> int:
    """Worker processes for ``count`` files: DPONE_GENERATE_JOBS, else one per usable CPU for
    big catalogs on Linux (fork shares the loaded modules), else 1."""
    configured = configured_jobs()
    if configured is not None:
        return configured
    if count < PARALLEL_MIN_FILES or sys.platform != "linux":
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def render_files(dags: tuple[DagFile, ...]) -> list[OutputFile]:
    """Render and format every DAG file, in order.

    black costs milliseconds per file even on the small skeleton, so a catalog of hundreds of
    workloads is formatted by forked workers; map keeps the order, so the bytes are the same.
    """
    jobs = render_jobs(len(dags))
    if jobs < 2:
        return [render_file(dag) for dag in dags]
    context = multiprocessing.get_context("fork")
    chunk = max(1, len(dags) // (jobs * 4))
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        return list(pool.map(render_file, dags, chunksize=chunk))


def build(catalog_path: str) -> Build:
    """Run every step up to the files' bytes; all errors of all steps are collected."""
    display = catalog_identity(catalog_path)
    try:
        configured_jobs()  # refused before the catalog is read, like every setting
    except DponeError as exc:
        return Build(display, (), (), (), exc.records)
    packs, problems = catalog_problems(catalog_path)
    if problems:
        return Build(display, (), (), (), tuple(problems))
    return build_from_packs(display, packs)


def build_from_packs(display: str, packs: list[WorkloadPack]) -> Build:
    """plan -> render -> format for packs already compiled and validated."""
    dags = tuple(dag_file(pack, display) for pack in packs)
    pools = plan_pools(packs)
    try:
        files = render_files(dags)
    except FormatError as exc:
        record = ErrorRecord(errors.INTERNAL, f"generated DAG did not format: {exc}")
        return Build(display, dags, pools, (), (record,))
    files.append(OutputFile(POOLS_FILE_NAME, pools_document(pools)))
    # the owner file names the catalog as the headers spell it: that is what emit compares
    files.append(OutputFile(OWNER_FILE_NAME, owner_document(comment_text(display))))
    return Build(display, dags, pools, tuple(files), (), tuple(packs))
