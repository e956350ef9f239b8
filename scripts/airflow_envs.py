#!/usr/bin/env python3
"""Build (or reuse) one cached virtual environment per Airflow version for the Airflow matrix tests.

Usage::

    python3 scripts/airflow_envs.py [--versions 2.10.5,2.11.2,3.2.2,3.3.2] [--jobs 2] [--print-paths]

Standard library only; runs with any python3. For every version it installs
``requirements/airflow/requirements-lock-<version>.txt`` (plus ``extra-pins-<version>.txt`` when present,
in the same install command) into ``.cache/airflow/<version>-<key>/`` where ``key`` is
``sha256(lock file + extra pins + BUILDER_VERSION)[:16]``: a lock change yields a fresh folder.

Virtual environments cannot be moved, so each one is built at its final path and a completion marker is
written last. A folder without the marker (an interrupted build) is deleted and rebuilt. A per-version
file lock serialises concurrent builders (e.g. a pytest session and a manual run). Airflow is never
installed into the project's own ``.venv``.

``--cache-dir`` (or ``DPONE_AIRFLOW_ENVS_DIR``) puts the venvs elsewhere, e.g. a CI cache volume.

Progress goes to stderr. stdout gets ``<version> <python path>`` lines, or with ``--print-paths`` one JSON
object ``{version: python path}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BUILDER_VERSION = "2"  # bump to rebuild every cached environment
DEFAULT_VERSIONS = ("2.10.5", "2.11.2", "3.2.2", "3.3.2")
ROOT = Path(__file__).resolve().parent.parent
LOCK_DIR = ROOT / "requirements" / "airflow"
DEFAULT_CACHE_DIR = Path(os.environ.get("DPONE_AIRFLOW_ENVS_DIR") or ROOT / ".cache" / "airflow")
PROJECT_VENV = ROOT / ".venv"
MARKER = ".dpone-airflow-env-complete"
REQUIRED = ("apache-airflow", "apache-airflow-providers-cncf-kubernetes")
# Upper bounds that must hold in the installed environment (see extra-pins-3.2.2.txt).
UPPER_BOUNDS = {"3.2.2": {"fastapi": (0, 137), "svcs": (26, 2)}}

_print_lock = threading.Lock()


def log(msg: str) -> None:
    with _print_lock:
        print(f"[airflow-envs {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BuildError(RuntimeError):
    pass


def lock_file(version: str) -> Path:
    return LOCK_DIR / f"requirements-lock-{version}.txt"


def extra_pins_file(version: str) -> Path:
    return LOCK_DIR / f"extra-pins-{version}.txt"


def env_key(version: str) -> str:
    h = hashlib.sha256()
    h.update(lock_file(version).read_bytes())
    extra = extra_pins_file(version)
    if extra.exists():
        h.update(b"\0extra-pins\0")
        h.update(extra.read_bytes())
    h.update(b"\0builder\0" + BUILDER_VERSION.encode())
    return h.hexdigest()[:16]


def env_dir(version: str, cache: Path = DEFAULT_CACHE_DIR) -> Path:
    return cache / f"{version}-{env_key(version)}"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def parse_pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9._-]+)\s*==\s*([^\s;]+)", line)
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


def check_lock(version: str) -> None:
    """The lock must pin apache-airflow==version and the cncf.kubernetes provider (and the bounds)."""
    path = lock_file(version)
    if not path.exists():
        raise BuildError(f"{version}: lock file {path} is missing")
    pins = parse_pins(path)
    for name in REQUIRED:
        if name not in pins:
            raise BuildError(f"{version}: {path.name} does not pin {name}")
    if pins["apache-airflow"] != version:
        raise BuildError(f"{version}: {path.name} pins apache-airflow=={pins['apache-airflow']}")
    for name, bound in UPPER_BOUNDS.get(version, {}).items():
        if name not in pins:
            raise BuildError(f"{version}: {path.name} must pin {name} below {bound}")
        if _vtuple(pins[name]) >= bound:
            raise BuildError(f"{version}: {path.name} pins {name}=={pins[name]}, needs < {bound}")


def _vtuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def find_uv() -> list[str] | None:
    cand = PROJECT_VENV / "bin" / "uv"
    if cand.exists() and os.access(cand, os.X_OK):
        return [str(cand)]
    try:
        r = subprocess.run(
            [sys.executable, "-m", "uv", "--version"], check=False, capture_output=True, timeout=30
        )
        if r.returncode == 0:
            return [sys.executable, "-m", "uv"]
    except (OSError, subprocess.SubprocessError):
        pass
    which = shutil.which("uv")
    return [which] if which else None


def run(cmd: list[str], version: str, env: dict[str, str] | None = None) -> str:
    t0 = time.monotonic()
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-40:])
        raise BuildError(f"{version}: command failed ({r.returncode}): {' '.join(cmd)}\n{tail}")
    shown = " ".join(a if len(a) < 60 and "\n" not in a else "<...>" for a in cmd[1:4])
    log(f"{version}: {Path(cmd[0]).name} {shown} ... ok ({time.monotonic() - t0:.1f}s)")
    return r.stdout


SANITY = r"""
import json, os, sys, warnings
import airflow
import airflow.providers.cncf.kubernetes.operators.pod as pod
from importlib import metadata
out = {"airflow": airflow.__version__,
       "provider": metadata.version("apache-airflow-providers-cncf-kubernetes"),
       "python": sys.version.split()[0],
       "prefix": sys.prefix}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def sanity_check(version: str, venv: Path) -> dict[str, str]:
    py = venv_python(venv)
    with tempfile.TemporaryDirectory(prefix="dpone-af-sanity-") as home:
        env = dict(os.environ)
        env.update(
            AIRFLOW_HOME=home,
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="True",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
            PYTHONWARNINGS="ignore",
        )
        env.pop("PYTHONPATH", None)
        bounds = list(UPPER_BOUNDS.get(version, {}))
        out = run([str(py), "-c", SANITY, *bounds], version, env=env)
    facts = json.loads(out.strip().splitlines()[-1])
    if facts["airflow"] != version:
        raise BuildError(f"{version}: venv imports airflow {facts['airflow']}")
    if Path(facts["prefix"]).resolve() != venv.resolve():
        raise BuildError(f"{version}: sanity ran in {facts['prefix']}, not {venv}")
    for name, bound in UPPER_BOUNDS.get(version, {}).items():
        got = facts.get(name)
        if got is None or _vtuple(got) >= bound:
            raise BuildError(f"{version}: installed {name}=={got}, needs < {bound}")
    return facts


