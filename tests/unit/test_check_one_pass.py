"""`dpone check` keeps its promise (cli.md, ci.md): one pass reports every problem of the catalog
and of every manifest it can read; Kubernetes quantities are taken as the API takes them; a
ledger backend with no store is refused where it is written; the default catalog path is where
deploy/Containerfile puts the catalog."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from dpone.authoring import loader
from dpone.cli import main

from tests.unit.support import BACKFILL_MANIFEST, REPO, write, write_project

SECRETS = "    airflow:\n      image: registry.example.com/dpone:1\n      secrets: [{connection: wh, secret: s, key: dsn}]\n"


def _check(catalog: Path, capsys: pytest.CaptureFixture[str]) -> list[tuple[str, str, int]]:
    code = main(["check", str(catalog), "--format", "json"])
    records = json.loads(capsys.readouterr().out)
    assert code == (1 if records else 0)
    return [(r["code"], Path(r["file"]).name, r["line"]) for r in records]


def test_a_catalog_schema_error_does_not_hide_the_manifests_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = write_project(
        tmp_path,
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  orders:\n"
        "    manifest: orders.yaml\n"
        "    airflow: {image: registry.example.com/dpone:1, colour: red}\n"
        "  broken:\n"
        "    manifest: broken.yaml\n"
        "  gone:\n"
        "    manifest: gone.yaml\n",
        {
            "orders.yaml": BACKFILL_MANIFEST.replace("inner_mode: replace", "inner_mode: sideways"),
            "broken.yaml": "schema: dpone.pipeline.v1\nprocesses: [\n",
        },
    )
    assert _check(catalog, capsys) == [
        ("DPONE_CATALOG_INVALID", "workloads.yaml", 5),  # the unknown field
        ("DPONE_MANIFEST_INVALID", "orders.yaml", 13),  # inner_mode
        ("DPONE_YAML_INVALID", "broken.yaml", 3),  # cannot be parsed: one problem
        ("DPONE_FILE_NOT_FOUND", "workloads.yaml", 9),  # at the catalog entry naming it
    ]


def test_one_workload_failing_does_not_stop_the_others_being_planned_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A load problem of one workload, a plan problem and a DAG rule of others: all at once."""
    write(tmp_path / "orders.yaml", BACKFILL_MANIFEST.replace("2024-01-11", "2023-01-11"))
    write(tmp_path / "clean.yaml", BACKFILL_MANIFEST)
    write(
        tmp_path / "bad.yaml",
        BACKFILL_MANIFEST.replace("backend: audit_schema", "backend: clickhouse"),
    )
    catalog = write(
        tmp_path / "workloads.yaml",
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  orders:\n"
        "    manifest: orders.yaml\n" + SECRETS + "  clean:\n"
        "    manifest: clean.yaml\n"
        "    airflow: {image: registry.example.com/dpone:1}\n"
        "  bad:\n"
        "    manifest: bad.yaml\n" + SECRETS,
    )
    assert _check(catalog, capsys) == [
        ("DPONE_MANIFEST_INVALID", "bad.yaml", 15),  # clickhouse, at state.backend
        ("DPONE_BACKFILL_PLAN_INVALID", "orders.yaml", 12),  # end before start, at the chunk
        ("DPONE_CATALOG_INVALID", "workloads.yaml", 8),  # clean: no secret for wh
    ]
    assert main(["generate", str(catalog), "--out", str(tmp_path / "dags")]) == 2
    assert "3 error(s); nothing was written" in capsys.readouterr().err
    assert not (tmp_path / "dags").exists()


@pytest.mark.parametrize(
    ("written", "rendered"),
    [
        ("1", '"1"'),
        ("0.5", '"0.5"'),
        ("'2'", '"2"'),
        ("500m", '"500m"'),
        ("1e3", '"1000.0"'),  # YAML reads a float; Kubernetes parses both as 1k
        ("'1e3'", '"1e3"'),
        ("2Gi", '"2Gi"'),
        ("1Pi", '"1Pi"'),
        ("+1.5", '"1.5"'),
        ("'+1.5'", '"+1.5"'),
        (".5", '"0.5"'),
    ],
)
def test_kubernetes_quantities_are_accepted_as_the_api_accepts_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: str, rendered: str
) -> None:
    catalog = write_project(
        tmp_path,
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  orders:\n"
        "    manifest: orders.yaml\n"
        "    airflow:\n"
        "      image: registry.example.com/dpone:1\n"
        "      secrets: [{connection: wh, secret: s, key: dsn}]\n"
        f"      resources: {{limits: {{cpu: {written}}}, requests: {{memory: 1Gi}}}}\n",
        {"orders.yaml": BACKFILL_MANIFEST},
    )
    assert _check(catalog, capsys) == []
    assert main(["generate", str(catalog), "--out", str(tmp_path / "dags")]) == 0
    dag = (tmp_path / "dags" / "orders.py").read_text(encoding="utf-8")
    assert f'"limits": {{"cpu": {rendered}}}' in dag


