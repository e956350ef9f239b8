#!/usr/bin/env python3
"""Write the Kubernetes field map `dpone check` walks nested pod options with.

Usage::

    .venv/bin/python scripts/kubernetes_fields.py [--check]

The catalog's `airflow.pod.affinity` and each volume's source keep Kubernetes' own structure;
the generated DAG file turns them into `kubernetes.client` models, which refuse a key they do
not know and so fail the DAG's import. `dpone check` refuses such a key first, at its line,
from `runtime/src/dpone/authoring/kubernetes_fields.json`: for every model reachable from
`V1Affinity` and `V1Volume`, its manifest keys and what each holds. The keys are those every
cached Airflow environment's `kubernetes` client knows (`scripts/airflow_envs.py` builds them),
so a key a newer client added is refused until every supported Airflow version takes it.
`--check` exits 1 when the file differs from what the environments give.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "runtime" / "src" / "dpone" / "authoring" / "kubernetes_fields.json"
ROOTS = ("V1Affinity", "V1Volume")

#: run by each Airflow environment's python: its client's models reachable from ROOTS
DUMP = """
import json, sys
from kubernetes import client
seen, todo = {}, list(sys.argv[1:])
while todo:
    kind = todo.pop()
    if kind in seen:
        continue
    model = getattr(client, kind)
    fields = {}
    for attr, key in model.attribute_map.items():
        held = model.openapi_types[attr].replace("dict(", "dict[").replace(")", "]")
        fields[key] = held
        inner = held
        while inner.startswith(("list[", "dict[")):
            inner = inner[5:-1].split(", ", 1)[-1]
        if inner.startswith("V1") or inner.startswith("V2"):
            todo.append(inner)
    seen[kind] = fields
print(json.dumps(seen))
"""


def environments() -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "airflow_envs.py"), "--print-paths"],
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, str] = json.loads(done.stdout)
    return found


def field_map() -> dict[str, object]:
    """Every model's keys that all environments know, each with what it holds."""
    maps: dict[str, dict[str, dict[str, str]]] = {}
    versions: dict[str, str] = {}
    for airflow, python in sorted(environments().items()):
        dumped = subprocess.run(
            [python, "-c", DUMP, *ROOTS], capture_output=True, text=True, check=True
        )
        maps[airflow] = json.loads(dumped.stdout)
        version = subprocess.run(
            [python, "-c", "import kubernetes; print(kubernetes.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        )
        versions[airflow] = version.stdout.strip()
    first, *rest = maps.values()
    models: dict[str, dict[str, str]] = {}
    for kind, fields in first.items():
        shared = {
            key: held
            for key, held in fields.items()
            if all(other.get(kind, {}).get(key) == held for other in rest)
        }
        models[kind] = dict(sorted(shared.items()))
    return {
        "about": "kubernetes.client models reachable from V1Affinity and V1Volume, their manifest "
        "keys and what each holds, as every supported Airflow's client knows them "
        "(scripts/kubernetes_fields.py)",
        "clients": dict(sorted(versions.items())),
        "roots": list(ROOTS),
        "models": dict(sorted(models.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    text = json.dumps(field_map(), indent=1, sort_keys=False) + "\n"
    if args.check:
        stale = not OUT.exists() or OUT.read_text(encoding="utf-8") != text
        print(f"{OUT.relative_to(ROOT)}: {'stale' if stale else 'up to date'}")
        return 1 if stale else 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
