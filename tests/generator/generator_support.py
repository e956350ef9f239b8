"""Shared helpers of the generator tests: the repository root, golden cases, running the CLI."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden"
INVALID = ROOT / "tests" / "invalid_catalogs"
UPDATE_GOLDENS = "python -m dpone_generator.update_goldens"
HARNESS = ROOT / "tests" / "airflow" / "harness"
if str(HARNESS) not in sys.path:
    sys.path.append(str(HARNESS))  # hostile_values, the harness (standard library only)


def golden_cases() -> list[str]:
    return sorted(p.parent.name for p in GOLDEN.glob("*/workloads.yaml"))


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run from the repository root: headers name catalogs relative to it, as CI does."""
    monkeypatch.chdir(ROOT)
    yield ROOT


def write_catalog(folder: Path, files: dict[str, str]) -> Path:
    """Write a small project (catalog + manifests) into ``folder``; returns the catalog path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder / "workloads.yaml"


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def env_without_python_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
