"""Print the sha256 of every file `dpone generate` writes for every golden case, as JSON.

Run from the repository root by tests/generator/test_determinism.py, in this interpreter or in
another one (another PYTHONHASHSEED, another Python version); the outputs must be identical.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def digests() -> dict[str, str]:
    from dpone_generator.build import build

    out: dict[str, str] = {}
    for catalog in sorted(Path("golden").glob("*/workloads.yaml")):
        result = build(catalog.as_posix())
        assert not result.errors, result.errors
        for file in result.files:
            key = f"{catalog.parent.name}/{file.name}"
            out[key] = hashlib.sha256(file.text.encode("utf-8")).hexdigest()
    return out


if __name__ == "__main__":
    json.dump({"python": sys.version.split()[0], "digests": digests()}, sys.stdout, sort_keys=True)
