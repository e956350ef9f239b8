"""The runtime image from deploy/Containerfile, built with podman and run (`make image`,
DPONE_SLOW=1: building it takes about a minute).

The build uses buildah's chroot isolation when the machine's OCI runtime cannot start containers
(this one: a sandbox whose crun and runc both fail to set the containers' rlimits). The run then
happens without a container engine: the container's own root filesystem (`podman create` +
`podman mount`) is entered with `chroot` as the image's user 10001, in a new PID namespace so that
`dpone` is PID 1 as in a pod, with the evidence volume bind-mounted. The image's configuration
(user, exec-form entrypoint, volume, environment) is read from podman. What stays UNVERIFIED there
is the container runtime itself (namespaces and cgroups that crun or runc would set up).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden" / "summary_365_into_40"
TAG = "localhost/dpone-runtime:test"
ENGINE = shutil.which("podman")
REPORT: dict[str, Any] = {}

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def _run(*argv: str, timeout: int = 900, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw
    )


def _engine_runs_containers() -> bool:
    assert ENGINE, "podman is needed: apt-get install podman debootstrap"
    probe = _run(
        ENGINE, "run", "--rm", "localhost/dpone-base:bookworm-minbase", "true", timeout=120
    )
    REPORT["podman_run_probe"] = (probe.returncode, probe.stderr.strip()[-300:])
    return probe.returncode == 0


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    catalog = tmp_path_factory.mktemp("catalog")
    for path in GOLDEN.glob("*.yaml"):
        shutil.copy(path, catalog / path.name)
    env = dict(os.environ)
    started = time.monotonic()
    # the base first (debootstrap), so that the probe can try to start a container from it
    base = _run(ENGINE or "podman", "image", "exists", "localhost/dpone-base:bookworm-minbase")
    runs = base.returncode == 0 and _engine_runs_containers()
    if not runs:
        env["DPONE_BUILD_ISOLATION"] = "chroot"
    built = _run("bash", str(REPO / "scripts" / "build_image.sh"), str(catalog), TAG, env=env)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    if base.returncode != 0:
        runs = _engine_runs_containers()
    REPORT["build_seconds"] = round(time.monotonic() - started, 1)
    inspected = _run(ENGINE or "podman", "image", "inspect", TAG)
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)[0]
    REPORT["image_bytes"] = info["Size"]
    return {"config": info["Config"], "engine_runs": runs}


def test_image_configuration(image: dict[str, Any]) -> None:
    config = image["config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["/opt/dpone/venv/bin/dpone"]  # exec form: no shell
    assert "/var/lib/dpone/evidence" in config["Volumes"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["DPONE_EVIDENCE_DIR"] == "/var/lib/dpone/evidence"
    assert env["PATH"].startswith("/opt/dpone/venv/bin:")


@contextlib.contextmanager
def container_root() -> Iterator[Path]:
    """A container of the image (never started) and its writable root filesystem."""
    created = _run(ENGINE or "podman", "create", TAG)
    assert created.returncode == 0, created.stderr
    cid = created.stdout.strip()
    try:
        mounted = _run(ENGINE or "podman", "mount", cid)
        assert mounted.returncode == 0, mounted.stderr
        yield Path(mounted.stdout.strip())
    finally:
        _run(ENGINE or "podman", "umount", cid)
        _run(ENGINE or "podman", "rm", "-f", cid)


@pytest.fixture
def warehouse(pg_dsn: str) -> Iterator[str]:
    name = f"dpone_image_{os.getpid()}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    url = f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:{info.get('port', '5432')}/{name}"  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn:
        for schema in ("raw", "analytics"):
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(
                f"CREATE TABLE {schema}.orders (order_id bigint PRIMARY KEY, "
                f"order_date date NOT NULL, amount numeric(12,2) NOT NULL)"
            )
        conn.execute(
            "INSERT INTO raw.orders SELECT g, date '2023-01-01' + ((g - 1) % 365), g % 1000 "
            "FROM generate_series(1, 18250) AS g"
        )
    try:
        yield url
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _in_image(root: Path, evidence: Path, env: dict[str, str], *argv: str) -> list[str]:
    """The image's entrypoint with ``argv``, as uid 10001, PID 1 of a new PID namespace."""
    (root / "var/lib/dpone/evidence").mkdir(parents=True, exist_ok=True)
    image_env = {
        "PATH": "/opt/dpone/venv/bin:/usr/local/bin:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "DPONE_EVIDENCE_DIR": "/var/lib/dpone/evidence",
        "HOME": "/nonexistent",
        **env,
    }
    pairs = [f"{k}={v}" for k, v in image_env.items()]
    inner = f"mount --bind {evidence} {root}/var/lib/dpone/evidence && exec chroot --userspec=10001:10001 {root} /usr/bin/env -i {' '.join(map(repr, pairs))} "  # fmt: skip
    return ["unshare", "--mount", "--pid", "--fork", "sh", "-c", inner + " ".join(argv)]


