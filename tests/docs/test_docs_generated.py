"""docs/errors.md and docs/reference/schemas.md are generated: they must match their sources."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _build_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_docs", ROOT / "scripts" / "build_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_docs", module)
    spec.loader.exec_module(module)
    return module


def test_generated_references_are_up_to_date() -> None:
    build_docs = _build_docs()
    stale = build_docs.stale_outputs(ROOT)
    if stale:
        diffs = "\n".join(diff[:4000] for diff in stale.values())
        raise AssertionError(
            f"{', '.join(stale)} differ from their sources (errors.REGISTRY, schemas/*.json).\n"
            f"Update them with:\n\n    {build_docs.UPDATE_COMMAND}\n\n{diffs}"
        )


def test_generation_is_deterministic() -> None:
    build_docs = _build_docs()
    for render in build_docs.OUTPUTS.values():
        assert render() == render()


def test_every_registered_code_has_its_section() -> None:
    from dpone.errors import REGISTRY

    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    missing = [code for code in REGISTRY if f"\n## {code}\n" not in text]
    assert (
        not missing
    ), f"docs/errors.md lacks {missing}: run .venv/bin/python scripts/build_docs.py"


def test_every_schema_is_in_the_reference() -> None:
    text = (ROOT / "docs" / "reference" / "schemas.md").read_text(encoding="utf-8")
    for path in sorted((ROOT / "schemas").glob("*.schema.json")):
        assert f"schemas/{path.name}" in text, path.name
