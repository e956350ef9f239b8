"""The env a generated Airflow task passes to `dpone run`, computed from the compiled plan alone.

The generator writes it into every DAG file; `dpone run --item N` re-creates it for a local
re-run or an incident, so the re-run carries exactly the run identity and mapping item of mapped
task N (never a hand-written DPONE_AIRFLOW_MAPPING_ITEM). `dpone ledger status` names the same
task and map indexes in the `airflow tasks clear` commands it prints.
"""

from __future__ import annotations

from dpone.authoring.models import AirflowConfig
from dpone.credentials.credential_parts import dsn_file_env, field_env
from dpone.packing.pack import ProcessPlan, WorkloadPack
from dpone.plan.mapping import MappingItem, MappingPlan
from dpone.task.identity import RunIdentity
from dpone.task.item import ENV_ITEM, ENV_LABEL, ENV_RUN_IDENTITY

Env = tuple[tuple[str, str], ...]
LABEL_MAX_CHARS = 250  # Airflow's rendered_map_index column


def runtime_task_id(plan: ProcessPlan) -> str:
    """The Airflow task id of a process's runtime task (mapped or not)."""
    return f"run_{plan.name}"


def run_identity(pack: WorkloadPack, plan: ProcessPlan) -> RunIdentity:
    """What the DAG task of ``plan`` was generated from (DPONE_AIRFLOW_RUN_IDENTITY)."""
    airflow = pack.workload.airflow
    return RunIdentity(
        dag_id=airflow.dag_id,
        workload=pack.workload.name,
        process=plan.name,
        pack_fingerprint=pack.fingerprint,
        flavour=airflow.flavour,
        image=airflow.image if airflow.flavour == "kubernetes" else None,
    )


def item_label(plan: ProcessPlan, mapping: MappingPlan, item: MappingItem) -> str:
    """The Grid label of one mapped task: its map index, chunk range and half-open data bounds.

    The index is zero-based like Airflow's map index and the item's ``item_index``, so the label,
    the Airflow CLI (``--map-index``) and the runtime's logs name an item the same way. The end
    bound is exclusive (chunks are ``[start, end)``), so the label spells the interval as a
    comparison on the chunk column rather than a range that could be read as inclusive.
    """
    first = plan.chunks[item.first_chunk_index - 1]
    last = plan.chunks[item.last_chunk_index - 1]
    if item.first_chunk_index == item.last_chunk_index:
        chunks = f"chunk {item.first_chunk_index}"
    else:
        chunks = f"chunks {item.first_chunk_index}-{item.last_chunk_index}"
    bf = plan.config.backfill
    column = bf.chunk.column if bf is not None else "chunk"
    label = (
        f"item {item.item_index}/{mapping.items_total}: {chunks}, "
        f"{first.start} <= {column} < {last.end}"
    )
    return label[:LABEL_MAX_CHARS]


def task_env(pack: WorkloadPack, plan: ProcessPlan) -> Env:
    """The env every task of ``plan`` gets: the catalog's ``airflow.env`` and the run identity,
    sorted by key."""
    identity = (ENV_RUN_IDENTITY, run_identity(pack, plan).env_value())
    return tuple(sorted((*pack.workload.airflow.env, identity)))


def secret_file_env(airflow: AirflowConfig) -> Env:
    """DPONE_CONN_<NAME>[_<FIELD>]_FILE -> path of each ``airflow.secret_files`` entry: paths,
    never values (the runtime reads the file at each connect)."""
    return tuple(
        (
            (
                dsn_file_env(f.connection)
                if f.field == "dsn"
                else field_env(f.connection, f.field) + "_FILE"
            ),
            f.path,
        )
        for f in airflow.secret_files
    )


def runtime_env(pack: WorkloadPack, plan: ProcessPlan) -> Env:
    """The env of the runtime task of ``plan``: :func:`task_env` plus, when the catalog names
    ``airflow.secret_files``, their paths, sorted by key (what the DAG file passes)."""
    env = task_env(pack, plan)
    files = secret_file_env(pack.workload.airflow)
    return tuple(sorted((*env, *files))) if files else env


def mapped_item_env(env: Env, plan: ProcessPlan, mapping: MappingPlan, item: MappingItem) -> Env:
    """The env of mapped task ``item``: ``env`` (from :func:`task_env`), then its mapping item and
    Grid label, in the order the DAG file lists them."""
    return (
        *env,
        (ENV_ITEM, mapping.item_env_value(item)),
        (ENV_LABEL, item_label(plan, mapping, item)),
    )
