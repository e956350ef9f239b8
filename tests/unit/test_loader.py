"""Authoring: catalogs and manifests load into frozen objects, or into located, collected errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dpone import errors
from dpone.authoring.loader import load_catalog
from dpone.authoring.yamldoc import MAX_DOCUMENT_BYTES, load_yaml
from dpone.errors import ErrorRecord
from dpone.plan.mapping import MappingPolicy

from .support import (
    BACKFILL_MANIFEST,
    backfill_manifest,
    catalog_with,
    compile_project,
    write,
    write_project,
)


def load(root: Path, catalog: str, manifests: dict[str, str] | None = None) -> list[ErrorRecord]:
    path = write_project(
        root, catalog, manifests if manifests is not None else {"orders.yaml": BACKFILL_MANIFEST}
    )
    loaded, problems = load_catalog(path)
    assert (loaded is None) == bool(problems)
    return problems


def where(record: ErrorRecord) -> tuple[str, int | None, int | None]:
    assert record.location is not None
    return Path(record.location.file).name, record.location.line, record.location.column


def only(problems: list[ErrorRecord]) -> ErrorRecord:
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


# --- a clean project ---------------------------------------------------------------------------


def test_minimal_project_loads_with_built_in_internal_policy(tmp_path: Path) -> None:
    path = write_project(tmp_path, catalog_with(), {"orders.yaml": BACKFILL_MANIFEST})
    catalog, problems = load_catalog(path)
    assert problems == [] and catalog is not None
    [workload] = catalog.workloads
    assert workload.name == "orders" and workload.mapping == MappingPolicy()
    assert workload.mapping_source == "built-in"
    assert workload.airflow.dag_id == "orders" and workload.airflow.flavour == "kubernetes"
    [process] = workload.manifest.processes
    assert process.backfill is not None
    assert process.backfill.chunk.start == "2024-01-01"  # YAML timestamps stay text
    assert (process.location.line, process.location.column) == (4, 5)


# --- YAML-level errors -------------------------------------------------------------------------


def test_yaml_syntax_error_is_located(tmp_path: Path) -> None:
    catalog = "schema: dpone.workload-catalog.v1\nworkloads:\n  orders:\n    manifest: a: b\n"
    problem = only(load(tmp_path, catalog))
    assert problem.code == errors.YAML_INVALID
    assert where(problem) == ("workloads.yaml", 4, 16)


def test_unclosed_flow_sequence_is_located(tmp_path: Path) -> None:
    catalog = "schema: dpone.workload-catalog.v1\nworkloads:\n  orders:\n    manifest: [a\n"
    problem = only(load(tmp_path, catalog))
    assert problem.code == errors.YAML_INVALID
    assert where(problem)[1] == 5  # ruamel notices at the end of the document


def test_duplicate_key_is_located_at_the_second_key(tmp_path: Path) -> None:
    catalog = catalog_with() + "    manifest: other.yaml\n"
    problem = only(load(tmp_path, catalog))
    assert problem.code == errors.YAML_INVALID
    assert "duplicate key" in problem.message
    assert where(problem) == ("workloads.yaml", 5, 5)


def test_duplicate_key_in_a_manifest(tmp_path: Path) -> None:
    manifest = BACKFILL_MANIFEST.replace("name: orders\n", "name: orders\nname: again\n", 1)
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.YAML_INVALID
    assert where(problem) == ("orders.yaml", 3, 1)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "workloads.yaml"
    path.write_bytes(b"schema: dpone.workload-catalog.v1\nworkloads: {caf\xe9: 1}\n")
    catalog, problems = load_catalog(path)
    assert catalog is None and [p.code for p in problems] == [errors.YAML_INVALID]
    assert "not UTF-8" in problems[0].message


def test_oversized_file_is_refused_without_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * MAX_DOCUMENT_BYTES + b"\n")
    doc, problems = load_yaml(path, "big.yaml")
    assert doc is None and [p.code for p in problems] == [errors.YAML_INVALID]


def billion_laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels + 1):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_rejected_quickly(tmp_path: Path) -> None:
    path = write(tmp_path / "workloads.yaml", billion_laughs())
    started = time.perf_counter()
    catalog, problems = load_catalog(path)
    elapsed = time.perf_counter() - started
    assert catalog is None and [p.code for p in problems] == [errors.YAML_INVALID]
    assert "aliases" in problems[0].message
    # ~0.5 s on an idle machine (a 200,000-node budget); expanded, it would be 10**10 nodes
    assert elapsed < 10.0, f"alias bomb took {elapsed:.2f}s"


def test_deep_flow_nesting_is_rejected_quickly_and_located(tmp_path: Path) -> None:
    # Regression: ruamel's scanner is super-linear in flow depth (1,000 levels took 7 s).
    path = write(tmp_path / "workloads.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")
    started = time.perf_counter()
    catalog, problems = load_catalog(path)
    assert time.perf_counter() - started < 5.0  # ~10 ms idle; 7 s before the fix at depth 1000
    assert catalog is None
    problem = only(problems)
    assert problem.code == errors.YAML_INVALID and "deeper than 64" in problem.message
    assert where(problem) == ("workloads.yaml", 1, 68)


def test_64_levels_of_flow_nesting_are_fine(tmp_path: Path) -> None:
    doc, problems = load_yaml(write(tmp_path / "x.yaml", "a: " + "[" * 64 + "]" * 64), "x.yaml")
    assert problems == [] and doc is not None


def test_missing_catalog(tmp_path: Path) -> None:
    catalog, problems = load_catalog(tmp_path / "nope.yaml")
    assert catalog is None
    problem = only(problems)
    assert problem.code == errors.FILE_NOT_FOUND
    assert where(problem) == ("nope.yaml", None, None)


def test_missing_manifest_points_at_the_catalog_entry(tmp_path: Path) -> None:
    problem = only(load(tmp_path, catalog_with(), {}))
    assert problem.code == errors.FILE_NOT_FOUND
    assert where(problem) == ("workloads.yaml", 4, 15)
    assert "relative to the catalog" in problem.message


# --- schema errors, located and collected -----------------------------------------------------


def test_unknown_field_is_located_at_its_key(tmp_path: Path) -> None:
    problem = only(load(tmp_path, catalog_with() + "    colour: red\n"))
    assert problem.code == errors.CATALOG_INVALID
    assert problem.message == "workloads.orders.colour: unknown field 'colour'"
    assert where(problem) == ("workloads.yaml", 5, 5)


def test_wrong_type_is_located_at_its_value(tmp_path: Path) -> None:
    problem = only(load(tmp_path, catalog_with(extra_airflow='retries: "3"')))
    assert problem.code == errors.CATALOG_INVALID
    assert "must be integer, got a string" in problem.message
    assert where(problem) == ("workloads.yaml", 6, 16)


def test_missing_required_field(tmp_path: Path) -> None:
    catalog = "schema: dpone.workload-catalog.v1\nworkloads:\n  orders:\n    description: x\n"
    problem = only(load(tmp_path, catalog))
    assert problem.code == errors.CATALOG_INVALID
    assert "missing required field 'manifest'" in problem.message
    assert where(problem) == ("workloads.yaml", 4, 5)


def test_three_problems_are_reported_together(tmp_path: Path) -> None:
    catalog = catalog_with(extra_airflow="""
        retries: many
        namespace: Not_A_Namespace
        colour: red
        """)
    problems = load(tmp_path, catalog)
    assert [p.code for p in problems] == [errors.CATALOG_INVALID] * 3
    assert sorted(where(p)[1] or 0 for p in problems) == [6, 7, 8]


def test_problems_of_several_manifests_are_all_reported(tmp_path: Path) -> None:
    catalog = (
        "schema: dpone.workload-catalog.v1\nworkloads:\n"
        "  a: {manifest: a.yaml}\n  b: {manifest: b.yaml}\n  c: {manifest: missing.yaml}\n"
    )
    bad_a = BACKFILL_MANIFEST.replace("    sink:\n", "    colour: red\n    sink:\n")
    bad_b = backfill_manifest(**{"parallel_workers: 1": "parallel_workers: 0"})
    problems = load(tmp_path, catalog, {"a.yaml": bad_a, "b.yaml": bad_b})
    assert [(p.code, where(p)) for p in problems] == [
        (errors.MANIFEST_INVALID, ("a.yaml", 6, 5)),
        (errors.MANIFEST_INVALID, ("b.yaml", 14, 25)),
        (errors.FILE_NOT_FOUND, ("workloads.yaml", 5, 17)),
    ]


def test_manifest_error_names_the_manifest_file(tmp_path: Path) -> None:
    manifest = BACKFILL_MANIFEST.replace("strategy: {mode: backfill}", "strategy: {mode: upsert}")
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID
    assert problem.location is not None and problem.location.file == str(tmp_path / "orders.yaml")
    assert where(problem) == ("orders.yaml", 10, 24)


def test_yaml_1_2_yes_is_a_string_not_a_boolean(tmp_path: Path) -> None:
    manifest = backfill_manifest(
        **{"require_distributed_lock: true": "require_distributed_lock: yes"}
    )
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID and "must be boolean" in problem.message
    assert where(problem)[1] == 15


# --- rules beyond the schema -------------------------------------------------------------------


def test_bad_chunk_bound(tmp_path: Path) -> None:
    manifest = backfill_manifest(**{"start: 2024-01-01": "start: 2024-13-01"})
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.BACKFILL_PLAN_INVALID
    assert "backfill.chunk.start" in problem.message
    assert where(problem) == ("orders.yaml", 12, 54)


def test_naive_timestamp_bound(tmp_path: Path) -> None:
    manifest = backfill_manifest(
        **{
            "type: date, start: 2024-01-01, end: 2024-01-11": (
                'type: timestamp, start: "2024-01-01T00:00:00", end: "2024-01-02T00:00:00Z"'
            )
        }
    )
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.BACKFILL_PLAN_INVALID and "timezone" in problem.message


def test_timestamp_bound_out_of_range_in_utc(tmp_path: Path) -> None:
    # Regression: the conversion to UTC raised OverflowError (DPONE_INTERNAL, no location)
    manifest = backfill_manifest(
        **{
            "type: date, start: 2024-01-01, end: 2024-01-11": (
                'type: timestamp, start: "0001-01-01T00:00:00+05:00", end: "0001-01-02T00:00:00Z"'
            )
        }
    )
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.BACKFILL_PLAN_INVALID and "out of range" in problem.message
    assert "backfill.chunk.start" in problem.message
    assert where(problem)[:2] == ("orders.yaml", 12)


def test_unit_must_fit_the_chunk_type(tmp_path: Path) -> None:
    manifest = backfill_manifest(**{"end: 2024-01-11}": "end: 2024-01-11, unit: hour}"})
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID and "unit 'hour'" in problem.message


def test_merge_needs_keys(tmp_path: Path) -> None:
    manifest = backfill_manifest(
        **{"      keys: [order_id]\n": "", "inner_mode: replace": "inner_mode: merge"}
    )
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID and "merge needs sink.keys" in problem.message
    assert where(problem) == ("orders.yaml", 12, 19)


def test_accept_narrowing_loads_with_its_locations(tmp_path: Path) -> None:
    manifest = backfill_manifest(
        **{"      keys: [order_id]\n": "      keys: [order_id]\n      accept_narrowing: [a, b]\n"}
    )
    path = write_project(tmp_path, catalog_with(), {"orders.yaml": manifest})
    catalog, problems = load_catalog(path)
    assert problems == [] and catalog is not None
    [process] = catalog.workloads[0].manifest.processes
    sink = process.sink
    assert sink.accept_narrowing == ("a", "b")
    assert sink.table_location is not None and sink.table_location.line == 8
    assert [(loc.line, loc.column) for loc in sink.narrowing_locations] == [(10, 26), (10, 29)]
    assert sink.canonical()["accept_narrowing"] == ["a", "b"]


def test_accept_narrowing_must_name_a_listed_source_column(tmp_path: Path) -> None:
    manifest = backfill_manifest(
        **{
            "name: orders}}": "name: orders}, columns: [order_id, order_date]}",
            "      keys: [order_id]\n": "      keys: [order_id]\n      accept_narrowing: [amount]\n",
        }
    )
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID
    assert "accept_narrowing names 'amount'" in problem.message
    assert where(problem) == ("orders.yaml", 10, 26)


def test_accept_narrowing_names_a_column_once(tmp_path: Path) -> None:
    manifest = backfill_manifest(
        **{"      keys: [order_id]\n": "      keys: [order_id]\n      accept_narrowing: [a, a]\n"}
    )
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID and "names 'a' twice" in problem.message
    assert where(problem) == ("orders.yaml", 10, 29)


@pytest.mark.parametrize(
    ("accepted", "role"), [("order_id", "a merge key"), ("order_date", "the chunk column")]
)
def test_a_merge_cannot_accept_narrowing_its_keys_or_chunk_column(
    tmp_path: Path, accepted: str, role: str
) -> None:
    # Regression: a merge reads back by its keys, so a key or chunk column the target rounds
    # could merge two chunks' rows into one, or move a row into another chunk, and pass
    manifest = backfill_manifest(
        **{
            "      keys: [order_id]\n": (
                f"      keys: [order_id]\n      accept_narrowing: [amount, {accepted}]\n"
            ),
            "inner_mode: replace": "inner_mode: merge",
        }
    )
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID
    assert f"names {accepted!r}, {role} of a merge" in problem.message
    assert where(problem)[:2] == ("orders.yaml", 10)
    # replace compares the chunk's range: there both stay accepted
    replace = manifest.replace("inner_mode: merge", "inner_mode: replace")
    assert load(tmp_path / "replace", catalog_with(), {"orders.yaml": replace}) == []


def test_accept_narrowing_changes_the_pack_but_not_the_campaign(tmp_path: Path) -> None:
    plain = compile_project(tmp_path / "a", catalog_with(), {"orders.yaml": BACKFILL_MANIFEST})
    accepting = compile_project(
        tmp_path / "b",
        catalog_with(),
        {
            "orders.yaml": backfill_manifest(
                **{
                    "      keys: [order_id]\n": "      keys: [order_id]\n      accept_narrowing: [x]\n"
                }
            )
        },
    )
    assert "accept_narrowing" not in plain.only_plan().config.sink.canonical()
    assert plain.packs[0].fingerprint != accepting.packs[0].fingerprint
    assert plain.only_plan().config_hash == accepting.only_plan().config_hash
    assert plain.only_plan().run_key == accepting.only_plan().run_key


def test_source_needs_exactly_one_of_table_or_query(tmp_path: Path) -> None:
    manifest = backfill_manifest(**{"name: orders}}": 'name: orders}, query: "SELECT 1"}'})
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID and "exactly one of" in problem.message
    assert where(problem) == ("orders.yaml", 5, 13)


def test_duplicate_dag_id(tmp_path: Path) -> None:
    catalog = (
        "schema: dpone.workload-catalog.v1\nworkloads:\n"
        "  a: {manifest: orders.yaml}\n"
        "  b: {manifest: orders.yaml, airflow: {dag_id: a}}\n"
    )
    problem = only(load(tmp_path, catalog))
    assert problem.code == errors.GENERATED_FILE_CONFLICT
    assert where(problem) == ("workloads.yaml", 4, 48)


def test_workload_named_mapping_is_still_schema_checked(tmp_path: Path) -> None:
    # Regression: violations under any path element named "mapping" used to be dropped, and the
    # loader then crashed with KeyError('manifest').
    catalog = "schema: dpone.workload-catalog.v1\nworkloads:\n  mapping:\n    description: x\n"
    problem = only(load(tmp_path, catalog))
    assert problem.code == errors.CATALOG_INVALID
    assert "missing required field 'manifest'" in problem.message


def test_env_key_named_mapping_is_still_schema_checked(tmp_path: Path) -> None:
    problem = only(load(tmp_path, catalog_with(extra_airflow="env: {mapping: 3}")))
    assert problem.code == errors.CATALOG_INVALID and "must be string" in problem.message


# --- mapping policy: located errors and precedence --------------------------------------------


def test_policy_error_is_located_at_the_value(tmp_path: Path) -> None:
    problem = only(load(tmp_path, catalog_with("{mode: summary, max_items: 0, max_active: 1}")))
    assert problem.code == errors.MAPPING_POLICY_INVALID
    assert problem.message.startswith("workloads.orders.airflow.mapping.max_items: ")
    assert where(problem) == ("workloads.yaml", 6, 43)


def test_unknown_policy_field_is_located_at_its_key(tmp_path: Path) -> None:
    problem = only(load(tmp_path, catalog_with("{mode: summary, workers: 3}")))
    assert problem.code == errors.MAPPING_POLICY_INVALID
    assert where(problem) == ("workloads.yaml", 6, 32)


def test_empty_pool_is_pool_required(tmp_path: Path) -> None:
    problem = only(load(tmp_path, catalog_with('{mode: visible, pool: ""}')))
    assert problem.code == errors.MAPPING_POOL_REQUIRED
    assert where(problem) == ("workloads.yaml", 6, 38)


def test_policy_problems_are_collected(tmp_path: Path) -> None:
    problems = load(
        tmp_path, catalog_with('{mode: often, max_items: 201, max_active: 0, pool: ""}')
    )
    assert [p.code for p in problems] == [errors.MAPPING_POLICY_INVALID] * 4


def test_manifest_policy_error_is_located_in_the_manifest(tmp_path: Path) -> None:
    manifest = (
        BACKFILL_MANIFEST + "gitops:\n  airflow:\n    mapping: {mode: summary, max_items: true}\n"
    )
    problems = load(tmp_path, catalog_with(), {"orders.yaml": manifest})
    assert [(p.code, where(p)) for p in problems] == [
        (errors.MAPPING_POLICY_INVALID, ("orders.yaml", 18, 41))
    ]


def gitops(mapping: str) -> str:
    return BACKFILL_MANIFEST + f"gitops:\n  airflow:\n    mapping: {mapping}\n"


SUMMARY = "{mode: summary, max_items: 5, max_active: 2, pool: dpone_backfill}"


def loaded_policy(root: Path, catalog: str, manifest: str) -> tuple[MappingPolicy, str]:
    path = write_project(root, catalog, {"orders.yaml": manifest})
    loaded, problems = load_catalog(path)
    assert problems == [] and loaded is not None
    workload = loaded.workloads[0]
    return workload.mapping, workload.mapping_source


def test_catalog_and_manifest_policies_that_agree(tmp_path: Path) -> None:
    # equal after normalisation: the manifest spells out the pool default
    policy, source = loaded_policy(
        tmp_path, catalog_with("{mode: summary, max_items: 5, max_active: 2}"), gitops(SUMMARY)
    )
    assert policy == MappingPolicy("summary", 5, 2, "dpone_backfill")
    assert source == "catalog+manifest"


def test_catalog_and_manifest_policies_that_differ(tmp_path: Path) -> None:
    problems = load(
        tmp_path,
        catalog_with("{mode: summary, max_items: 6, max_active: 2}"),
        {"orders.yaml": gitops(SUMMARY)},
    )
    problem = only(problems)
    assert problem.code == errors.MAPPING_POLICY_INVALID
    assert "conflicts with gitops.airflow.mapping" in problem.message
    assert where(problem) == ("workloads.yaml", 6, 7)


@pytest.mark.parametrize("empty", ["null", "~", "", "{}"])
def test_an_empty_catalog_mapping_is_absent_not_an_internal_policy(
    tmp_path: Path, empty: str
) -> None:
    """Regression: ``mapping: null`` or ``{}`` was an explicit internal policy, then conflicted
    with the manifest's (a policy the user never wrote). Absence means internal."""
    policy, source = loaded_policy(tmp_path / "m", catalog_with(empty), gitops(SUMMARY))
    assert (policy.mode, source) == ("summary", "manifest")
    policy, source = loaded_policy(tmp_path / "b", catalog_with(empty), BACKFILL_MANIFEST)
    assert (policy, source) == (MappingPolicy(), "built-in")
    defaults = (
        "schema: dpone.workload-catalog.v1\n"
        f"defaults:\n  airflow:\n    mapping: {empty}\n"
        "workloads:\n  orders:\n    manifest: orders.yaml\n"
    )
    policy, source = loaded_policy(tmp_path / "d", defaults, gitops(SUMMARY))
    assert (policy.mode, source) == ("summary", "manifest")
    policy, source = loaded_policy(tmp_path / "g", catalog_with(), gitops(empty))
    assert (policy, source) == (MappingPolicy(), "built-in")