@pytest.mark.parametrize("written", ["-1", "true", "1.5x", "'1 Gi'", ".inf", ".nan", "[1]"])
def test_what_kubernetes_refuses_as_a_quantity_is_refused_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: str
) -> None:
    catalog = write_project(
        tmp_path,
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  orders:\n"
        "    manifest: orders.yaml\n"
        "    airflow:\n"
        "      image: registry.example.com/dpone:1\n"
        "      secrets: [{connection: wh, secret: s, key: dsn}]\n"
        f"      resources:\n        limits: {{cpu: {written}}}\n",
        {"orders.yaml": BACKFILL_MANIFEST},
    )
    assert _check(catalog, capsys) == [("DPONE_CATALOG_INVALID", "workloads.yaml", 9)]


def test_the_default_catalog_path_is_where_the_containerfile_puts_the_catalog() -> None:
    """deploy/Containerfile copies the catalog folder (scripts/build_image.sh stages it as
    catalog/) to one place; the default airflow.catalog_path, the docs and the golden examples
    must name that file, or every pod fails with DPONE_FILE_NOT_FOUND."""
    containerfile = (REPO / "deploy" / "Containerfile").read_text(encoding="utf-8")
    copies = re.findall(r"^COPY\s+catalog/\s+(\S+)\s*$", containerfile, flags=re.MULTILINE)
    assert len(copies) == 1, copies
    in_image = copies[0].rstrip("/") + "/workloads.yaml"
    assert loader.DEFAULT_IMAGE_CATALOG_PATH == in_image
    assert f"airflow.catalog_path: {in_image}" in containerfile
    build_image = (REPO / "scripts" / "build_image.sh").read_text(encoding="utf-8")
    assert 'cp -r "$catalog" "$context/catalog"' in build_image
    assert f"airflow.catalog_path: {in_image}" in build_image
    docs = (REPO / "docs" / "deploy-kubernetes.md").read_text(encoding="utf-8")
    assert f"airflow.catalog_path: {in_image}" in docs
    schemas_md = (REPO / "docs" / "reference" / "schemas.md").read_text(encoding="utf-8")
    assert f"Default: `{in_image}`" in schemas_md
    for catalog in sorted((REPO / "golden").glob("*/workloads.yaml")):
        paths = re.findall(r"catalog_path: (\S+)", catalog.read_text(encoding="utf-8"))
        for path in paths:  # kubernetes golden examples use the image's path
            assert path == in_image or not path.startswith("/"), (catalog, path)


def test_a_manifest_two_workloads_share_reports_each_problem_once(tmp_path: Path) -> None:
    """Each workload's check of a shared manifest found the same problem: printed once, not
    once per workload, and counted once."""
    manifest = (REPO / "tests/invalid_catalogs/duplicate_key/orders.yaml").read_text()
    (tmp_path / "orders.yaml").write_text(
        manifest.replace("inner_mode: replace", "inner_mode: replace\n      bogus: 1")
    )
    entry = "{image: x/y:1, secrets: [{connection: warehouse, secret: s, key: dsn}]"
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\nworkloads:\n"
        f"  a:\n    manifest: orders.yaml\n    airflow: {entry}}}\n"
        f"  b:\n    manifest: orders.yaml\n    airflow: {entry}, dag_id: other}}\n"
    )
    from dpone.packing.pack import load_and_compile

    _, _, problems = load_and_compile(str(tmp_path / "workloads.yaml"))
    assert [(p.code, p.location and p.location.line) for p in problems] == [
        ("DPONE_MANIFEST_INVALID", 14)
    ]
