"""Packages built per CUDA version (torch first), resolved for the release the image runs on.

An environment's pins come from the machine that built the pipeline, and PyPI's Linux torch
follows whatever CUDA PyTorch moved to last (CUDA 13 now, driver 580): on a CUDA 12.4 image
such a torch would never see the GPU. So before an environment is made, each ``torch``
requirement is replaced by a build for the release's CUDA major.minor (a CPU build for the CPU
base), chosen from the wheels' own metadata:

1. PyTorch's per-CUDA index (``<pytorch_index>/cu124``; ``cu118 cu121 cu124 cu126 cu128
   cu130`` — the newest one not newer than the release's CUDA, of its major), pinned with its
   local label (``torch==2.6.0+cu124``) and added as an extra index;
2. where that index cannot be reached: the newest torch on the package index (PyPI) whose
   manylinux wheel for the image's Python requires that CUDA runtime (``nvidia-cuda-runtime-cu12
   ==12.4.127``) or an older one of the same major; failing that, one that the release's driver
   runs through minor version compatibility. For the CPU base: what pip's own configuration
   resolves (find-links, mirrors), accepted only if its metadata requires no CUDA runtime.

``torchvision``/``torchaudio`` pins are loosened so pip picks the builds matching the chosen
torch; ``nvidia-*-cuXX`` requirements of another CUDA major are refused. On a GPU release an
``onnxruntime-gpu`` requirement (the slim GPU route's ONNX operators) becomes the newest build for
the release's CUDA, with the CUDA libraries it loads (:mod:`.onnxruntime_gpu`), and replaces
any ``onnxruntime``. Every choice says what
was chosen and why (:attr:`CudaChoice.reason`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.base.releases import Release, version_key
from builder.environment.errors import IndexUnreachableError, SpecError
from builder.environment.index import PackageIndex
from builder.environment.spec import EnvironmentSpec
from builder.environment.torch_for_cuda.onnxruntime_gpu import (
    CUDA_LIBRARIES_SOURCE,
    ONNXRUNTIME,
    ONNXRUNTIME_GPU,
    choose_onnxruntime_gpu,
    cuda_toolkit_requirement,
)
from builder.environment.torch_for_cuda.wheel_metadata import (
    WheelFile,
    compatible_wheels,
    list_wheels,
    local_metadata,
    marker_environment,
    read_metadata,
    ssl_context,
)
from builder.progress import Log

PYTORCH_INDEX = "https://download.pytorch.org/whl"
"""PyTorch's wheel indexes, one per CUDA (``/cu124``) and ``/cpu``; ``pytorch_index=`` overrides."""
PYTORCH_CUDA_INDEXES = ("11.8", "12.1", "12.4", "12.6", "12.8", "13.0")
PYPI_SIMPLE = "https://pypi.org/simple"
TORCH = "torch"
TORCH_COMPANIONS = ("torchvision", "torchaudio")
PICKLE_SOURCE = "pipe.pickle (the versions it was written with)"
"""Origin of pins taken from the building machine: these may change to fit the target."""
PYTHON_MODEL_SOURCE = "python-format model operators"
"""Origin of the torch pin of ``python``-format model operators: their modules are pickled with
the building machine's torch, and a pickle of torch modules is not read across torch versions
reliably, so this pin never changes to fit the target."""

_PER_CUDA = re.compile(r"^nvidia-[a-z0-9-]+-cu(\d+)$")
_RUNTIME = re.compile(r"^nvidia-cuda-runtime-cu(\d+)$")
_LOCAL_CUDA = re.compile(r"^cu(\d+)(\d)$")


@dataclass(frozen=True)
class WheelCuda:
    """What a wheel's metadata says about CUDA: the runtime ``X.Y`` (None: a CPU build)."""

    cuda: str | None
    evidence: str