def test_manifest_policy_alone(tmp_path: Path) -> None:
    policy, source = loaded_policy(tmp_path, catalog_with(), gitops(SUMMARY))
    assert (policy.mode, policy.max_items, source) == ("summary", 5, "manifest")


def test_defaults_apply_when_neither_sets_a_policy(tmp_path: Path) -> None:
    catalog = (
        "schema: dpone.workload-catalog.v1\n"
        "defaults:\n  airflow:\n    mapping: {mode: summary, max_items: 3, max_active: 3}\n"
        "workloads:\n  orders:\n    manifest: orders.yaml\n"
    )
    policy, source = loaded_policy(tmp_path, catalog, BACKFILL_MANIFEST)
    assert (policy, source) == (MappingPolicy("summary", 3, 3, "dpone_backfill"), "defaults")


def test_catalog_and_manifest_beat_defaults(tmp_path: Path) -> None:
    defaults = (
        "schema: dpone.workload-catalog.v1\n"
        "defaults:\n  airflow:\n    mapping: {mode: visible, max_items: 30, max_active: 3}\n"
        "workloads:\n  orders:\n    manifest: orders.yaml\n"
    )
    policy, source = loaded_policy(tmp_path / "m", defaults, gitops(SUMMARY))
    assert (policy.mode, source) == ("summary", "manifest")
    with_catalog = defaults + "    airflow:\n      mapping: {mode: internal}\n"
    policy, source = loaded_policy(tmp_path / "c", with_catalog, BACKFILL_MANIFEST)
    assert (policy.mode, source) == ("internal", "catalog")


