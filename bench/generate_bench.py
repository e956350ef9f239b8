"""`dpone generate` benchmark: 500 workloads, cold (new process) and warm (in-process rerun).

A catalog of 500 workloads is synthesised in a temporary folder, each with its own manifest,
mixing what real catalogs hold (kubernetes and subprocess flavours, hooks, resources):

  40%  internal     one task; weekly chunks over 3 months (full_refresh for every 4th)
  30%  visible      30 daily chunks, 30 mapped tasks
  25%  summary      365 daily chunks into 40 mapped tasks
   5%  summary      1,000 integer chunks into 200 mapped tasks (the hard ceiling)

Figures (best of --repetitions), each as wall clock and as CPU time (user + system):

  cold            `python -m dpone generate CATALOG --out DIR` in a new process, empty DIR
  cold --check    the same command with --check against the up-to-date DIR (reads, diffs nothing)
  warm            generate_command in this process after one earlier run, into an empty DIR

CPU time is the figure to compare on a shared machine: wall clock grows with other processes'
load, CPU time much less. Goal: cold under 10 s; the process exits 1 when the cold CPU time misses
it (the wall time is reported next to it).

usage: python bench/generate_bench.py [--workloads 500] [--repetitions 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL_SECONDS = 10.0

MANIFEST = """schema: dpone.pipeline.v1
name: {name}
processes:
  - name: {name}
    source: {{connection: warehouse, table: {{schema: raw, name: {name}}}}}
    sink:
      connection: warehouse
      table: {{schema: analytics, name: {name}}}
      keys: [id]
      strategy: {{mode: {strategy}}}
{backfill}    state: {{backend: audit_schema, connection: warehouse, require_distributed_lock: true}}
"""
DAILY = "chunk: {column: day, type: date, start: 2023-01-01, end: 2024-01-01}"
BACKFILLS = {
    "internal": "chunk: {column: day, type: date, start: 2024-01-01, end: 2024-04-01, unit: week}",
    "visible": "chunk: {column: day, type: date, start: 2024-06-01, end: 2024-07-01}",
    "summary40": DAILY,
    "summary200": "chunk: {column: id, type: integer, start: 0, end: 1000000, step: 1000}",
}
MAPPINGS = {
    "internal": "",
    "visible": "mapping: {mode: visible, max_items: 30, max_active: 6, pool: dpone_visible}",
    "summary40": "mapping: {mode: summary, max_items: 40, max_active: 8, pool: dpone_backfill}",
    "summary200": "mapping: {mode: summary, max_items: 200, max_active: 16, pool: dpone_big}",
}


def _kind(index: int) -> str:
    slot = index % 20
    if slot < 8:
        return "internal"
    if slot < 14:
        return "visible"
    if slot < 19:
        return "summary40"
    return "summary200"


def synthesise(folder: Path, count: int) -> tuple[Path, dict[str, int]]:
    """Write the catalog and its manifests; returns the catalog path and the mode mix."""
    (folder / "manifests").mkdir(parents=True)
    mix: dict[str, int] = {}
    lines = [
        "schema: dpone.workload-catalog.v1\n",
        "defaults:\n  airflow:\n",
        "    image: registry.example.com/dpone-runtime:0.1.0\n",
        "    namespace: data\n",
        "    catalog_path: /opt/dpone/catalog/workloads.yaml\n",
        "    secrets:\n      - {connection: warehouse, secret: dpone-conn-warehouse, key: dsn}\n",
        "    env: {DPONE_LOG_FORMAT: json, SETTINGS_FILE: settings.yaml}\n",
        "workloads:\n",
    ]
    for index in range(count):
        kind = _kind(index)
        mix[kind] = mix.get(kind, 0) + 1
        name = f"w{index:04d}_{kind}"
        full_refresh = kind == "internal" and index % 4 == 0
        backfill = "" if full_refresh else f"    backfill:\n      {BACKFILLS[kind]}\n"
        manifest = MANIFEST.format(
            name=name, strategy="full_refresh" if full_refresh else "backfill", backfill=backfill
        )
        (folder / "manifests" / f"{name}.yaml").write_text(manifest, encoding="utf-8")
        airflow = [f"tags: [bench, {kind}]"]
        if index % 5 == 0:
            airflow.append("flavour: subprocess")
        if index % 3 == 0:
            airflow.append("resources: {requests: {cpu: 250m, memory: 512Mi}}")
        if index % 7 == 0:
            airflow.append("pre_hooks: [{name: migrate, command: [dpone, check, x.yaml]}]")
        if MAPPINGS[kind]:
            airflow.append(MAPPINGS[kind])
        lines.append(f"  {name}:\n    manifest: manifests/{name}.yaml\n    airflow:\n")
        lines.extend(f"      {line}\n" for line in airflow)
    catalog = folder / "workloads.yaml"
    catalog.write_text("".join(lines), encoding="utf-8")
    return catalog, mix


Timing = tuple[float, float]  # (wall seconds, CPU seconds)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu() -> float:
    """This process's CPU time plus its reaped children's (the formatting workers)."""
    return time.process_time() + _children_cpu()


def _cold(catalog: Path, out: Path, check: bool) -> Timing:
    cmd = [sys.executable, "-m", "dpone", "generate", str(catalog), "--out", str(out)]
    if check:
        cmd.append("--check")
    cpu, started = _children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"generate failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, cpu


def _warm(catalog: Path, out: Path) -> Timing:
    from dpone_generator.cli import generate_command

    shutil.rmtree(out, ignore_errors=True)
    cpu, started = _cpu(), time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = generate_command(str(catalog), str(out), check=False)
    elapsed, cpu = time.perf_counter() - started, _cpu() - cpu
    if code != 0:
        raise SystemExit(f"generate failed ({code})")
    return elapsed, cpu


def _phases(catalog: Path) -> dict[str, Timing]:
    """Where a warm run spends its time: load+validate+plan (the runtime's front half) and
    render+format (the generator), as (wall, CPU incl. the formatting workers) seconds."""
    from dpone.packing.pack import load_and_compile
    from dpone_generator.build import build_from_packs, display_path

    wall0, cpu0 = time.perf_counter(), _cpu()
    _, packs, problems = load_and_compile(str(catalog))
    wall1, cpu1 = time.perf_counter(), _cpu()
    assert not problems, problems[:3]
    built = build_from_packs(display_path(str(catalog)), packs)
    assert not built.errors
    wall2, cpu2 = time.perf_counter(), _cpu()
    return {
        "load_validate_plan": (wall1 - wall0, cpu1 - cpu0),
        "render_format": (wall2 - wall1, cpu2 - cpu1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=500)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dpone-gen-bench-") as tmp:
        root = Path(tmp)
        catalog, mix = synthesise(root / "project", args.workloads)
        cold, check, warm = [], [], []
        for rep in range(args.repetitions):
            out = root / f"cold{rep}"
            cold.append(_cold(catalog, out, check=False))
            check.append(_cold(catalog, out, check=True))
        _warm(catalog, root / "warm")  # the earlier run that warms this process
        for _ in range(args.repetitions):
            warm.append(_warm(catalog, root / "warm"))
        phases = _phases(catalog)
        files = list((root / "warm").iterdir())
        size = sum(p.stat().st_size for p in files)

    def best(timings: list[Timing]) -> dict[str, float]:
        return {
            "wall_s": round(min(t[0] for t in timings), 3),
            "cpu_s": round(min(t[1] for t in timings), 3),
        }

    result: dict[str, Any] = {
        "workloads": args.workloads,
        "mix": mix,
        "files": len(files),
        "bytes": size,
        "cold": best(cold),
        "cold_check": best(check),
        "warm": best(warm),
        "warm_phases": {k: best([v]) for k, v in phases.items()},
        "goal_s": GOAL_SECONDS,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(f"dpone generate, {args.workloads} workloads {mix}")
        print(f"  output             {len(files)} files, {size / 1e6:.1f} MB")
        print("                          wall       CPU")
        for label, key in (
            ("cold (new process)", "cold"),
            ("cold --check", "cold_check"),
            ("warm (in-process)", "warm"),
        ):
            print(f"  {label:<20} {result[key]['wall_s']:7.3f} s {result[key]['cpu_s']:7.3f} s")
        for name, value in result["warm_phases"].items():
            print(f"    {name:<18} {value['wall_s']:7.3f} s {value['cpu_s']:7.3f} s")
        print(
            f"  goal: cold < {GOAL_SECONDS:.0f} s; best of {args.repetitions}; Python "
            f"{result['python']}, {result['cpus']} CPUs, load average {result['load_average']}"
        )
    return 0 if result["cold"]["cpu_s"] < GOAL_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