def build(
    version: str, uv: list[str] | None, force: bool = False, cache: Path = DEFAULT_CACHE_DIR
) -> Path:
    check_lock(version)
    venv = env_dir(version, cache)
    if venv.resolve() == PROJECT_VENV.resolve() or PROJECT_VENV.resolve() in venv.resolve().parents:
        raise BuildError("refusing to install Airflow into the project .venv")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{version}.lock", "w") as lockfh:
        fcntl.flock(lockfh, fcntl.LOCK_EX)
        marker = venv / MARKER
        if marker.exists() and not force and venv_python(venv).exists():
            log(f"{version}: cached {venv.name}")
            return venv_python(venv)
        if venv.exists():
            reason = "forced rebuild of" if marker.exists() else "incomplete (no marker)"
            log(f"{version}: removing {reason} {venv.name}")
            shutil.rmtree(venv)
        t0 = time.monotonic()
        log(f"{version}: building {venv} ({'uv' if uv else 'venv+pip'})")
        reqs = ["-r", str(lock_file(version))]
        if extra_pins_file(version).exists():
            reqs += ["-r", str(extra_pins_file(version))]
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)
        try:
            if uv:
                env.setdefault("UV_PYTHON_DOWNLOADS", "never")
                run([*uv, "venv", "--quiet", "--python", "3.11", str(venv)], version, env=env)
                py = venv_python(venv)
                run(
                    [
                        *uv,
                        "pip",
                        "install",
                        "--quiet",
                        "--compile-bytecode",
                        "--python",
                        str(py),
                        *reqs,
                    ],
                    version,
                    env=env,
                )
                run([*uv, "pip", "check", "--python", str(py)], version, env=env)
            else:
                base = shutil.which("python3.11") or sys.executable
                run([base, "-m", "venv", str(venv)], version, env=env)
                py = venv_python(venv)
                run(
                    [str(py), "-m", "pip", "install", "--quiet", "--compile", *reqs],
                    version,
                    env=env,
                )
                run([str(py), "-m", "pip", "check"], version, env=env)
            facts = sanity_check(version, venv)
        except BaseException:
            log(f"{version}: build failed; removing {venv.name}")
            shutil.rmtree(venv, ignore_errors=True)
            raise
        facts.update(builder=BUILDER_VERSION, seconds=round(time.monotonic() - t0, 1))
        tmp = venv / (MARKER + ".tmp")
        tmp.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, marker)
        log(
            f"{version}: done in {facts['seconds']}s "
            f"(airflow {facts['airflow']}, cncf.kubernetes {facts['provider']})"
        )
        # Folders of other keys for this version (an older lock or builder) are now stale.
        for other in cache.glob(f"{version}-*"):
            if other != venv and other.is_dir():
                log(f"{version}: removing stale {other.name}")
                shutil.rmtree(other, ignore_errors=True)
        return venv_python(venv)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default=",".join(DEFAULT_VERSIONS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--print-paths", action="store_true", help="print {version: python} as JSON")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--no-uv", action="store_true", help="use python -m venv + pip")
    ap.add_argument(
        "--cache-dir",
        help="where the venvs live (default: $DPONE_AIRFLOW_ENVS_DIR or .cache/airflow)",
    )
    args = ap.parse_args(argv)
    cache = Path(args.cache_dir).resolve() if args.cache_dir else DEFAULT_CACHE_DIR
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    uv = None if args.no_uv else find_uv()
    t0 = time.monotonic()
    paths: dict[str, str] = {}
    errors: dict[str, str] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futs = {pool.submit(build, v, uv, args.force, cache): v for v in versions}
        for fut in concurrent.futures.as_completed(futs):
            v = futs[fut]
            try:
                paths[v] = str(fut.result())
            except Exception as exc:
                errors[v] = str(exc)
                log(f"{v}: ERROR {exc}")
    log(f"{len(paths)}/{len(versions)} environments ready in {time.monotonic() - t0:.1f}s")
    ordered = {v: paths[v] for v in versions if v in paths}
    if args.print_paths:
        print(json.dumps(ordered, indent=2))
    else:
        for v, p in ordered.items():
            print(f"{v} {p}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
