"""``triton-builder doctor``: what this machine can build and run, said before a build fails.

The complaints users have about tools like ours are mostly about the machine: no engine, a
driver too old for the chosen release, a full disk, a base image that cannot be had. Each check
here reads the real thing and says what to do. One looks back: a build killed with SIGKILL
removes nothing, and its verification container (with the untagged image it runs) would stay
on the engine for good; the doctor finds such leftovers by their owner's labels and, asked to,
removes them (:mod:`builder.engine.leftovers`), with the cache entries such a build left
half-written.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from builder.base.gpu_slim import SLIM_SERVER_CUDA
from builder.base.releases import (
    MINOR_VERSION_DRIVER,
    RELEASES,
    TOOLKIT_DRIVER,
    Release,
    lowest_driver,
    resolve,
    slim_cuda_versions,
    version_key,
)
from builder.cache import cache_dir, remove_stale_staging, stale_scratches, stale_stagings
from builder.engine.ownership import BUILD_LABEL

MIN_FREE_GB = 10


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    """``ok``, ``warn`` or ``fail``."""
    detail: str


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi --query-gpu=name,driver_version --format=csv,noheader`` lists it."""

    name: str
    driver: str

    @property
    def driver_branch(self) -> int:
        return int(self.driver.split(".")[0])


def run_checks(cuda: str | None = "cpu", environment: str | Path | None = None,
               slim: bool = False, *, remove_leftovers: bool = False) -> list[Check]:
    """Every check, for a build targeting ``cuda`` (``"cpu"`` for the CPU base; with ``slim``
    the slim GPU route).

    ``environment`` is a packed environment (``.tar.gz``) whose CUDA runtime is held against
    this machine's driver and the release's minimum. ``remove_leftovers`` removes what killed
    builds left (:func:`leftovers_check`).
    """
    try:
        release = resolve(cuda, slim=slim)
    except ValueError as error:
        return [Check("release", "fail", str(error))]
    checks = [Check("release", "ok", release.describe())]
    if release.slim:
        checks.append(slim_route_check(release))
    client, engine = _engine()
    checks.append(engine)
    info = client.info() if client is not None else {}
    gpus, smi_problem = _query_gpus()
    checks.append(container_runtime_check(release, info, shutil.which(NVIDIA_HOOK)))
    checks.append(driver_check(release, gpus, smi_problem))
    if environment is not None:
        from builder.environment.archive_check import archive_cuda_runtime

        runtime = archive_cuda_runtime(environment)
        checks.append(environment_cuda_check(release, gpus, runtime.cuda if runtime else None,
                                             f"{Path(environment).name}"
                                             + (f" ({runtime.distribution})" if runtime else "")))
    elif release.gpu:
        checks.append(_chosen_torch_check(release, gpus))
    checks.append(_disk(client))
    checks.append(cache_stagings_check(remove=remove_leftovers))
    if client is not None:
        checks.append(_base_image(client, release))
        checks.append(leftovers_check(client, remove=remove_leftovers))
        checks.append(weights_cache_check(client))
    return checks


def weights_cache_check(client) -> Check:
    """The node's weights cache (the volume that ``serve`` and ``deploy swarm`` mount for
    images whose weights travel beside them): the files no image on this engine names in its
    lock (:data:`~builder.image.labels.WEIGHTS_LABEL`) — old models' weights, safe to remove
    once no other node's image needs them."""
    import docker.errors

    from builder.image.labels import WEIGHTS_LABEL
    from builder.runtime.supervisor.weights_lock import CACHE_VOLUME, unnamed_blobs

    try:
        volume = client.volumes.get(CACHE_VOLUME)
    except docker.errors.NotFound:
        return Check("weights cache", "ok", f"no weights cache (volume {CACHE_VOLUME}) here")
    root = Path(volume.attrs.get("Mountpoint") or "")
    named = {digest for image in client.images.list(filters={"label": WEIGHTS_LABEL})
             for digest in (image.labels or {}).get(WEIGHTS_LABEL, "").split(",") if digest}
    try:
        stray = unnamed_blobs(root, named)
    except OSError as error:
        return Check("weights cache", "warn", f"cannot read the volume {CACHE_VOLUME} at "
                     f"{root}: {error.strerror}")
    if not stray:
        return Check("weights cache", "ok", f"every file of {CACHE_VOLUME} is named by an "
                     f"image's weights lock here ({len(named)} digests)")
    size = sum(path.stat().st_size for path in stray)
    return Check("weights cache", "warn", f"{len(stray)} file(s) of {CACHE_VOLUME} "
                 f"({size / 1e6:.1f} MB) that no image here names: "
                 + ", ".join(f"sha256:{path.name}" for path in stray)
                 + f" (in {root / 'blobs' / 'sha256'})")


