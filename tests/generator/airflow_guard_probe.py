#!/usr/bin/env python3
"""Parse generated DAG files on an Airflow made to look unsupported (runs INSIDE an Airflow venv).

    <airflow-venv>/bin/python tests/generator/airflow_guard_probe.py DAG.py [DAG2.py ...]

Prints, as JSON, the import error of every file under each simulation, one at a time, in this
process: ``none`` (the real Airflow, no error expected), ``no_provider`` (the cncf.kubernetes pod
operator module cannot be imported), ``no_mapping`` (BaseOperator has no ``partial``), and
``no_map_index_template`` (BaseOperator's ``__init__`` takes no ``map_index_template``).
Standard library + Airflow only.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import sys
from unittest import mock

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "airflow", "harness")
sys.path.insert(0, os.path.abspath(HARNESS))

import inspect_dag as harness  # noqa: E402

POD_MODULE = "airflow.providers.cncf.kubernetes.operators.pod"


def _base_operators() -> list[type]:
    """Every BaseOperator class a generated file may inherit from on this Airflow."""
    found = []
    for module in ("airflow.models.baseoperator", "airflow.sdk"):
        with contextlib.suppress(ImportError):
            base = getattr(__import__(module, fromlist=["BaseOperator"]), "BaseOperator", None)
            if base is not None and base not in found:
                found.append(base)
    return found


@contextlib.contextmanager
def simulate(name: str):
    if name == "none":
        yield
    elif name == "no_provider":
        with mock.patch.dict(sys.modules, {POD_MODULE: None}):
            yield
    elif name == "no_mapping":
        with contextlib.ExitStack() as stack:
            for base in _base_operators():
                stack.enter_context(mock.patch.object(base, "partial", None))
            yield
    elif name == "no_map_index_template":

        def old_init(self, task_id, owner="airflow", retries=0, **kwargs):
            raise AssertionError("never called: the guard stops the import first")

        with contextlib.ExitStack() as stack:
            for base in _base_operators():
                stack.enter_context(mock.patch.object(base, "__init__", old_init))
            assert all(
                "map_index_template" not in inspect.signature(b.__init__).parameters
                for b in _base_operators()
            )
            yield
    else:
        raise ValueError(name)


def main(argv: list[str]) -> int:
    home = harness.setup_airflow_home()
    folder = os.path.join(home, "dags")
    for path in argv:
        shutil.copy(path, folder)
    out: dict = {}
    with harness.quiet_output():
        import airflow
        import airflow.providers.cncf.kubernetes.operators.pod

        for name in ("none", "no_provider", "no_mapping", "no_map_index_template"):
            with simulate(name):
                bag = harness.make_dagbag(folder)
            out[name] = {os.path.basename(path): None for path in argv} | {
                os.path.basename(k): str(v)[-1500:] for k, v in bag.import_errors.items()
            }
    out["airflow_version"] = airflow.__version__
    json.dump(out, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