def _digests(url: str) -> tuple[Any, Any]:
    """(source, target) row count and sums."""
    with psycopg.connect(url) as conn:
        digest = "SELECT count(*), sum(order_id), sum(amount) FROM {}.orders"
        return (
            conn.execute(digest.format("raw")).fetchone(),
            conn.execute(digest.format("analytics")).fetchone(),
        )


def _restart_campaign(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE analytics.orders")
        conn.execute("DROP SCHEMA IF EXISTS dpone_audit CASCADE")


def _signal_pid1(
    root: Path, evidence: Path, env: dict[str, str], url: str, sig: int, args: tuple[str, ...]
) -> dict[str, Any]:
    """Start a fresh campaign with dpone as PID 1, send ``sig`` after its first chunk line (as the
    kubelet does to a pod's PID 1) and report how the run ended."""
    _restart_campaign(url)
    argv = _in_image(root, evidence, env, "/opt/dpone/venv/bin/dpone", *args)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if ": chunk " in line:
            break
    init = _run("pgrep", "-P", str(proc.pid)).stdout.split()  # unshare's child: the ns's PID 1
    assert len(init) == 1, init
    sent = time.monotonic()
    os.kill(int(init[0]), sig)
    _, rest = proc.communicate(timeout=300)
    lines.append(rest)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dpone_audit.chunk_transition WHERE state = 'committed'"
        ).fetchone()
    return {
        "exit_code": proc.returncode,
        "seconds_after_signal": round(time.monotonic() - sent, 1),
        "chunks_committed_of_365": row[0] if row else None,
        "last_line": "".join(lines).strip().splitlines()[-1][:300],
    }


def test_dpone_run_from_the_image(image: dict[str, Any], warehouse: str, tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    os.chown(evidence, 10001, 10001)
    args = ("run", "--catalog", "/opt/dpone/catalog/workloads.yaml", "--workload", "orders_history")
    env = {"DPONE_CONN_WAREHOUSE": warehouse}
    if image["engine_runs"]:
        pid1 = _run(ENGINE or "podman", "run", "--rm", "--entrypoint", "python3", TAG, "-c", "import os; print(os.getpid(), os.getuid())")  # fmt: skip
        done = _run(ENGINE or "podman", "run", "--rm", "--network", "host", "-e", f"DPONE_CONN_WAREHOUSE={warehouse}", "-v", f"{evidence}:/var/lib/dpone/evidence", TAG, *args)  # fmt: skip
        moved = _digests(warehouse)
        REPORT["run"] = "podman run"
    else:
        with container_root() as root:
            pid1 = _run(*_in_image(root, evidence, {}, "/opt/dpone/venv/bin/python", "-c", "'import os; print(os.getpid(), os.getuid())'"))  # fmt: skip
            done = _run(*_in_image(root, evidence, env, "/opt/dpone/venv/bin/dpone", *args))
            moved = _digests(warehouse)
            REPORT["signals"] = {
                name: _signal_pid1(root, evidence, env, warehouse, sig, args)
                for name, sig in (("SIGINT", signal.SIGINT), ("SIGTERM", signal.SIGTERM))
            }
        REPORT["run"] = "chroot of the container's root filesystem (container run UNVERIFIED)"
    assert pid1.returncode == 0, pid1.stderr
    assert pid1.stdout.split() == ["1", "10001"], pid1.stdout  # PID 1, the image's user
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert warehouse not in done.stderr
    source, target = moved
    assert source == target and source is not None and source[0] == 18250
    assert list(evidence.rglob("verification.json")), sorted(evidence.rglob("*"))
    if not image["engine_runs"]:
        # both signals reach the PID-1 dpone (explicit handlers): the chunk rolls back, the run
        # ends with 128 + the signal number before the campaign is done
        for name, code in (("SIGINT", 130), ("SIGTERM", 143)):
            stopped = REPORT["signals"][name]
            assert stopped["exit_code"] == code, (name, stopped)
            assert stopped["chunks_committed_of_365"] < 365, (name, stopped)
    target_file = os.environ.get("DPONE_IMAGE_REPORT")
    if target_file:
        Path(target_file).write_text(json.dumps(REPORT, indent=2, default=str) + "\n")