# --- provider-owned env --------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "DPONE_AIRFLOW_MAPPING_ITEM",
        "DPONE_AIRFLOW_RUN_IDENTITY",
        "DPONE_AIRFLOW_MAPPING_LABEL",
        "DPONE_AIRFLOW_ANYTHING",
    ],
)
def test_provider_owned_env_key_is_rejected(tmp_path: Path, key: str) -> None:
    problem = only(load(tmp_path, catalog_with(extra_airflow=f"env: {{{key}: x}}")))
    assert problem.code == errors.PROVIDER_OWNED_ENV
    assert key in problem.message
    assert where(problem) == ("workloads.yaml", 6, 13)


def test_provider_owned_env_key_in_defaults_points_at_defaults(tmp_path: Path) -> None:
    catalog = (
        "schema: dpone.workload-catalog.v1\n"
        "defaults:\n  airflow:\n    env:\n      DPONE_AIRFLOW_MAPPING_ITEM: x\n"
        "workloads:\n  orders:\n    manifest: orders.yaml\n"
    )
    problem = only(load(tmp_path, catalog))
    assert problem.code == errors.PROVIDER_OWNED_ENV
    assert where(problem) == ("workloads.yaml", 5, 7)


def test_ordinary_env_keys_are_fine(tmp_path: Path) -> None:
    assert (
        load(tmp_path, catalog_with(extra_airflow="env: {DPONE_LOG_LEVEL: debug, TZ: UTC}")) == []
    )


