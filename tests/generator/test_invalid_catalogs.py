"""The error output of every invalid catalog in tests/invalid_catalogs/, pinned by snapshots.

Each folder is one broken project; the test asserts the code it exists for and pins the whole
`dpone generate` stderr (file:line:col: CODE: message lines, all errors at once) and the
dpone.error.v1 JSON. Paths are relative to the repository root; the temporary output folder is
replaced by <out>. Update after a deliberate change with:

    .venv/bin/pytest tests/generator/test_invalid_catalogs.py --snapshot-update
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dpone_generator.cli import generate_command
from generator_support import INVALID
from syrupy.assertion import SnapshotAssertion

EXPECTED_CODE = {
    "audit_schema_name_invalid": "DPONE_MANIFEST_INVALID",
    "backfill_plan_invalid": "DPONE_BACKFILL_PLAN_INVALID",
    "bool_for_integer": "DPONE_CATALOG_INVALID",
    "conflicting_policy": "DPONE_AIRFLOW_MAPPING_POLICY_INVALID",
    "duplicate_dag_id": "DPONE_GENERATE_CONFLICT",
    "duplicate_key": "DPONE_YAML_INVALID",
    "octal_file_mode": "DPONE_YAML_INVALID",
    "env_credential": "DPONE_AIRFLOW_ENV_CREDENTIAL",
    "float_for_integer": "DPONE_AIRFLOW_MAPPING_POLICY_INVALID",
    "flavour_credential_forms": "DPONE_CATALOG_INVALID",
    "full_refresh_multi_chunk": "DPONE_BACKFILL_FULL_REFRESH_MULTI_CHUNK",
    "generator_rules": "DPONE_GENERATE_IMAGE_REQUIRED",
    "manifest_invalid": "DPONE_MANIFEST_INVALID",
    "mapped_append_unsafe": "DPONE_AIRFLOW_MAPPING_APPEND_UNSAFE",
    "missing_manifest": "DPONE_FILE_NOT_FOUND",
    "one_pass": "DPONE_MANIFEST_INVALID",
    "parallelism_multiplier": "DPONE_AIRFLOW_MAPPING_PARALLELISM_MULTIPLIER",
    "pod_options_invalid": "DPONE_CATALOG_INVALID",
    "pod_shape": "DPONE_CATALOG_INVALID",
    "policy_invalid": "DPONE_AIRFLOW_MAPPING_POLICY_INVALID",
    "pool_required": "DPONE_AIRFLOW_MAPPING_POOL_REQUIRED",
    "provider_owned_env": "DPONE_AIRFLOW_PROVIDER_OWNED_ENV",
    "requires_chunked_backfill": "DPONE_AIRFLOW_MAPPING_REQUIRES_CHUNKED_BACKFILL",
    "state_path_kernel": "DPONE_MANIFEST_INVALID",
    "state_unsupported_clickhouse": "DPONE_MANIFEST_INVALID",
    "state_unsupported_local_file": "DPONE_AIRFLOW_MAPPING_STATE_UNSUPPORTED",
    "task_limit_exceeded": "DPONE_AIRFLOW_MAPPING_TASK_LIMIT_EXCEEDED",
    "unknown_field": "DPONE_CATALOG_INVALID",
    "yaml_syntax_error": "DPONE_YAML_INVALID",
    "yaml_tag": "DPONE_YAML_INVALID",
}


def test_every_folder_has_an_expected_code() -> None:
    assert sorted(p.name for p in INVALID.iterdir() if p.is_dir()) == sorted(EXPECTED_CODE)


@pytest.mark.parametrize("case", sorted(EXPECTED_CODE))
def test_invalid_catalog_errors(
    case: str,
    in_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    snapshot: SnapshotAssertion,
) -> None:
    catalog = f"tests/invalid_catalogs/{case}/workloads.yaml"
    out = tmp_path / "out"
    assert generate_command(catalog, str(out), check=False) == 2
    text = capsys.readouterr().err.replace(str(tmp_path), "<out>")
    assert f": {EXPECTED_CODE[case]}: " in text
    assert not out.exists()
    assert generate_command(catalog, str(out), check=False, output_format="json") == 2
    records = json.loads(capsys.readouterr().out)
    assert all(r["schema"] == "dpone.error.v1" and r["file"] for r in records)
    assert {"text": text, "json": records} == snapshot
