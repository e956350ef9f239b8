"""The output folder: atomic writes, stale removal, never touching a hand-written file, --check."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from dpone_generator import emit
from dpone_generator.cli import generate_command
from projects import project

MAPPED = "mapping: {mode: visible, max_items: 20, max_active: 2, pool: dpone_test}"


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    project(tmp_path / "repo", {"alpha": MAPPED, "beta": ""})
    return tmp_path


CATALOG = "repo/workloads.yaml"


def _gen(*, check: bool = False, out: str = "dags", catalog: str = CATALOG) -> int:
    return generate_command(catalog, out, check=check)


def test_first_run_writes_dag_files_and_pools_file(proj: Path) -> None:
    assert _gen() == 0
    names = sorted(p.name for p in (proj / "dags").iterdir())
    assert names == [".dpone-owner", "alpha.py", "beta.py", "dpone_pools.json"]
    owner = (proj / "dags" / ".dpone-owner").read_text(encoding="utf-8")
    assert owner.endswith("\ncatalog: repo/workloads.yaml\n")
    for path in (proj / "dags").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert _gen(check=True) == 0


def test_unchanged_files_are_not_rewritten(proj: Path) -> None:
    assert _gen() == 0
    before = {p.name: p.stat().st_mtime_ns for p in (proj / "dags").iterdir()}
    os.utime(proj / "dags" / "alpha.py", ns=(1, 1))
    assert _gen() == 0
    assert (proj / "dags" / "alpha.py").stat().st_mtime_ns == 1
    after = {p.name: p.stat().st_mtime_ns for p in (proj / "dags").iterdir()}
    assert after["beta.py"] == before["beta.py"]


def test_stale_generated_file_of_this_catalog_is_removed_others_are_kept(proj: Path) -> None:
    assert _gen() == 0
    hand = proj / "dags" / "hand_written.py"
    hand.write_text("from airflow import DAG\n", encoding="utf-8")
    project(proj / "repo", {"alpha": MAPPED})  # beta removed from the catalog
    assert _gen(check=True) == 1
    assert (proj / "dags" / "beta.py").exists()  # --check writes and removes nothing
    assert _gen() == 0
    names = sorted(p.name for p in (proj / "dags").iterdir())
    assert names == [".dpone-owner", "alpha.py", "dpone_pools.json", "hand_written.py"]
    assert hand.read_text(encoding="utf-8") == "from airflow import DAG\n"


def test_hand_written_file_with_a_generated_name_is_a_conflict(
    proj: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (proj / "dags").mkdir()
    (proj / "dags" / "alpha.py").write_text("# mine\n", encoding="utf-8")
    assert _gen() == 2
    err = capsys.readouterr().err
    assert (
        "dags/alpha.py: DPONE_GENERATE_CONFLICT: dags/alpha.py: exists and was not generated" in err
    )
    assert (proj / "dags" / "alpha.py").read_text(encoding="utf-8") == "# mine\n"
    assert not (proj / "dags" / "beta.py").exists()  # all or nothing
    assert _gen(check=True) == 2


def test_file_generated_from_another_catalog_is_a_conflict(
    proj: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder written by an older dpone (no owner file) still belongs to its catalog."""
    project(proj / "other", {"alpha": ""})
    assert _gen(catalog="other/workloads.yaml") == 0
    (proj / "dags" / ".dpone-owner").unlink()
    assert _gen() == 2
    assert "was generated from another catalog (other/workloads.yaml)" in capsys.readouterr().err


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_second_catalog_is_refused_and_touches_nothing(
    proj: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gen() == 0
    before = _tree(proj / "dags")
    project(proj / "other", {"gamma": MAPPED.replace("dpone_test", "other_pool")})
    for check in (False, True):
        assert _gen(catalog="other/workloads.yaml", check=check) == 2
        err = capsys.readouterr().err
        assert (
            "dags/.dpone-owner:3:1: DPONE_GENERATE_CONFLICT: dags/.dpone-owner: this folder "
            "belongs to catalog 'repo/workloads.yaml', not 'other/workloads.yaml'" in err
        )
    assert _tree(proj / "dags") == before  # no DAG removed, the pools file not replaced


def test_the_owner_does_not_depend_on_the_working_folder_or_path_spelling(
    proj: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Inside a git checkout the catalog is named relative to the repository root: absolute
    paths ($GITHUB_WORKSPACE/...) and runs from a subfolder are the same owner."""
    (proj / ".git").mkdir()
    assert _gen() == 0
    before = _tree(proj / "dags")
    assert _gen(catalog=str(proj / "repo" / "workloads.yaml"), out=str(proj / "dags")) == 0
    monkeypatch.chdir(proj / "repo")
    assert generate_command("workloads.yaml", "../dags", check=True) == 0
    assert generate_command("./../repo//workloads.yaml", "../dags", check=False) == 0
    assert _tree(proj / "dags") == before
    assert "0 removed" in capsys.readouterr().out


def test_empty_out_is_a_usage_error(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _gen(out="") == 2
    err = capsys.readouterr().err
    assert '"code":"DPONE_USAGE"' in err and "--out needs a folder" in err
    assert sorted(p.name for p in proj.iterdir()) == ["repo"]


def test_foreign_pools_file_is_a_conflict(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (proj / "dags").mkdir()
    (proj / "dags" / "dpone_pools.json").write_text('{"x": {"slots": 1}}', encoding="utf-8")
    assert _gen() == 2
    assert "is not a dpone pools file" in capsys.readouterr().err


def test_check_prints_a_unified_diff_per_file_and_the_fix(
    proj: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gen(check=True) == 1
    out, err = capsys.readouterr()
    assert "--- /dev/null\n+++ b/dags/alpha.py\n" in out
    assert "4 missing" in err and f"dpone generate {CATALOG} --out dags" in err
    assert not (proj / "dags").exists()
    assert _gen() == 0
    alpha = proj / "dags" / "alpha.py"
    text = alpha.read_text(encoding="utf-8")
    alpha.write_text(text.replace('TASK_ARGS = {"retries": 0}', 'TASK_ARGS = {"retries": 5}'))
    assert _gen(check=True) == 1
    out, err = capsys.readouterr()
    assert "--- a/dags/alpha.py\n+++ b/dags/alpha.py\n" in out
    assert '-TASK_ARGS = {"retries": 5}' in out and '+TASK_ARGS = {"retries": 0}' in out
    assert "1 changed, 0 missing, 0 stale" in err


def test_out_naming_a_file_is_an_error(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (proj / "dags").write_text("", encoding="utf-8")
    assert _gen() == 2
    assert "DPONE_GENERATE_OUTPUT_FAILED" in capsys.readouterr().err


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    proj: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gen() == 0
    alpha = proj / "dags" / "alpha.py"
    old = alpha.read_bytes()
    alpha.write_bytes(old.replace(b'"retries": 0', b'"retries": 7'))
    edited = alpha.read_bytes()
    assert edited != old

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(emit.os, "replace", broken_replace)
    assert _gen() == 2
    assert "No space left on device" in capsys.readouterr().err
    assert alpha.read_bytes() == edited
    assert sorted(p.name for p in (proj / "dags").iterdir()) == [
        ".dpone-owner",
        "alpha.py",
        "beta.py",
        "dpone_pools.json",
    ]


def test_header_catalog_reads_only_dpone_headers() -> None:
    assert emit.header_catalog("# Generated by dpone — do not edit.\n# catalog: a/b.yaml\n") == (
        "a/b.yaml"
    )
    assert emit.header_catalog("# catalog: a/b.yaml\n") is None
    assert emit.header_catalog("") is None


def test_a_write_failing_midway_puts_back_the_files_already_changed(
    proj: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Regression: alpha.py was replaced, beta.py failed, and the run said "nothing was written"
    assert _gen() == 0
    dags = proj / "dags"
    for name in ("alpha.py", "beta.py"):
        path = dags / name
        path.write_bytes(path.read_bytes().replace(b'"retries": 0', b'"retries": 7'))
    (dags / "gamma.py").write_bytes((dags / "alpha.py").read_bytes())  # stale: same catalog
    before = {p.name: p.read_bytes() for p in dags.iterdir()}
    real_replace = os.replace

    def replace_failing_on_beta(src: str, dst: str) -> None:
        if Path(dst).name == "beta.py":
            raise OSError(1, "Operation not permitted")
        real_replace(src, dst)

    monkeypatch.setattr(emit.os, "replace", replace_failing_on_beta)
    assert _gen() == 2
    err = capsys.readouterr().err
    assert "dags/beta.py: DPONE_GENERATE_OUTPUT_FAILED: cannot write dags/beta.py" in err
    assert "nothing was changed" in err
    assert {p.name: p.read_bytes() for p in dags.iterdir()} == before


def test_a_stale_file_that_cannot_be_removed_undoes_the_whole_write(
    proj: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gen() == 0
    dags = proj / "dags"
    alpha = dags / "alpha.py"
    alpha.write_bytes(alpha.read_bytes().replace(b'"retries": 0', b'"retries": 7'))
    (dags / "gamma.py").write_bytes(alpha.read_bytes())
    before = {p.name: p.read_bytes() for p in dags.iterdir()}
    real_unlink = Path.unlink

    def unlink_failing_on_gamma(self: Path, missing_ok: bool = False) -> None:
        if self.name == "gamma.py":
            raise OSError(1, "Operation not permitted")
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(emit.Path, "unlink", unlink_failing_on_gamma)
    assert _gen() == 2
    err = capsys.readouterr().err
    assert "cannot write dags/gamma.py: Operation not permitted" in err
    assert "nothing was changed" in err
    assert {p.name: p.read_bytes() for p in dags.iterdir()} == before


def test_a_folder_made_for_a_write_that_failed_is_removed(
    proj: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(emit.os, "replace", broken_replace)
    assert _gen() == 2
    assert "nothing was changed" in capsys.readouterr().err
    assert not (proj / "dags").exists()


def test_check_names_an_absolute_folder_as_it_is(
    proj: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(proj / "abs-dags")
    assert _gen(check=True, out=out) == 1
    diff = capsys.readouterr().out
    assert f"--- /dev/null\n+++ {out}/alpha.py\n" in diff  # not b//...: no a/ b/ prefix


@pytest.mark.parametrize("folder", ['say "hi"', "back\\slash", "new\nline"])
def test_a_catalog_whose_path_needs_escaping_regenerates_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str
) -> None:
    monkeypatch.chdir(tmp_path)
    project(tmp_path / folder, {"alpha": MAPPED})
    catalog = f"{folder}/workloads.yaml"
    assert _gen(catalog=catalog) == 0
    owner = (tmp_path / "dags" / ".dpone-owner").read_text(encoding="utf-8")
    assert len(owner.splitlines()) == 3  # the path stays on the owner line, escaped
    assert _gen(catalog=catalog) == 0
    assert _gen(catalog=catalog, check=True) == 0
