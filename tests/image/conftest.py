"""Runtime image suite configuration: it builds an image (about a minute), so it runs only with DPONE_SLOW=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`@pytest.mark.slow` tests of this folder run only with DPONE_SLOW=1 (make image)."""
    if os.environ.get("DPONE_SLOW") == "1":
        return
    keep, drop = [], []
    for item in items:
        mine = HERE in Path(str(item.path)).resolve().parents
        (drop if mine and item.get_closest_marker("slow") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
