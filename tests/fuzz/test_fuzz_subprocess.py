"""The same item oracle through real `.venv/bin/dpone run` processes, env passed as raw bytes.

In-process runs cannot show what a real process does with non-UTF-8 env bytes (PEP 383
surrogate escapes), its real stderr encoding, or an interpreter-level crash. These cases are
drawn from a fixed seed (reproducible), run a few processes at a time, and checked with the
same oracle: exit code 3, last stderr line a registered dpone.error.v1, nothing on stdout.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fuzzkit
from dpone import errors
from test_fuzz_mapping_item import CLEAN_ENV, PROJECTS, identity_of, plan_of, valid_items

SEED = 20260717
DPONE = Path(sys.executable).with_name("dpone")


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(["flip", "insert", "delete", "truncate", "dup"])
        pos = rng.randint(0, max(0, len(data) - 1))
        if op == "flip" and data:
            data[pos] = rng.randint(1, 255)
        elif op == "insert":
            data[pos:pos] = bytes(rng.randint(1, 255) for _ in range(rng.randint(1, 6)))
        elif op == "delete":
            del data[pos : pos + rng.randint(1, 10)]
        elif op == "truncate":
            del data[pos:]
        elif op == "dup":
            data[pos:pos] = data[pos : pos + rng.randint(1, 30)]
    return bytes(data)


def generate_cases(n: int) -> list[tuple[str, bytes]]:
    rng = random.Random(SEED)
    cases: list[tuple[str, bytes]] = []
    for i in range(n):
        kind = sorted(PROJECTS)[i % len(PROJECTS)]
        base = rng.choice(valid_items(kind)).encode()
        shape = i % 5
        if shape == 0:  # raw bytes, often not UTF-8
            value = bytes(rng.randint(1, 255) for _ in range(rng.randint(0, 200)))
        elif shape in (1, 2):
            value = _mutate(rng, base)
        elif shape == 3:  # well-formed JSON that disagrees with the plan
            doc = json.loads(base)
            doc["item_index"] = rng.randint(0, 250)
            doc["first_chunk_index"] = rng.randint(-1, 400)
            doc["last_chunk_index"] = doc["first_chunk_index"] + rng.randint(-1, 12)
            doc["chunks_count"] = doc["last_chunk_index"] - doc["first_chunk_index"] + 1
            value = json.dumps(doc).encode()
        else:  # big: around the 8 KiB limit
            value = base[:-1] + b',"x":"' + b"y" * rng.randint(7_900, 9_000) + b'"}'
        cases.append((kind, value.replace(b"\x00", b"")))
    return cases


def run_case(kind: str, value: bytes) -> tuple[int, bytes, bytes]:
    catalog, workload = PROJECTS[kind]
    env: dict[bytes, bytes] = {
        k.encode(): v.encode() for k, v in os.environ.items() if k not in CLEAN_ENV
    }
    env[b"DPONE_AIRFLOW_MAPPING_ITEM"] = value
    env[b"DPONE_AIRFLOW_RUN_IDENTITY"] = identity_of(kind).encode()
    argv = [str(DPONE), "run", "--catalog", str(catalog), "--workload", workload]
    argv += ["--process", plan_of(kind).name]
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)  # type: ignore[arg-type]
    return proc.returncode, proc.stdout, proc.stderr


def test_fuzz_item_through_real_processes() -> None:
    n = fuzzkit.examples(0.02)
    cases = generate_cases(n)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: run_case(*case), cases))
    allowed = {errors.MAPPING_ITEM_INVALID, errors.MAPPING_PLAN_MISMATCH}
    seen: set[str] = set()
    for (kind, value), (code, stdout, stderr) in zip(cases, results, strict=True):
        context = f"subprocess {kind} item={value[:200]!r}"
        text = stderr.decode("utf-8", "backslashreplace")
        assert b"Traceback" not in stderr, f"{context}: {text[-1500:]}"
        assert stdout == b"", f"{context}: stdout {stdout[:300]!r}"
        assert code == 3, f"{context}: exit {code}: {text[-800:]}"
        last = [line for line in text.splitlines() if line.strip()][-1]
        record = fuzzkit.assert_error_record(json.loads(last), context)
        assert record["code"] in allowed, f"{context}: {record}"
        seen.add(record["code"])
        fuzzkit.count("item.subprocess")
    assert seen == allowed, f"the generated cases should reach both refusals, saw {seen}"
