"""The whole generator on one screen: load -> validate -> plan -> render -> format -> files.

Nothing here touches the output folder (emit does); the same Build serves `dpone generate`,
`--check`, the golden tests and the benchmark.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dpone import errors
from dpone.errors import ErrorRecord
from dpone.pack import WorkloadPack, load_and_compile

from .dagspec import POOLS_FILE_NAME, DagFile, dag_file
from .emit import OutputFile
from .format import FormatError, format_rendered
from .pools import PoolSpec, plan_pools, pools_document
from .render import comment_text, render_dag
from .validate import validate_for_airflow


@dataclass(frozen=True)
class Build:
    """What one catalog generates, or every error that stops it."""

    catalog: str  # display form written into headers
    dags: tuple[DagFile, ...]
    pools: tuple[PoolSpec, ...]
    files: tuple[OutputFile, ...]
    errors: tuple[ErrorRecord, ...]

    @property
    def owner(self) -> str:
        """The catalog as a header's ``# catalog:`` line spells it (how emit recognises ours)."""
        return comment_text(self.catalog)


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


def render_file(dag: DagFile) -> OutputFile:
    return OutputFile(dag.file_name, format_rendered(render_dag(dag)))


def build(catalog_path: str) -> Build:
    """Run every step up to the files' bytes; all errors of all steps are collected."""
    display = display_path(catalog_path)
    catalog, packs, problems = load_and_compile(catalog_path)
    if catalog is None or problems:
        return Build(display, (), (), (), tuple(problems))
    problems = validate_for_airflow(catalog)
    if problems:
        return Build(display, (), (), (), tuple(problems))
    return build_from_packs(display, packs)


def build_from_packs(display: str, packs: list[WorkloadPack]) -> Build:
    """plan -> render -> format for packs already compiled and validated."""
    dags = tuple(dag_file(pack, display) for pack in packs)
    pools = plan_pools(packs)
    try:
        files = [render_file(dag) for dag in dags]
    except FormatError as exc:
        record = ErrorRecord(errors.INTERNAL, f"generated DAG did not format: {exc}")
        return Build(display, dags, pools, (), (record,))
    files.append(OutputFile(POOLS_FILE_NAME, pools_document(pools)))
    return Build(display, dags, pools, tuple(files), ())