@dataclass(frozen=True)
class CudaChoice:
    """The build chosen for one package, and why."""

    package: str
    requirement: str
    """What goes into the environment, e.g. ``torch==2.6.0+cu124``."""
    wheel: str
    cuda: str | None
    evidence: str
    reason: str
    metadata: str = field(default="", compare=False, repr=False)
    """The chosen wheel's ``METADATA`` (its requirements), where it was read."""

    def describe(self) -> str:
        built = f"CUDA {self.cuda}" if self.cuda else "the CPU"
        return (f"{self.requirement}: {self.wheel} is built for {built} ({self.evidence}); "
                f"{self.reason}")


@dataclass(frozen=True)
class CudaResolution:
    """The spec with per-CUDA packages resolved, the index that serves them, the choices."""

    spec: EnvironmentSpec
    index: PackageIndex
    choices: tuple[CudaChoice, ...]


def wheel_cuda(metadata: str, python_version: str, machine: str = "x86_64") -> WheelCuda:
    """The CUDA runtime a wheel requires on Linux, read from its ``METADATA`` text."""
    message = Parser().parsestr(metadata)
    environment = marker_environment(python_version, machine)
    for line in message.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        pinned = [s.version for s in requirement.specifier if s.operator in ("==", "===")]
        if not pinned:
            continue
        if _RUNTIME.match(name) or (name == "cuda-toolkit" and "cudart" in requirement.extras):
            return WheelCuda(".".join(pinned[0].split(".")[:2]), f"requires {name}=={pinned[0]}")
    local = Version(message.get("Version", "0")).local or ""
    found = _LOCAL_CUDA.match(local)
    if found:
        return WheelCuda(f"{found.group(1)}.{found.group(2)}", f"version label +{local}")
    return WheelCuda(None, "requires no CUDA runtime")


def pytorch_index_cuda(release: Release) -> str | None:
    """The CUDA of PyTorch's index for ``release``: the newest not newer than its CUDA, of its
    major (an older release of the major takes the oldest index, run by minor version
    compatibility); None for the CPU base."""
    if not release.gpu or release.cuda is None:
        return None
    major, minor = (int(p) for p in release.cuda.split("."))
    same_major = [c for c in PYTORCH_CUDA_INDEXES if int(c.split(".")[0]) == major]
    older = [c for c in same_major if int(c.split(".")[1]) <= minor]
    if older:
        return older[-1]
    return same_major[0] if same_major else None