# --- mapped-mode rules (compile) ------------------------------------------------------------

MAPPED = "{mode: summary, max_items: 5, max_active: 2}"


def mapped_codes(
    root: Path, mapping: str = MAPPED, **replacements: str
) -> list[tuple[str, tuple[str, int | None, int | None]]]:
    result = compile_project(
        root, catalog_with(mapping), {"orders.yaml": backfill_manifest(**replacements)}
    )
    return [(p.code, where(p)) for p in result.problems]


def test_mapped_project_compiles(tmp_path: Path) -> None:
    result = compile_project(tmp_path, catalog_with(MAPPED), {"orders.yaml": BACKFILL_MANIFEST})
    plan = result.only_plan()
    assert plan.mapping_plan is not None and plan.mapping_plan.items_total == 5


def test_requires_chunked_backfill(tmp_path: Path) -> None:
    codes = mapped_codes(
        tmp_path,
        **{
            "strategy: {mode: backfill}": "strategy: {mode: full_refresh}",
            "    backfill:\n": "",
            "      chunk: {column: order_date, type: date, start: 2024-01-01, end: 2024-01-11}\n": "",
            "      inner_mode: replace\n": "",
            "      parallel_workers: 1\n": "",
        },
    )
    # at the strategy's value: the key the rule names
    assert codes == [(errors.MAPPING_REQUIRES_CHUNKED_BACKFILL, ("orders.yaml", 10, 17))]


