"""Every golden/<case>/expected/ is exactly what `dpone generate` writes for that case, byte for byte."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from dpone_generator.cli import generate_command
from generator_support import GOLDEN, UPDATE_GOLDENS, golden_cases, tree_bytes


def _explain(case: str, expected: dict[str, bytes], actual: dict[str, bytes]) -> str:
    lines = [f"golden case {case!r} differs from what dpone generate writes:"]
    for name in sorted(set(expected) - set(actual)):
        lines.append(f"  extra file in expected/ (no longer generated): {name}")
    for name in sorted(set(actual) - set(expected)):
        lines.append(f"  missing from expected/: {name}")
    for name in sorted(set(expected) & set(actual)):
        if expected[name] != actual[name]:
            diff = difflib.unified_diff(
                expected[name].decode("utf-8", "replace").splitlines(keepends=True),
                actual[name].decode("utf-8", "replace").splitlines(keepends=True),
                fromfile=f"expected/{name}",
                tofile=f"generated/{name}",
                n=1,
            )
            lines.append("".join(list(diff)[:60]))
    lines.append(f"If the change is deliberate, update every golden with: {UPDATE_GOLDENS}")
    return "\n".join(lines)


def test_there_are_golden_cases() -> None:
    assert {"hooks_subprocess", "shared_pool", "gitops_policy", "internal_default"} <= set(
        golden_cases()
    )


@pytest.mark.parametrize("case", golden_cases())
def test_golden_case_regenerates_byte_for_byte(case: str, in_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = generate_command(f"golden/{case}/workloads.yaml", str(out), check=False)
    assert code == 0
    expected_dir = GOLDEN / case / "expected"
    assert expected_dir.is_dir(), f"no expected/ for {case}; run: {UPDATE_GOLDENS}"
    expected, actual = tree_bytes(expected_dir), tree_bytes(out)
    assert expected == actual, _explain(case, expected, actual)


@pytest.mark.parametrize("case", golden_cases())
def test_check_mode_says_golden_is_up_to_date(
    case: str, in_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = generate_command(f"golden/{case}/workloads.yaml", f"golden/{case}/expected", check=True)
    assert code == 0, capsys.readouterr().out[-3000:] + f"\nupdate with: {UPDATE_GOLDENS}"