def resolve_cuda_packages(
    spec: EnvironmentSpec,
    release: Release,
    *,
    python_version: str,
    platforms: Sequence[str],
    index: PackageIndex | None = None,
    pytorch_index: str | None = PYTORCH_INDEX,
    on_log: Log | None = None,
) -> CudaResolution:
    """Resolve ``spec``'s per-CUDA packages for ``release``; see the module's docstring.

    ``platforms`` are the wheel platform tags the image runs
    (:meth:`~builder.environment.target.EnvironmentTarget.platform_tags`); ``pytorch_index``
    ``None`` skips PyTorch's index. Raises :class:`SpecError` naming the requirement when no
    build fits.
    """
    index = index or PackageIndex()
    log = on_log or (lambda line: None)
    requirements = list(spec.requirements)
    origins: dict[str, tuple[str, ...]] = {}  # rewritten requirements: origin, and why
    choices: list[CudaChoice] = []
    extra_indexes: list[str] = []
    for line in spec.requirements:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        found = _PER_CUDA.match(name)
        if found and release.gpu and release.cuda and found.group(1) != release.cuda.split(".")[0]:
            raise SpecError(
                f"{line!r} ({spec.where(line)}) is built for CUDA {found.group(1)}, but "
                f"{release.describe()} is CUDA {release.cuda}: require the "
                f"-cu{release.cuda.split('.')[0]} package instead")
        if name == ONNXRUNTIME_GPU and release.gpu:
            chosen, wheel, cuda, evidence = choose_onnxruntime_gpu(
                requirement, release, python_version, platforms, index, spec.where(line))
            choice = CudaChoice(ONNXRUNTIME_GPU, chosen, wheel, cuda, evidence,
                                f"the newest onnxruntime-gpu whose CUDA runtime requirement "
                                f"admits CUDA {release.cuda}")
            choices.append(choice)
            _replace(requirements, origins, line, chosen,
                     f"{spec.where(line)}; chosen for {_target_words(release)}")
            log(f"onnxruntime-gpu for {_target_words(release)}: {choice.describe()}")
            continue
        if name in TORCH_COMPANIONS and requirement.specifier:
            loose = _without_specifier(requirement)
            _replace(requirements, origins, line, loose,
                     f"{spec.where(line)}; pin dropped so pip picks the build matching torch")
            log(f"{line} -> {loose}: pip picks the build that matches the chosen torch")
        if name != TORCH:
            continue
        relaxable = set(spec.origins.get(line, ())) <= {PICKLE_SOURCE}
        try:
            choice, extra = _choose_torch(requirement, release, python_version, platforms,
                                          index, pytorch_index, relaxable, spec.where(line))
        except SpecError as error:
            if PYTHON_MODEL_SOURCE not in spec.origins.get(line, ()):
                raise
            raise SpecError(
                f"{error}\nThe python-format model operators are pickled with the torch of the "
                f"building machine ({requirement}), so the environment needs that torch built "
                f"for {_target_words(release)}. Build where a torch with such a build is "
                f"installed (pip install torch==<a version that has one>), make the operators "
                f"export to ONNX or TorchScript, or choose a CUDA version that "
                f"{requirement} is built for.") from None
        choices.append(choice)
        if extra and extra not in extra_indexes:
            extra_indexes.append(extra)
        _replace(requirements, origins, line, choice.requirement,
                 f"{spec.where(line)}; chosen for {_target_words(release)}")
        log(f"torch for {_target_words(release)}: {choice.describe()}")
    if any(choice.package == ONNXRUNTIME_GPU for choice in choices):
        _one_onnxruntime(requirements, origins, log)
        if not any(choice.package == TORCH for choice in choices):
            pinned = cuda_toolkit_requirement(release)
            requirements.append(pinned)
            origins[pinned] = (CUDA_LIBRARIES_SOURCE,)
            log(f"{pinned}: {CUDA_LIBRARIES_SOURCE} (NVIDIA's meta-package of CUDA "
                f"{release.cuda}'s libraries)")
            cudnn = _torchs_cudnn(release, python_version, platforms, index, pytorch_index,
                                  log)
            if cudnn is not None:
                requirements.append(cudnn)
                origins[cudnn] = (CUDA_LIBRARIES_SOURCE,)
    if not choices and not extra_indexes and requirements == list(spec.requirements):
        return CudaResolution(spec, index, ())
    kept = {line: spec.origins.get(line, ()) for line in requirements if line not in origins}
    resolved = replace(spec, requirements=tuple(requirements), origins={**kept, **origins})
    if extra_indexes:
        index = replace(index, extra_index_urls=(*index.extra_index_urls, *extra_indexes))
    return CudaResolution(resolved, index, tuple(choices))