def test_parallelism_multiplier(tmp_path: Path) -> None:
    codes = mapped_codes(tmp_path, **{"parallel_workers: 1": "parallel_workers: 4"})
    assert codes == [(errors.MAPPING_PARALLELISM_MULTIPLIER, ("orders.yaml", 14, 25))]


@pytest.mark.parametrize(
    ("state", "column"),
    [
        ("state: {backend: local_file, path: /tmp/ledger}", 22),  # the backend's value
        ("state: {backend: audit_schema, connection: wh, require_distributed_lock: false}", 78),
        ("state: {backend: audit_schema, connection: wh}", 12),  # the lock unstated: state
    ],
    ids=["local_file", "lock-false", "lock-absent"],
)
def test_state_unsupported(tmp_path: Path, state: str, column: int) -> None:
    codes = mapped_codes(
        tmp_path,
        **{"state: {backend: audit_schema, connection: wh, require_distributed_lock: true}": state},
    )
    assert codes == [(errors.MAPPING_STATE_UNSUPPORTED, ("orders.yaml", 15, column))]


@pytest.mark.parametrize("policy", [MAPPED, "{mode: internal}"], ids=["summary", "internal"])
def test_clickhouse_state_is_refused_in_every_mode_at_its_field(
    tmp_path: Path, policy: str
) -> None:
    """No ClickHouse ledger store exists: check refuses it where it is written, in any mode,
    instead of the pod failing with DPONE_LEDGER_UNAVAILABLE."""
    clickhouse = "state: {backend: clickhouse, connection: wh, require_distributed_lock: true}"
    codes = mapped_codes(
        tmp_path,
        policy,
        **{
            "state: {backend: audit_schema, connection: wh, require_distributed_lock: true}": (
                clickhouse
            )
        },
    )
    assert codes == [(errors.MANIFEST_INVALID, ("orders.yaml", 15, 22))]


def test_state_rules_do_not_apply_to_internal(tmp_path: Path) -> None:
    result = compile_project(
        tmp_path,
        catalog_with(),
        {
            "orders.yaml": backfill_manifest(
                **{
                    "state: {backend: audit_schema, connection: wh, require_distributed_lock: true}": (
                        "state: {backend: local_file, path: /tmp/ledger}"
                    ),
                    "parallel_workers: 1": "parallel_workers: 4",
                }
            )
        },
    )
    assert result.only_plan().mapping_plan is None


def test_append_unsafe_when_ledger_and_sink_differ(tmp_path: Path) -> None:
    codes = mapped_codes(
        tmp_path,
        **{
            "inner_mode: replace": "inner_mode: append",
            "connection: wh, require_distributed_lock": "connection: ledger, require_distributed_lock",
        },
    )
    assert codes == [(errors.MAPPED_APPEND_UNSAFE, ("orders.yaml", 15, 48))]  # state.connection


def test_append_is_fine_when_ledger_and_sink_share_a_connection(tmp_path: Path) -> None:
    result = compile_project(
        tmp_path,
        catalog_with(MAPPED),
        {"orders.yaml": backfill_manifest(**{"inner_mode: replace": "inner_mode: append"})},
    )
    assert result.only_plan().mapping_plan is not None


