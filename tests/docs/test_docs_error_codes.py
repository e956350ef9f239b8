"""Error codes and DPONE_* names: one registry, and nothing in the code or the docs outside it.

- every code the code base raises (``errors.X``, or a "DPONE_..." literal) is registered;
- every DPONE_* name in README/docs is a registered code or an environment variable documented
  in docs/cli.md (section Environment), and every variable documented there is really used;
- every DPONE_* name in the source (Python, templates, scripts) is one of those two as well.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from docs_markdown import ROOT, markdown_files
from dpone import errors
from dpone.errors import REGISTRY

NAME = re.compile(r"DPONE_[A-Z0-9_]+")
SOURCE_DIRS = ("runtime/src/dpone", "generator", "templates", "scripts")
SOURCE_SUFFIXES = {".py", ".jinja", ".sh"}
ERROR_FACTORIES = {"DponeError", "ErrorRecord", "add", "_register", "_fail", "PolicyProblem"}
NON_CODE_ATTRIBUTES = {
    "REGISTRY",
    "DponeError",
    "ErrorRecord",
    "ErrorCollector",
    "ErrorCode",
    "Location",
    "error_json_line",
}


def source_files() -> list[Path]:
    files: list[Path] = []
    for folder in SOURCE_DIRS:
        base = ROOT / folder
        files.extend(
            p for p in sorted(base.rglob("*")) if p.is_file() and p.suffix in SOURCE_SUFFIXES
        )
    return files


def names_in(text: str) -> list[tuple[str, bool]]:
    """(name, is_prefix): a name ending in '_' (DPONE_CONN_<NAME>, DPONE_AIRFLOW_*) is a prefix."""
    return [(m.group(0), m.group(0).endswith("_")) for m in NAME.finditer(text)]


def documented_environment() -> tuple[set[str], set[str]]:
    """(variables, prefixes) listed in docs/cli.md's Environment section."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    match = re.search(r"^## Environment\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, "docs/cli.md has no '## Environment' section"
    names, prefixes = set(), set()
    for line in match.group(1).splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        for name, is_prefix in names_in(first_cell):
            (prefixes if is_prefix else names).add(name)
    return names, prefixes


def known(name: str, is_prefix: bool, env: set[str], env_prefixes: set[str]) -> bool:
    if name in REGISTRY or name in env:
        return True
    if any(name.startswith(p) for p in env_prefixes):
        return True
    if is_prefix:
        return any(other.startswith(name) for other in (*REGISTRY, *env, *env_prefixes))
    return False


def test_registry_codes_are_well_formed() -> None:
    for code, entry in REGISTRY.items():
        assert re.fullmatch(r"DPONE_[A-Z0-9_]+[A-Z0-9]", code), code
        assert entry.code == code
        for text in (entry.meaning, entry.cause, entry.fix):
            assert text.strip(), f"{code}: meaning, cause and fix are all required"


def test_code_references_are_registered() -> None:
    """errors.X must exist and name a registered code; literal codes passed to DponeError,
    ErrorRecord, ErrorCollector.add and friends must be registered."""
    problems = []
    for path in source_files():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "errors"
                and node.attr not in NON_CODE_ATTRIBUTES
            ):
                value = getattr(errors, node.attr, None)
                if not (isinstance(value, str) and value in REGISTRY):
                    problems.append(f"{rel}:{node.lineno}: errors.{node.attr} is not a code")
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                first = node.args[0]
                if (
                    called in ERROR_FACTORIES
                    and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                    and first.value.startswith("DPONE_")
                    and first.value not in REGISTRY
                ):
                    problems.append(f"{rel}:{node.lineno}: {first.value} is not registered")
    assert not problems, "\n".join(problems)


def test_source_names_are_codes_or_documented_variables() -> None:
    env, env_prefixes = documented_environment()
    problems = []
    for path in source_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for name, is_prefix in names_in(line):
                if not known(name, is_prefix, env, env_prefixes):
                    problems.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert not problems, (
        "DPONE_* names that are neither registered error codes (dpone/errors.py) nor variables "
        "documented in docs/cli.md '## Environment':\n" + "\n".join(sorted(set(problems)))
    )


def test_documented_variables_exist_in_the_source() -> None:
    env, env_prefixes = documented_environment()
    tests = sorted((ROOT / "tests").rglob("*.py"))  # test-only variables live there
    text = "\n".join(p.read_text(encoding="utf-8") for p in [*source_files(), *tests])
    missing = sorted(name for name in env | env_prefixes if name not in text)
    assert not missing, f"docs/cli.md documents variables the code never uses: {missing}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_names_are_codes_or_documented_variables(path: Path) -> None:
    env, env_prefixes = documented_environment()
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for name, is_prefix in names_in(line):
            if not known(name, is_prefix, env, env_prefixes):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert not problems, (
        "unknown DPONE_* names (not in dpone.errors.REGISTRY, not a variable in docs/cli.md "
        "'## Environment'):\n" + "\n".join(problems)
    )