def leftovers_check(client, *, remove: bool = False) -> Check:
    """Containers of builds whose process is gone (killed outright: nothing cleaned up), with
    the untagged images they ran; ``remove`` removes them. A container of a build still
    running, here or from another host, is never one."""
    from builder.engine.leftovers import find_orphans, remove_orphans
    from builder.verify.verification import VERIFICATION_LABEL

    orphans = find_orphans(client)
    unowned = [c for c in client.api.containers(all=True, filters={"label": VERIFICATION_LABEL})
               if BUILD_LABEL not in (c.get("Labels") or {})]
    older = (f"; {len(unowned)} verification container(s) record no builder (an older "
             f"triton-builder made them: whether their build still runs cannot be told), "
             f"left alone" if unowned else "")
    if not orphans:
        return Check("leftovers", "ok", f"no container of a killed build{older}")
    listed = "; ".join(orphan.describe() for orphan in orphans)
    if remove:
        containers, images = remove_orphans(client, orphans)
        return Check("leftovers", "ok", f"removed {containers} container(s) and {images} "
                     f"untagged image(s) of killed builds: {listed}{older}")
    return Check("leftovers", "warn", f"{len(orphans)} container(s) of killed builds: {listed}. "
                 f"triton-builder doctor --remove-leftovers removes them{older}")


def cache_stagings_check(*, remove: bool = False) -> Check:
    """What builds killed outright left on the disk: half-written cache entries
    (:mod:`builder.cache`'s stagings; the next build of the same entry removes its own, but one
    never built again stays) and builds' working directories (the next build removes them);
    ``remove`` removes them all. A staging a running build holds is never one."""
    entries, scratches = stale_stagings(), stale_scratches()
    if not entries and not scratches:
        return Check("cache", "ok", f"no half-written entry of a killed build in {cache_dir()}, "
                     f"no working directory of one in {tempfile.gettempdir()}")
    parts = []
    for stale, one, many in ((entries, "half-written entry", "half-written entries"),
                             (scratches, "working directory", "working directories")):
        if stale:
            size = sum(file.stat().st_size for path in stale for file in path.rglob("*")
                       if file.is_file() and not file.is_symlink())
            parts.append(f"{len(stale)} {one if len(stale) == 1 else many} of killed builds "
                         f"({size / 2**20:.0f} MiB): " + ", ".join(str(path) for path in stale))
    listed = "; ".join(parts)
    if remove:
        for path in entries + scratches:
            remove_stale_staging(path)
        return Check("cache", "ok", f"removed {listed}")
    return Check("cache", "warn", f"{listed}. triton-builder doctor --remove-leftovers removes "
                 f"them")


NVIDIA_HOOK = "nvidia-container-runtime-hook"
"""What ``docker run --gpus`` calls (NVIDIA Container Toolkit); dockerd finds it on its PATH."""


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=name,driver_version --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, driver = line.rpartition(",")
        if not name or not driver.strip()[:1].isdigit():
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        gpus.append(Gpu(name.strip(), driver.strip()))
    return gpus