def test_every_mapped_rule_is_reported_at_once(tmp_path: Path) -> None:
    codes = mapped_codes(
        tmp_path,
        **{
            "parallel_workers: 1": "parallel_workers: 2",
            "inner_mode: replace": "inner_mode: append",
            "state: {backend: audit_schema, connection: wh, require_distributed_lock: true}": (
                "state: {backend: local_file, path: /tmp/ledger}"
            ),
        },
    )
    assert [code for code, _ in codes] == [
        errors.MAPPING_PARALLELISM_MULTIPLIER,
        errors.MAPPING_STATE_UNSUPPORTED,
        errors.MAPPED_APPEND_UNSAFE,
    ]


def test_visible_task_limit_is_located_at_the_policy(tmp_path: Path) -> None:
    codes = mapped_codes(tmp_path, "{mode: visible, max_items: 9, max_active: 2}")
    assert codes == [(errors.MAPPING_TASK_LIMIT_EXCEEDED, ("workloads.yaml", 6, 7))]
    result = compile_project(
        tmp_path / "ok",
        catalog_with("{mode: visible, max_items: 10, max_active: 2}"),
        {"orders.yaml": BACKFILL_MANIFEST},
    )
    assert result.only_plan().mapping_plan is not None


# --- pod and task options (airflow.pod, task arguments) -----------------------------------------


POD_DEFAULTS = """\
schema: dpone.workload-catalog.v1
defaults:
  airflow:
    retry_delay: 60
    owner: platform
    pod:
      service_account_name: platform-default
      node_selector: {pool: batch}
workloads:
  orders:
    manifest: orders.yaml
    airflow:
      owner: orders-team
      priority_weight: 5
      pod:
        service_account_name: orders-irsa
        tolerations: [{key: dedicated, operator: Equal, value: batch, effect: NoSchedule}]
        volume_mounts: [{name: scratch, mountPath: /scratch}]
        volumes: [{name: scratch, emptyDir: {}}]
"""


def test_pod_options_merge_key_by_key_over_the_defaults_in_schema_order(tmp_path: Path) -> None:
    path = write_project(tmp_path, POD_DEFAULTS, {"orders.yaml": BACKFILL_MANIFEST})
    catalog, problems = load_catalog(path)
    assert problems == [] and catalog is not None
    airflow = catalog.workloads[0].airflow
    assert airflow.task_options == (
        ("retry_delay", 60),
        ("owner", "orders-team"),
        ("priority_weight", 5),
    )
    assert [name for name, _ in airflow.pod_options] == [
        "service_account_name",
        "node_selector",
        "tolerations",
        "volumes",
        "volume_mounts",
    ]
    options = dict(airflow.pod_options)
    assert options["service_account_name"] == "orders-irsa"  # the workload's own wins
    assert options["node_selector"] == {"pool": "batch"}  # kept from the defaults
    assert options["volume_mounts"] == [{"name": "scratch", "mountPath": "/scratch"}]


@pytest.mark.parametrize(
    ("extra", "fragment", "line"),
    [
        ("pod:\n  env_vars: {A: b}", "'env_vars' is written by dpone", 7),
        ("pod:\n  pool: big", "'pool' is written by dpone", 7),
        ("pod:\n  cmds: [sh]", "'cmds' is written by dpone", 7),
        ("max_active_tis_per_dag: 3", "'max_active_tis_per_dag' is written by dpone", 6),
        ("pod:\n  volume_mounts: [{name: x}]", "missing required field 'mountPath'", 7),
        ("pod:\n  volumes: [{name: x, emptydir: {}}]", "unknown field 'emptydir'", 7),
        ("pod:\n  tolerations: [{operator: Maybe}]", "must be one of Exists, Equal", 7),
        ("pod:\n  image_pull_policy: always", "must be one of Always", 7),
        ("pod:\n  labels: {team: 'a b'}", "does not match", 7),
        ("pod:\n  termination_grace_period: '30'", "must be integer", 7),
        ("retry_delay: 1.5", "must be integer", 6),
        ("retry_exponential_backoff: 2", "must be boolean", 6),
        ('owner: "a\\tb"', "does not match", 6),
        ('image: "reg/x:1\\nsecond"', "does not match", 6),
        ('image: "reg/x:1\\u0000"', "does not match", 6),
        ('image: "reg/x: 1"', "does not match", 6),
        ('catalog_path: "/app/\\u0000/w.yaml"', "does not match", 6),
        ('command: ["dpone\\u0000"]', "does not match", 6),
        ('env: {A: "x\\u0000y"}', "does not match", 6),
    ],
)
def test_pod_and_task_options_are_typed_and_located(
    tmp_path: Path, extra: str, fragment: str, line: int
) -> None:
    problem = only(load(tmp_path, catalog_with(extra_airflow=extra)))
    assert problem.code == errors.CATALOG_INVALID
    assert fragment in problem.message
    assert where(problem)[1] in (line, line + 1)


def test_pod_options_on_a_subprocess_workload_are_refused(tmp_path: Path) -> None:
    extra = "flavour: subprocess\npod:\n  service_account_name: x"
    problem = only(load(tmp_path, catalog_with(extra_airflow=extra)))
    assert problem.code == errors.CATALOG_INVALID
    assert "kubernetes flavour only" in problem.message
    assert where(problem) == ("workloads.yaml", 7, 7)


@pytest.mark.parametrize(
    "tagged",
    ["!!binary aGVsbG8=", "!!python/name:os.system x", "!!set {a: null}", "!local x", "!!omap []"],
)
def test_yaml_tags_outside_the_core_schema_are_refused_where_they_stand(
    tmp_path: Path, tagged: str
) -> None:
    problem = only(load(tmp_path, catalog_with(extra_airflow=f"image: {tagged}")))
    assert problem.code == errors.YAML_INVALID
    assert "is not allowed" in problem.message
    assert where(problem) == ("workloads.yaml", 6, 14)