def _torchs_cudnn(release: Release, python_version: str, platforms: Sequence[str],
                  index: PackageIndex, pytorch_index: str | None, log: Log) -> str | None:
    """The cuDNN that torch's build for ``release``'s CUDA requires (its wheel's metadata), for
    an environment without torch: onnxruntime-gpu takes any cuDNN 9 of the CUDA major, and pip
    would take the newest (9.28 for CUDA 12: 1.16 GB installed, against 0.88 GB for the 9.5 that
    torch's CUDA 12.6 build pins); this one is the cuDNN of that CUDA's time, and the one a torch
    image of the same CUDA carries. None (pip's choice) where no torch build is found."""
    try:
        choice, _ = _choose_torch(Requirement(TORCH), release, python_version, platforms,
                                  index, pytorch_index, True, CUDA_LIBRARIES_SOURCE)
    except SpecError as error:
        log(f"cuDNN left to pip: no torch build for CUDA {release.cuda} to take it from "
            f"({str(error).splitlines()[0]})")
        return None
    environment = marker_environment(python_version, release.platform.machine)
    for line in Parser().parsestr(choice.metadata).get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        pins = [s.version for s in requirement.specifier if s.operator == "=="]
        if (re.match(r"^nvidia-cudnn-cu\d+$", canonicalize_name(requirement.name)) and pins
                and (requirement.marker is None or requirement.marker.evaluate(environment))):
            pinned = f"{canonicalize_name(requirement.name)}=={pins[0]}"
            log(f"{pinned}: the cuDNN of {choice.requirement} ({choice.wheel}), torch's build "
                f"for CUDA {release.cuda}")
            return pinned
    log(f"cuDNN left to pip: {choice.wheel} names no cuDNN pin")
    return None


def _one_onnxruntime(requirements: list[str], origins: dict[str, tuple[str, ...]],
                     log: Log) -> None:
    """Drop ``onnxruntime`` where ``onnxruntime-gpu`` is chosen: both install the same
    ``onnxruntime`` package, and the GPU build runs on the CPU too."""
    for line in list(requirements):
        if canonicalize_name(Requirement(line).name) == ONNXRUNTIME:
            requirements.remove(line)
            origins.pop(line, None)
            log(f"{line} dropped: onnxruntime-gpu provides the same package, CPU included")


def _choose_torch(requirement: Requirement, release: Release, python_version: str,
                  platforms: Sequence[str], index: PackageIndex, pytorch_index: str | None,
                  relaxable: bool, where: str) -> tuple[CudaChoice, str | None]:
    context = ssl_context(index.ca_bundle)
    label = pytorch_index_cuda(release)
    if pytorch_index:
        flavour = f"cu{label.replace('.', '')}" if label else "cpu"
        url = f"{pytorch_index.rstrip('/')}/{flavour}"
        try:
            wheels = compatible_wheels(list_wheels(url, TORCH, context=context), python_version,
                                 platforms)
        except IndexUnreachableError as error:
            unreachable = f"{url} could not be reached ({error})"
        else:
            return _from_pytorch_index(requirement, release, wheels, url, python_version,
                                       relaxable, where, context), url
    else:
        unreachable = "PyTorch's index is turned off (pytorch_index=None)"
    if not release.gpu:
        return _cpu_from_pip(requirement, python_version, platforms, index, unreachable), None
    return _from_package_index(requirement, release, python_version, platforms, index,
                               relaxable, where, unreachable, context), None


def _from_pytorch_index(requirement: Requirement, release: Release, wheels: list[WheelFile],
                        url: str, python_version: str, relaxable: bool, where: str,
                        context) -> CudaChoice:
    matching = [w for w in wheels if requirement.specifier.contains(w.version.public,
                                                                    prereleases=False)]
    reason = f"newest on {url} for Python {python_version}"
    if not matching and relaxable and wheels:
        matching = wheels
        reason += (f" ({requirement} from the building machine has no build there; the "
                   f"served pipeline gets a warning about the version difference)")
    if not matching:
        raise SpecError(f"{requirement} ({where}): {url} has no wheel of it for Python "
                        f"{python_version}; loosen the pin or pick another release")
    wheel = max(matching, key=lambda w: w.version)
    metadata, how = read_metadata(wheel, context=context)
    built = wheel_cuda(metadata, python_version)
    _refuse_mismatch(requirement, release, wheel, built, where)
    return CudaChoice(TORCH, f"torch=={wheel.version}", wheel.filename, built.cuda,
                      f"{built.evidence}, from {how}", reason, metadata)


