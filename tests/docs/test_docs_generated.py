"""docs/errors.md and docs/reference/schemas.md are generated: they must match their sources."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from dpone.errors import REGISTRY

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


def test_exit_codes_are_documented_alike_everywhere() -> None:
    """An interrupted run exits 143 (SIGTERM) or 130 (SIGINT): the code, docs/errors.md (from the
    registry), docs/cli.md's exit-code table and `dpone run --help` all say so; no error code's
    documented exit differs from the one the code returns."""
    from dpone.observability.reporting import documented_exit, exit_code_for

    errors_md = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    assert "| [`DPONE_RUN_INTERRUPTED`](#dpone_run_interrupted) | yes | 143 / 130 |" in errors_md
    assert "- **Retryable:** yes; **exit code:** 143 / 130" in errors_md
    assert exit_code_for("DPONE_RUN_INTERRUPTED") == 143
    for code in REGISTRY:
        if code != "DPONE_RUN_INTERRUPTED":
            assert documented_exit(code) == str(exit_code_for(code))
    cli_md = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = cli_md.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")}
    assert {"143", "130"} <= rows
    from dpone.cli import _run_parser

    assert "130 / 143" in _run_parser().format_help()