def test_core_yaml_tags_still_load(tmp_path: Path) -> None:
    path = write_project(
        tmp_path,
        catalog_with(extra_airflow="image: !!str reg/x:1"),
        {"orders.yaml": BACKFILL_MANIFEST},
    )
    catalog, problems = load_catalog(path)
    assert problems == [] and catalog is not None
    assert catalog.workloads[0].airflow.image == "reg/x:1"


# --- one workload (what a pod loads) ----------------------------------------------------------


def test_a_pod_reads_only_its_own_workloads_manifest(tmp_path: Path) -> None:
    from dpone.errors import DponeError
    from dpone.packing.pack import load_and_compile, load_workload_pack

    catalog = catalog_with() + "  broken:\n    manifest: broken.yaml\n"
    path = write_project(
        tmp_path, catalog, {"orders.yaml": BACKFILL_MANIFEST, "broken.yaml": "schema: [oops\n"}
    )
    pack = load_workload_pack(str(path), "orders")  # the broken sibling is never parsed
    assert pack.workload.name == "orders" and pack.processes[0].chunks_total == 10
    _, _, problems = load_and_compile(str(path))  # check and generate still see it
    assert [Path(p.location.file).name for p in problems if p.location] == ["broken.yaml"]
    with pytest.raises(DponeError) as refused:
        load_workload_pack(str(path), "order")
    assert refused.value.code == errors.USAGE
    assert "(has: broken, orders) (did you mean 'orders'?)" in refused.value.message


def test_one_workload_is_validated_like_the_whole_catalog(tmp_path: Path) -> None:
    path = write_project(
        tmp_path,
        catalog_with() + "  other:\n    manifest: orders.yaml\n    airflow: {dag_id: orders}\n",
        {"orders.yaml": BACKFILL_MANIFEST},
    )
    whole, problems = load_catalog(path)
    assert whole is None and [p.code for p in problems] == [errors.GENERATED_FILE_CONFLICT]
    alone, problems = load_catalog(path, only="orders")
    assert problems == [] and alone is not None
    assert [w.name for w in alone.workloads] == ["orders"] and alone.names == ("orders", "other")
    schema_error, problems = load_catalog(
        write_project(tmp_path / "bad", "schema: dpone.workload-catalog.v1\nworkloads: 3\n", {}),
        only="orders",
    )
    assert schema_error is None and problems  # the catalog file itself is always validated


def test_credential_forms_load_typed(tmp_path: Path) -> None:
    path = write_project(
        tmp_path,
        catalog_with(extra_airflow="""
            flavour: subprocess
            secrets: [{connection: wh, secret: wh-pw, key: password, field: password}]
            secret_files: [{connection: wh, path: /run/secrets/wh-dsn}]
            airflow_connections: [{connection: src, conn_id: dpone_src}]
            """),
        {"orders.yaml": BACKFILL_MANIFEST},
    )
    loaded, problems = load_catalog(path)
    assert problems == [] and loaded is not None
    airflow = loaded.workloads[0].airflow
    assert [(s.connection, s.field) for s in airflow.secrets] == [("wh", "password")]
    assert [(f.connection, f.field, f.path) for f in airflow.secret_files] == [
        ("wh", "dsn", "/run/secrets/wh-dsn")
    ]
    assert [(c.connection, c.conn_id) for c in airflow.airflow_connections] == [
        ("src", "dpone_src")
    ]


@pytest.mark.parametrize(
    "entry",
    [
        "secrets: [{connection: wh, secret: s, key: k, field: sslkey}]",
        "secret_files: [{connection: wh, path: relative/password}]",
        "airflow_connections: [{connection: wh, conn_id: 'has space'}]",
        "airflow_connections: [{connection: wh}]",
    ],
)
def test_credential_forms_are_typed_by_the_schema(tmp_path: Path, entry: str) -> None:
    problem = only(load(tmp_path, catalog_with(extra_airflow=entry)))
    assert problem.code == errors.CATALOG_INVALID
    assert where(problem)[1] == 6, str(problem)


# --- one pass: a problem does not hide the rules that need no plan ------------------------------

CLICKHOUSE = "state: {backend: clickhouse, connection: wh, require_distributed_lock: true}"
AUDIT_STATE = "state: {backend: audit_schema, connection: wh, require_distributed_lock: true}"


def test_a_manifest_schema_error_does_not_hide_its_processes_rules(tmp_path: Path) -> None:
    # Regression: parallel_workers 0 stopped the manifest, clickhouse came only in a second pass
    manifest = backfill_manifest(
        **{"parallel_workers: 1": "parallel_workers: 0", AUDIT_STATE: CLICKHOUSE}
    )
    problems = load(tmp_path, catalog_with(), {"orders.yaml": manifest})
    assert [(p.code, where(p)) for p in problems] == [
        (errors.MANIFEST_INVALID, ("orders.yaml", 14, 25)),
        (errors.MANIFEST_INVALID, ("orders.yaml", 15, 22)),
    ]
    assert "parallel_workers" in problems[0].message and "clickhouse" in problems[1].message


