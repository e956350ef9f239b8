"""The keys a Kubernetes structure in a catalog may hold (``airflow.pod.affinity``, a volume).

The generated DAG file turns those structures into ``kubernetes.client`` models, which refuse
a key they do not know: the DAG's import (or a mapped task) would fail. ``kubernetes_fields.json``
lists, for every model reachable from ``V1Affinity`` and ``V1Volume``, the manifest keys every
supported Airflow's client knows (written by ``scripts/kubernetes_fields.py``), so ``dpone
check`` refuses an unknown key at its line instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import cache
from typing import Any

Path = tuple[str | int, ...]


@cache
def _models() -> dict[str, dict[str, str]]:
    here = os.path.join(os.path.dirname(__file__), "kubernetes_fields.json")
    with open(here, encoding="utf-8") as handle:
        models: dict[str, dict[str, str]] = json.load(handle)["models"]
    return models


def unknown_keys(value: Any, kind: str, path: Path = ()) -> Iterator[tuple[Path, str, list[str]]]:
    """(path of the mapping, the unknown key, the model's keys) for each key of ``value`` (a
    manifest-form ``kind``, e.g. ``V1Volume``) and of everything nested in it that the model
    does not have. Values of another shape are left to the schema and the client."""
    if kind.startswith("list["):
        for index, item in enumerate(value if isinstance(value, list) else ()):
            yield from unknown_keys(item, kind[5:-1], (*path, index))
        return
    if kind.startswith("dict["):
        inner = kind[5:-1].split(", ", 1)[-1]
        for key, item in value.items() if isinstance(value, dict) else ():
            yield from unknown_keys(item, inner, (*path, key))
        return
    fields = _models().get(kind)
    if fields is None or not isinstance(value, dict):
        return  # a scalar, or "object": any value
    for key, item in value.items():
        held = fields.get(str(key))
        if held is None:
            yield path, str(key), sorted(fields)
        else:
            yield from unknown_keys(item, held, (*path, key))
