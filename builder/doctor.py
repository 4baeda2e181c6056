"""``triton-builder doctor``: what this machine can build and run, said before a build fails.

The complaints users have about tools like ours are mostly about the machine: no engine, a
driver too old for the chosen release, a full disk, a base image that cannot be had. Each check
here reads the real thing and says what to do.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from builder.base.releases import Release, resolve
from builder.cache import cache_dir

MIN_FREE_GB = 10


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    """``ok``, ``warn`` or ``fail``."""
    detail: str


def run_checks(cuda: str | None = "cpu") -> list[Check]:
    """Every check, for a build targeting ``cuda`` (``"cpu"`` for the CPU base)."""
    try:
        release = resolve(cuda)
    except ValueError as error:
        return [Check("release", "fail", str(error))]
    checks = [Check("release", "ok", release.describe())]
    client, engine = _engine()
    checks.append(engine)
    checks.append(_driver(release))
    checks.append(_disk(client))
    if client is not None:
        checks.append(_base_image(client, release))
    return checks


def _engine():
    from builder.engine import EngineError, docker_client

    try:
        client = docker_client(timeout=10)
    except EngineError as error:
        return None, Check("docker engine", "fail",
                           f"{error}. Install Docker (Debian: apt-get install docker.io) and "
                           f"start dockerd, or set DOCKER_HOST")
    version = client.version()
    runtimes = sorted((client.info().get("Runtimes") or {}).keys())
    return client, Check("docker engine", "ok",
                         f"{version.get('Version')} (API {version.get('ApiVersion')}), "
                         f"runtimes: {', '.join(runtimes) or 'none listed'}")


def _driver(release: Release) -> Check:
    if not release.gpu:
        return Check("gpu driver", "ok", "not needed: the CPU base runs without GPUs")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Check("gpu driver", "warn",
                     f"no nvidia-smi here: images for {release.release} need driver "
                     f">= {release.safe_driver} on the machine that runs them")
    found = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
    if found.returncode != 0 or not found.stdout.strip():
        return Check("gpu driver", "fail", f"nvidia-smi failed: {found.stderr.strip()}")
    name, driver = (part.strip() for part in found.stdout.splitlines()[0].split(",", 1))
    major = int(driver.split(".")[0])
    if release.safe_driver and major < release.safe_driver:
        return Check("gpu driver", "fail",
                     f"{name} with driver {driver}; {release.release} needs >= "
                     f"{release.safe_driver} (or pick an older --cuda)")
    return Check("gpu driver", "ok", f"{name} with driver {driver}")


def _disk(client) -> Check:
    roots = [cache_dir()]
    if client is not None:
        roots.append(Path(client.info().get("DockerRootDir") or "/var/lib/docker"))
    worst = min(roots, key=lambda p: shutil.disk_usage(_existing(p)).free)
    free_gb = shutil.disk_usage(_existing(worst)).free / 2**30
    status = "ok" if free_gb >= MIN_FREE_GB else "warn"
    return Check("disk", status, f"{free_gb:.0f} GiB free under {worst} "
                 f"(images and environments want >= {MIN_FREE_GB} GiB)")


def _base_image(client, release: Release) -> Check:
    import docker.errors

    try:
        client.images.get(release.image)
        return Check("base image", "ok", f"{release.image} is on this engine")
    except docker.errors.ImageNotFound:
        pass
    if not release.gpu:
        return Check("base image", "ok", f"{release.image} will be built on first use "
                     f"(triton-builder base cpu)")
    return Check("base image", "warn", f"{release.image} is not on this engine: the first "
                 f"build pulls it (needs access to nvcr.io)")


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path