@pytest.mark.parametrize(
    ("replacements", "refused"),
    [
        ({"table: {schema: raw, name: orders}}": "table: 5}"}, "source.table"),
        ({"keys: [order_id]": "keys: [1]", "inner_mode: replace": "inner_mode: merge"}, "keys"),
    ],
    ids=["table-or-query", "merge-keys"],
)
def test_a_refused_value_a_rule_reads_by_its_absence_is_not_left_out(
    tmp_path: Path, replacements: dict[str, str], refused: str
) -> None:
    """Leaving out a written table or merge keys would make "exactly one of table or query" or
    "merge needs keys" report what is there: that process's rules wait for the fix."""
    manifest = backfill_manifest(**replacements, **{AUDIT_STATE: CLICKHOUSE})
    problem = only(load(tmp_path, catalog_with(), {"orders.yaml": manifest}))
    assert problem.code == errors.MANIFEST_INVALID and refused in problem.message


def test_the_other_processes_of_a_manifest_that_breaks_its_schema_are_checked(
    tmp_path: Path,
) -> None:
    second = BACKFILL_MANIFEST.split("processes:\n", 1)[1].replace("name: orders", "name: again")
    manifest = backfill_manifest(**{"table: {schema: raw, name: orders}}": "table: 5}"})
    manifest += second.replace(AUDIT_STATE, CLICKHOUSE)
    problems = load(tmp_path, catalog_with(), {"orders.yaml": manifest})
    assert [p.code for p in problems] == [errors.MANIFEST_INVALID] * 2
    assert "source.table" in problems[0].message
    assert "process 'again': state.backend clickhouse" in problems[1].message


def test_an_entry_that_breaks_the_schema_still_has_its_values_checked(tmp_path: Path) -> None:
    # Regression: a refused resources quantity hid PGPASSWORD in env (the second pass found it)
    catalog = catalog_with(extra_airflow="""
        resources: {requests: {cpu: "-1"}}
        env: {PGPASSWORD: hunter2secret, DPONE_AIRFLOW_CONTEXT: x}
        command: [env, "MYSQL_PWD=hunter2secret", dpone]
        """)
    problems = load(tmp_path, catalog)
    assert [(p.code, where(p)[1]) for p in problems] == [
        (errors.CATALOG_INVALID, 6),
        (errors.ENV_CREDENTIAL, 7),
        (errors.ENV_CREDENTIAL, 8),
        (errors.PROVIDER_OWNED_ENV, 7),
    ]
    assert all("hunter2secret" not in p.message for p in problems)


def test_a_broken_defaults_still_has_every_entry_checked(tmp_path: Path) -> None:
    catalog = (
        "schema: dpone.workload-catalog.v1\n"
        "defaults:\n  airflow:\n    colour: red\n"
        "    catalog_path: /opt/x?password=hunter2secret\n"
        "workloads:\n  orders:\n    manifest: orders.yaml\n"
        "    airflow: {env: {API_TOKEN: hunter2secret}}\n"
    )
    problems = load(tmp_path, catalog)
    assert [(p.code, where(p)[1]) for p in problems] == [
        (errors.CATALOG_INVALID, 4),
        (errors.ENV_CREDENTIAL, 5),
        (errors.ENV_CREDENTIAL, 9),
    ]
    assert problems[1].message.startswith("defaults: airflow.catalog_path holds")


@pytest.mark.parametrize(
    ("extra", "shown", "line"),
    [
        ('command: [env, "PGPASSWORD=hunter2secret", dpone]', "airflow.command.1 sets", 6),
        ('command: [dpone, "postgresql://u:hunter2secret@h/db"]', "airflow.command.1 holds", 6),
        ('catalog_path: "/opt/x?password=hunter2secret"', "airflow.catalog_path holds", 6),
        ('catalog_path: "postgresql://u:hunter2secret@h/db"', "airflow.catalog_path holds", 6),
        (
            "secret_files:\n  - {connection: wh, path: /postgresql://u:hunter2secret@h/db}",
            "airflow.secret_files.0.path holds",
            7,
        ),
        ('tags: ["AWS_SECRET_ACCESS_KEY=hunter2secret"]', "airflow.tags.0 sets", 6),
    ],
)
@pytest.mark.parametrize("flavour", ["kubernetes", "subprocess"])
def test_a_credential_in_any_string_the_dag_file_writes_is_refused(
    tmp_path: Path, extra: str, shown: str, line: int, flavour: str
) -> None:
    # Regression: airflow.command and catalog_path reached the DAG file in clear
    catalog = catalog_with(extra_airflow=f"{extra}\nflavour: {flavour}")
    problem = only(load(tmp_path, catalog))
    assert problem.code == errors.ENV_CREDENTIAL
    assert f"workload 'orders': {shown}" in problem.message
    assert "hunter2secret" not in problem.message
    assert where(problem)[1] == line
    keep_out = "worker's environment" if flavour == "subprocess" else "Kubernetes secret"
    assert keep_out in problem.message


def test_defaults_secrets_apply_to_the_kubernetes_workloads_only(tmp_path: Path) -> None:
    catalog = (
        "schema: dpone.workload-catalog.v1\n"
        "defaults:\n  airflow:\n    secrets: [{connection: wh, secret: wh, key: dsn}]\n"
        "workloads:\n"
        "  pods:\n    manifest: orders.yaml\n    airflow: {dag_id: pods}\n"
        "  local:\n    manifest: orders.yaml\n    airflow: {flavour: subprocess}\n"
        "  own:\n    manifest: orders.yaml\n"
        "    airflow: {flavour: subprocess, secrets: [{connection: wh, secret: s, key: dsn}]}\n"
    )
    path = write_project(tmp_path, catalog, {"orders.yaml": BACKFILL_MANIFEST})
    loaded, problems = load_catalog(path)
    assert problems == [] and loaded is not None
    secrets = {w.name: [s.secret for s in w.airflow.secrets] for w in loaded.workloads}
    # a subprocess workload's own entries stay, for the generator to refuse where they stand
    assert secrets == {"pods": ["wh"], "local": [], "own": ["s"]}