def _from_package_index(requirement: Requirement, release: Release, python_version: str,
                        platforms: Sequence[str], index: PackageIndex, relaxable: bool,
                        where: str, unreachable: str, context) -> CudaChoice:
    simple = index.index_url or PYPI_SIMPLE
    try:
        wheels = compatible_wheels(list_wheels(simple, TORCH, context=context), python_version,
                             platforms)
    except IndexUnreachableError as error:
        raise SpecError(f"{requirement} ({where}): {unreachable}, and {simple} could not be "
                        f"reached either ({error}): no torch can be chosen for CUDA "
                        f"{release.cuda}") from error
    by_version: dict[Version, WheelFile] = {}
    for wheel in sorted(wheels, key=lambda w: _platform_rank(w, platforms)):
        by_version.setdefault(wheel.version, wheel)
    versions = sorted(by_version)
    wanted = [v for v in versions if requirement.specifier.contains(v, prereleases=False)]
    relaxed = False
    if not wanted and relaxable:
        wanted, relaxed = [v for v in versions if not v.is_prerelease], True
    cache: dict[Version, WheelCuda] = {}
    texts: dict[Version, str] = {}

    def cuda_of(version: Version) -> WheelCuda:
        if version not in cache:
            metadata, how = read_metadata(by_version[version], context=context)
            texts[version] = metadata
            found = wheel_cuda(metadata, python_version)
            cache[version] = WheelCuda(found.cuda, f"{found.evidence}, from {how}")
        return cache[version]

    own = version_key(str(release.cuda))[:2]
    chosen = _newest_fitting(wanted, own, cuda_of)
    how_chosen = f"newest torch on {simple} built for CUDA {release.cuda} or older of CUDA {own[0]}"
    if chosen is None and relaxable and not relaxed:
        wanted = [v for v in versions if not v.is_prerelease]
        relaxed = True
        chosen = _newest_fitting(wanted, own, cuda_of)
    if chosen is None:
        chosen = next((v for v in reversed(wanted) if (wheel_runtime := cuda_of(v).cuda) and
                       release.cuda_runtime_problem(wheel_runtime) is None), None)
        how_chosen = (f"newest torch on {simple} whose CUDA runtime the release's driver "
                      f"(>= {release.min_driver}) runs by minor version compatibility")
    if chosen is None:
        seen = ", ".join(f"{v}: CUDA {c.cuda or 'none'}" for v, c in sorted(cache.items()))
        raise SpecError(
            f"{requirement} ({where}): no matching torch on {simple} for Python "
            f"{python_version} requires a CUDA runtime that {release.release} (CUDA "
            f"{release.cuda}, driver >= {release.min_driver}) runs (read: {seen}); "
            f"{unreachable}: make PyTorch's index reachable or pass its mirror as pytorch_index")
    built = cuda_of(chosen)
    reason = f"{unreachable}; {how_chosen}"
    if relaxed:
        reason += f" ({requirement} from the building machine has no such build)"
    return CudaChoice(TORCH, exact_pin(TORCH, chosen), by_version[chosen].filename,
                      built.cuda, built.evidence, reason, texts.get(chosen, ""))


def exact_pin(name: str, version: Version) -> str:
    """``name===version`` for a public version, ``name==version`` for a local one.

    ``torch==2.13.0`` admits ``2.13.0+cpu`` (a public specifier matches every local label of
    its version, PEP 440), which pip then prefers from a ``find-links`` directory: on a machine
    whose wheelhouse holds the CPU build, the environment chosen for CUDA 13.0 got it (found by
    the slim GPU route's torch-operator build here). Arbitrary equality admits only the build
    chosen.
    """
    return f"{name}=={version}" if version.local else f"{name}==={version}"