def container_runtime_check(release: Release, docker_info: dict, hook: str | None) -> Check:
    """Can this engine give containers GPUs (``--gpus``/``device_requests``)?"""
    runtimes = sorted((docker_info.get("Runtimes") or {}).keys())
    if "nvidia" in runtimes or hook:
        via = "the engine's nvidia runtime" if "nvidia" in runtimes else hook
        return Check("nvidia container runtime", "ok",
                     f"containers get GPUs through {via}; verification runs GPU models on GPUs")
    status = "warn" if release.gpu else "ok"
    what = (f"images for {release.release} are verified on the CPU here (GPU placement not "
            f"exercised); install the NVIDIA Container Toolkit to verify on GPUs"
            if release.gpu else "not needed for the CPU base")
    return Check("nvidia container runtime", status,
                 f"none (engine runtimes: {', '.join(runtimes) or 'none'}; no {NVIDIA_HOOK} on "
                 f"PATH): {what}")


def driver_check(release: Release, gpus: list[Gpu], problem: str | None = None) -> Check:
    """This machine's driver against the release's minimum."""
    if not release.gpu:
        return Check("gpu driver", "ok", "not needed: the CPU base runs without GPUs")
    if problem is not None or not gpus:
        return Check("gpu driver", "warn",
                     f"{problem or 'no GPU listed'}: images for {release.release} need driver "
                     f">= {release.safe_driver} on the machine that runs them")
    gpu = min(gpus, key=lambda g: g.driver_branch)
    if gpu.driver_branch < (release.min_driver or 0) and release.slim:
        return Check("gpu driver", "fail",
                     f"{gpu.name} with driver {gpu.driver}; the slim GPU route needs >= "
                     f"{release.min_driver} (its server's CUDA {SLIM_SERVER_CUDA} runtime and "
                     f"the CUDA {release.cuda} environment, by minor version compatibility): "
                     f"{ngc_route_for(gpu.driver_branch)}")
    if gpu.driver_branch < (release.min_driver or 0):
        return Check("gpu driver", "fail",
                     f"{gpu.name} with driver {gpu.driver}; {release.release} needs >= "
                     f"{release.min_driver} (or pick an older --cuda)")
    if release.slim and gpu.driver_branch < (release.safe_driver or 0):
        return Check("gpu driver", "warn",
                     f"{gpu.name} with driver {gpu.driver}: runs the slim GPU route by minor "
                     f"version compatibility (>= {release.min_driver}); CUDA {release.cuda} "
                     f"itself asks for >= {release.safe_driver} (PTX for newer GPUs would not "
                     f"JIT)")
    if release.safe_driver and gpu.driver_branch < release.safe_driver:
        return Check("gpu driver", "warn",
                     f"{gpu.name} with driver {gpu.driver}: the {release.release} release notes "
                     f"ask for >= {release.min_driver}, CUDA {release.cuda} itself for >= "
                     f"{release.safe_driver}")
    return Check("gpu driver", "ok", f"{gpu.name} with driver {gpu.driver} (>= "
                 f"{release.safe_driver} for {release.release})")


def slim_route_check(release: Release) -> Check:
    """What the slim GPU route serves, and on which drivers (no NGC image involved)."""
    return Check("slim gpu route", "ok",
                 f"Triton {release.triton_version} from nvidia-pytriton links CUDA "
                 f"{SLIM_SERVER_CUDA}'s runtime (driver >= {lowest_driver(SLIM_SERVER_CUDA)}); "
                 f"the route serves CUDA {', '.join(slim_cuda_versions())}, CUDA "
                 f"{release.cuda} on drivers >= {release.min_driver}; older CUDA versions "
                 f"take the NGC route (--cuda without --slim)")


def ngc_route_for(driver_branch: int) -> str:
    """The way out for a driver older than the slim route needs: the NGC release of the newest
    CUDA whose release runs on it, if any."""
    fitting = [r for r in RELEASES if not r.known_issue and (r.min_driver or 0) <= driver_branch]
    if not fitting:
        return f"update the driver (no NGC release runs on driver {driver_branch} either)"
    newest = max(fitting, key=lambda r: version_key(r.release))
    return (f"update the driver, or use the NGC route for a CUDA this driver runs: --cuda "
            f"{newest.cuda} without --slim ({newest.release} needs >= {newest.min_driver})")


