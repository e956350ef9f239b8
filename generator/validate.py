"""Rules only the DAG file needs, checked after the runtime's load -> validate -> plan.

The runtime validates what decides data movement; these rules decide whether a valid pack can be
written as a DAG that Airflow accepts and that can run: a pod needs an image and a secret for each
connection it uses, task ids must be unique, and two dag_ids must not map to one file name on a
case-insensitive file system.
"""

from __future__ import annotations

from pathlib import Path

from dpone import errors
from dpone.authoring.models import Catalog, Hook, Workload
from dpone.authoring.yamldoc import YamlDocument, load_yaml
from dpone.errors import ErrorRecord, Location


class _Locator:
    """Positions in the catalog, parsed only when a rule fails (the happy path never re-reads)."""

    def __init__(self, catalog_path: str) -> None:
        self._path = catalog_path
        self._doc: YamlDocument | None = None
        self._loaded = False

    def __call__(self, path: tuple[str | int, ...], key: bool = False) -> Location:
        if not self._loaded:
            self._doc, _ = load_yaml(Path(self._path), self._path)
            self._loaded = True
        if self._doc is None:
            return Location(self._path)
        return self._doc.locate(path, key=key)


def _duplicate_hooks(
    workload: str, kind: str, hooks: tuple[Hook, ...], locate: _Locator
) -> list[ErrorRecord]:
    seen: set[str] = set()
    found: list[ErrorRecord] = []
    for index, hook in enumerate(hooks):
        if hook.name in seen:
            found.append(
                ErrorRecord(
                    errors.CATALOG_INVALID,
                    f"workload {workload!r}: {kind} name {hook.name!r} is used twice; each "
                    f"hook becomes the Airflow task {kind.split('_', maxsplit=1)[0]}_{hook.name}",
                    locate(("workloads", workload, "airflow", kind, index, "name")),
                )
            )
        seen.add(hook.name)
    return found


def _unprojected_connections(workload: Workload, locate: _Locator) -> list[ErrorRecord]:
    """kubernetes: a DSN reaches the pod only as a secret reference, so each used connection
    needs an airflow.secrets entry; without one the pod fails with DPONE_CONNECTION_MISSING."""
    projected = {ref.connection for ref in workload.airflow.secrets}
    found: list[ErrorRecord] = []
    for process in workload.manifest.processes:
        state = process.state.connection
        used = [process.source.connection, process.sink.connection, *([state] if state else [])]
        for name in dict.fromkeys(used):
            if name in projected:
                continue
            projected.add(name)  # report each connection once
            found.append(
                ErrorRecord(
                    errors.CATALOG_INVALID,
                    f"workload {workload.name!r}: process {process.name!r} uses connection "
                    f"{name!r}, but airflow.secrets has no entry for it, so the pod would have no "
                    f"DPONE_CONN_{name.upper()}; add {{connection: {name}, secret: <k8s secret>, "
                    f"key: <key>}}",
                    locate(("workloads", workload.name), key=True),
                )
            )
    return found


def validate_for_airflow(catalog: Catalog) -> list[ErrorRecord]:
    """Every DAG-level problem of every workload, in catalog order."""
    locate = _Locator(catalog.path)
    found: list[ErrorRecord] = []
    file_names: dict[str, str] = {}
    for workload in catalog.workloads:
        airflow = workload.airflow
        wpath: tuple[str | int, ...] = ("workloads", workload.name)
        if airflow.flavour == "kubernetes" and not airflow.image:
            found.append(
                ErrorRecord(
                    errors.GENERATE_IMAGE_REQUIRED,
                    f"workload {workload.name!r}: flavour kubernetes needs airflow.image "
                    f"(the runtime image with this catalog at {airflow.catalog_path})",
                    locate(wpath, key=True),
                )
            )
        if airflow.flavour == "kubernetes":
            found += _unprojected_connections(workload, locate)
        found += _duplicate_hooks(workload.name, "pre_hooks", airflow.pre_hooks, locate)
        found += _duplicate_hooks(workload.name, "post_hooks", airflow.post_hooks, locate)
        folded = airflow.dag_id.casefold()
        if folded in file_names and file_names[folded] != airflow.dag_id:
            found.append(
                ErrorRecord(
                    errors.GENERATED_FILE_CONFLICT,
                    f"workload {workload.name!r}: dag_id {airflow.dag_id!r} differs from "
                    f"{file_names[folded]!r} only in case; their files would collide on "
                    f"case-insensitive file systems",
                    locate((*wpath, "airflow", "dag_id")),
                )
            )
        file_names.setdefault(folded, airflow.dag_id)
    return found