def _cpu_from_pip(requirement: Requirement, python_version: str, platforms: Sequence[str],
                  index: PackageIndex, unreachable: str) -> CudaChoice:
    """What pip's configuration resolves for the CPU base, checked to need no CUDA."""
    with tempfile.TemporaryDirectory(prefix="triton-builder-torch-") as directory:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--implementation", "cp", "--python-version", python_version,
                   *(a for tag in platforms for a in ("--platform", tag)), "--dest", directory,
                   "--progress-bar", "off", "--disable-pip-version-check",
                   *index.pip_arguments(), str(requirement)]
        result = subprocess.run(command, capture_output=True, text=True,
                                env={**os.environ, **index.environment()})
        wheels = sorted(Path(directory).glob("torch-*.whl"))
        if result.returncode != 0 or not wheels:
            raise SpecError(f"{requirement}: {unreachable}, and pip could not download a torch "
                            f"wheel for Python {python_version}:\n"
                            f"{(result.stdout + result.stderr)[-3000:]}")
        wheel = wheels[0]
        built = wheel_cuda(local_metadata(wheel), python_version)
    if built.cuda is not None:
        raise SpecError(
            f"{requirement}: the CPU base needs a CPU build of torch, but {unreachable} and "
            f"pip's configuration resolves {wheel.name}, which {built.evidence} (CUDA "
            f"{built.cuda}, gigabytes that cannot be used): make "
            f"{PYTORCH_INDEX}/cpu reachable, or pass a directory of CPU wheels as find_links")
    version = wheel.name.split("-")[1]
    return CudaChoice(TORCH, f"torch=={version}", wheel.name, None,
                      f"{built.evidence}, from the wheel pip download fetched",
                      f"{unreachable}; the CPU build pip's configuration resolves")


def _refuse_mismatch(requirement: Requirement, release: Release, wheel: WheelFile,
                     built: WheelCuda, where: str) -> None:
    if not release.gpu:
        if built.cuda is not None:
            raise SpecError(f"{requirement} ({where}): {wheel.filename} {built.evidence} "
                            f"(CUDA {built.cuda}), not a CPU build, for the CPU base")
        return
    if built.cuda is None:
        raise SpecError(f"{requirement} ({where}): {wheel.filename} is a CPU build "
                        f"({built.evidence}); {release.release} needs a CUDA {release.cuda} one")
    problem = release.cuda_runtime_problem(built.cuda)
    if problem:
        raise SpecError(f"{requirement} ({where}): {wheel.filename} {built.evidence}: {problem}")


def _newest_fitting(versions: list[Version], own: tuple[int, ...],
                    cuda_of: Callable[[Version], WheelCuda]) -> Version | None:
    """The newest version built for CUDA ``own`` or an older minor of its major.

    By bisection: torch's CUDA never goes down as its version goes up (old wheels that bundle
    CUDA declare none, and sort first), so the versions not newer than ``own`` come first and
    only the newest of them can fit.
    """
    low, high, best = 0, len(versions) - 1, None
    while low <= high:
        middle = (low + high) // 2
        cuda = cuda_of(versions[middle]).cuda
        if cuda is None or version_key(cuda)[:2] <= own:
            best, low = versions[middle], middle + 1
        else:
            high = middle - 1
    if best is None:
        return None
    cuda = cuda_of(best).cuda
    return best if cuda is not None and version_key(cuda)[0] == own[0] else None


def _platform_rank(wheel: WheelFile, platforms: Sequence[str]) -> int:
    order = {tag: rank for rank, tag in enumerate(platforms)}
    return min(order.get(t.platform, len(order)) for t in wheel.tags)


def _without_specifier(requirement: Requirement) -> str:
    loose = Requirement(str(requirement))
    loose.specifier = SpecifierSet()
    return str(loose)


def _replace(requirements: list[str], origins: dict[str, tuple[str, ...]], old: str, new: str,
             origin: str) -> None:
    """Put ``new`` where ``old`` was; two requirements that resolve alike become one."""
    position = requirements.index(old)
    if new != old and new in requirements:
        del requirements[position]
    else:
        requirements[position] = new
    origins[new] = (*origins.get(new, ()), origin)


def _target_words(release: Release) -> str:
    return f"CUDA {release.cuda} ({release.release})" if release.gpu else "the CPU base"
