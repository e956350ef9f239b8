"""Rules only the DAG file needs, checked after the runtime's load -> validate -> plan.

The runtime validates what decides data movement; these rules decide whether a valid pack can be
written as a DAG that Airflow accepts and that can run: a pod needs an image and a secret for each
connection it uses, task ids must be unique, and two dag_ids must not map to one file name on a
case-insensitive file system.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from dpone import errors
from dpone.authoring.models import Hook, Workload
from dpone.authoring.yamldoc import YamlDocument, load_yaml
from dpone.credentials.credential_parts import FIELDS
from dpone.errors import ErrorRecord, Location

from .dagspec import part_env_name


class _Locator:
    """Positions in the catalog, parsed only when a rule fails (the happy path never re-reads)."""

    def __init__(self, catalog_path: str) -> None:
        self._path = catalog_path
        self._doc: YamlDocument | None = None
        self._loaded = False

    def _document(self) -> YamlDocument | None:
        if not self._loaded:
            self._doc, _ = load_yaml(Path(self._path), self._path)
            self._loaded = True
        return self._doc

    def __call__(self, path: tuple[str | int, ...], key: bool = False) -> Location:
        doc = self._document()
        if doc is None:
            return Location(self._path)
        return doc.locate(path, key=key)

    def entry(self, workload: str, kind: str, index: int) -> tuple[str, Location]:
        """Where ``airflow.<kind>[index]`` of a workload is written, named and located: its own
        entry, or ``defaults.airflow``'s when it inherits the list (lists are inherited whole)."""
        own: tuple[str | int, ...] = ("workloads", workload, "airflow", kind)
        doc = self._document()
        if doc is None or (*own, "__key__") in doc.positions:
            return f"airflow.{kind}[{index}]", self((*own, index))
        return f"defaults.airflow.{kind}[{index}]", self(("defaults", "airflow", kind, index))


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
    airflow = workload.airflow
    projected = {ref.connection for ref in airflow.secrets if ref.field in ("dsn", "scheme")}
    projected |= {ref.connection for ref in airflow.secret_files if ref.field in ("dsn", "scheme")}
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


def _credential_forms(workload: Workload, locate: _Locator) -> list[ErrorRecord]:
    """Refuse what the flavour cannot honour, located at the entry that holds it (the workload's
    or the one it inherits from defaults): an Airflow Connection on the kubernetes flavour (the
    operator would have to write its password into the pod spec, readable by anyone who can read
    the pod: project it from a Kubernetes secret instead), a Kubernetes secret on the subprocess
    flavour (its task runs on the worker, where no secret is projected: the reference would be
    dropped and the connection missing), and one part of a connection given twice (which one the
    task sees would depend on the order of env entries)."""
    airflow = workload.airflow
    found: list[ErrorRecord] = []
    if airflow.flavour == "kubernetes":
        for index, ref in enumerate(airflow.airflow_connections):
            where, location = locate.entry(workload.name, "airflow_connections", index)
            found.append(
                ErrorRecord(
                    errors.CATALOG_INVALID,
                    f"workload {workload.name!r}: {where} "
                    f"(connection {ref.connection!r}) cannot be honoured on the kubernetes "
                    "flavour: the operator would write the Airflow Connection's password into "
                    "the pod spec, where anyone who can read the pod sees it; project it from a "
                    "Kubernetes secret with airflow.secrets (a whole DSN, or one key per field) "
                    "or mount it and name the file in airflow.secret_files",
                    location,
                )
            )
    if airflow.flavour == "subprocess":
        for index, secret in enumerate(airflow.secrets):
            where, location = locate.entry(workload.name, "secrets", index)
            variable = part_env_name(secret.connection, secret.field)
            found.append(
                ErrorRecord(
                    errors.CATALOG_INVALID,
                    f"workload {workload.name!r}: {where} (the {secret.field} of connection "
                    f"{secret.connection!r}) cannot be honoured on the subprocess flavour: a "
                    "Kubernetes secret reaches a pod only, and this task runs on the Airflow "
                    f"worker, so it would have no {variable}; set {variable} in the worker's "
                    "environment, name an Airflow Connection in airflow.airflow_connections or "
                    "a mounted file in airflow.secret_files",
                    location,
                )
            )
    used = {
        name.upper(): name
        for process in workload.manifest.processes
        for name in (process.source.connection, process.sink.connection, process.state.connection)
        if name
    }
    for upper, name in sorted(used.items()):
        parts = [field.upper() for field in FIELDS]
        for suffix in ("FILE", *parts, *(f"{part}_FILE" for part in parts)):
            if f"{upper}_{suffix}" in used:
                found.append(
                    ErrorRecord(
                        errors.CATALOG_INVALID,
                        f"workload {workload.name!r}: connections {name!r} and "
                        f"{used[upper + '_' + suffix]!r} are both used, but "
                        f"DPONE_CONN_{upper}_{suffix} would be read as a part of {name!r} "
                        "(dpone.credentials.credential_parts); rename one of them",
                        locate(("workloads", workload.name), key=True),
                    )
                )
    seen: dict[tuple[str, str], tuple[str, int]] = {}
    forms: list[tuple[str, int, str, str]] = [
        ("secrets", i, r.connection, r.field) for i, r in enumerate(airflow.secrets)
    ]
    forms += [
        ("secret_files", i, r.connection, r.field) for i, r in enumerate(airflow.secret_files)
    ]
    forms += [
        ("airflow_connections", i, r.connection, "dsn")
        for i, r in enumerate(airflow.airflow_connections)
    ]
    for kind, index, connection, field in forms:
        name = connection.upper()  # its variables are DPONE_CONN_<NAME upper-cased>_...
        if (name, field) in seen:
            where, location = locate.entry(workload.name, kind, index)
            first, _ = locate.entry(workload.name, *seen[(name, field)])
            found.append(
                ErrorRecord(
                    errors.CATALOG_INVALID,
                    f"workload {workload.name!r}: {where} gives the {field} of connection "
                    f"{connection!r} again (first in {first}); give each part of a connection "
                    "once",
                    location,
                )
            )
        other = {"dsn": "scheme", "scheme": "dsn"}.get(field)
        if other is not None and (name, other) in seen:
            where, location = locate.entry(workload.name, kind, index)
            first, _ = locate.entry(workload.name, *seen[(name, other)])
            found.append(
                ErrorRecord(
                    errors.CATALOG_INVALID,
                    f"workload {workload.name!r}: {where} gives the {field} of connection "
                    f"{connection!r} beside its {other} ({first}): a scheme starts a DSN built "
                    "from parts, so a connection takes one of them",
                    location,
                )
            )
        seen.setdefault((name, field), (kind, index))
    return found


def validate_for_airflow(catalog_path: str, workloads: Iterable[Workload]) -> list[ErrorRecord]:
    """Every DAG-level problem of ``workloads`` (the catalog's at ``catalog_path``), in order.

    None of these rules needs a plan, so `dpone check` gives them every workload whose entry it
    could read (load_catalog_checked), a workload whose manifest has problems included."""
    locate = _Locator(catalog_path)
    found: list[ErrorRecord] = []
    file_names: dict[str, str] = {}
    for workload in workloads:
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
        found += _credential_forms(workload, locate)
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