def environment_cuda_check(release: Release, gpus: list[Gpu], runtime: str | None,
                           what: str) -> Check:
    """An environment's CUDA runtime against the release's minimum driver and this machine's."""
    if runtime is None:
        return Check("environment cuda", "ok", f"{what} carries no CUDA runtime (CPU packages)")
    if not release.gpu:
        return Check("environment cuda", "warn",
                     f"{what} carries CUDA runtime {runtime}, unused on the CPU base")
    problem = release.cuda_runtime_problem(runtime)
    if problem:
        return Check("environment cuda", "fail", f"{what}: {problem}")
    if not gpus:
        return Check("environment cuda", "ok",
                     f"{what} carries CUDA runtime {runtime}, which {release.release}'s minimum "
                     f"driver runs (no GPU here to check this machine's driver)")
    major, minor = runtime.split(".")[:2]
    full = TOOLKIT_DRIVER.get(f"{major}.{minor}")
    compatible = MINOR_VERSION_DRIVER.get(major)
    gpu = min(gpus, key=lambda g: g.driver_branch)
    if full is not None and gpu.driver_branch >= full:
        return Check("environment cuda", "ok",
                     f"{what}: CUDA runtime {runtime} runs on driver {gpu.driver} (>= {full})")
    if compatible is not None and gpu.driver_branch >= compatible:
        return Check("environment cuda", "ok",
                     f"{what}: CUDA runtime {runtime} runs on driver {gpu.driver} by minor "
                     f"version compatibility (>= {compatible}; PTX compiled for newer GPUs "
                     f"would not JIT)")
    return Check("environment cuda", "fail",
                 f"{what}: CUDA runtime {runtime} needs driver >= {compatible or full}, this "
                 f"machine has {gpu.driver} ({gpu.name})")


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


def _chosen_torch_check(release: Release, gpus: list[Gpu]) -> Check:
    """The torch a build for ``release`` would put in the environment, against the drivers.

    The environment's Python is the one the build's own plan gives (:func:`plan_python`): the
    release's where it is the builder's, the builder's where the build bridges — a 3.11 build
    on 22.12 (Python 3.8) carries a 3.11 torch, not the one 3.8 would get.
    """
    from builder.bridge import plan_python
    from builder.environment.spec import requirements_spec
    from builder.environment.target import platform_tags
    from builder.environment.torch_for_cuda import resolve_cuda_packages
    from builder.errors import TritonBuilderError

    try:
        plan = plan_python(release, conda=False)
        resolution = resolve_cuda_packages(
            requirements_spec(["torch"], "doctor"), release,
            python_version=plan.python_version,
            platforms=platform_tags(release.glibc, "x86_64"))
    except TritonBuilderError as error:
        return Check("environment cuda", "warn", f"could not tell which torch a build would "
                     f"choose: {error}")
    (choice,) = resolution.choices
    route = "bridged" if plan.bridged else "native"
    return environment_cuda_check(
        release, gpus, choice.cuda, f"torch a build would choose ({choice.requirement}, "
        f"{choice.wheel}) for Python {plan.python_version} ({route})")


def _query_gpus() -> tuple[list[Gpu], str | None]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "no nvidia-smi here"
    try:
        found = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [], f"nvidia-smi failed: {error}"
    if found.returncode != 0:
        return [], f"nvidia-smi failed: {(found.stderr or found.stdout).strip()}"
    try:
        return parse_nvidia_smi(found.stdout), None
    except ValueError as error:
        return [], str(error)


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
    if release.slim:
        return Check("base image", "ok", f"{release.image} will be built on first use from "
                     f"the nvidia-pytriton wheel (PyPI) and the OS image")
    return Check("base image", "warn", f"{release.image} is not on this engine: the first "
                 f"build pulls it (needs access to nvcr.io)")


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path
