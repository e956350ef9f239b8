"""Small synthetic projects for generator tests (catalog text + manifests)."""

from __future__ import annotations

from pathlib import Path

MANIFEST = """schema: dpone.pipeline.v1
name: {name}
processes:
  - name: {name}
    source: {{connection: warehouse, table: {{schema: raw, name: {name}}}}}
    sink:
      connection: warehouse
      table: {{schema: analytics, name: {name}}}
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: day, type: date, start: 2024-01-01, end: 2024-01-{end:02d}}}
    state: {{backend: audit_schema, connection: warehouse, require_distributed_lock: true}}
"""

CATALOG_HEAD = """schema: dpone.workload-catalog.v1
defaults:
  airflow:
    image: registry.example.com/dpone-runtime:0.1.0
    namespace: data
    secrets:
      - {connection: warehouse, secret: dpone-conn-warehouse, key: dsn}
workloads:
"""


def project(folder: Path, workloads: dict[str, str], days: int = 10) -> Path:
    """A catalog whose workloads (name -> extra `airflow:` YAML lines) each have a manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [CATALOG_HEAD]
    for name, airflow in workloads.items():
        (folder / f"{name}.yaml").write_text(
            MANIFEST.format(name=name, end=days + 1), encoding="utf-8"
        )
        lines.append(f"  {name}:\n    manifest: {name}.yaml\n")
        if airflow:
            lines.append("    airflow:\n" + "".join(f"      {ln}\n" for ln in airflow.splitlines()))
    catalog = folder / "workloads.yaml"
    catalog.write_text("".join(lines), encoding="utf-8")
    return catalog
