"""Which Triton base image serves a pipeline built for a given CUDA version.

Users say ``cuda='11.8'``; what they need is an ``nvcr.io/nvidia/tritonserver`` release whose CUDA,
Python (the environment tarball must match the python backend stub), Ubuntu and minimum host
driver fit their machines. Mismatches between those are the most common complaint about tools
like ours, so they live in one table (:data:`RELEASES`), and :func:`resolve` is the only way to
pick a base image.

Sources:

* CUDA per release, Triton versions (``YY.MM`` → ``2.X``, X = 7 at 21.02, +1 a month) and
  Ubuntu/Python per release: ``REFERENCE.md`` ("nvcr.io/nvidia/tritonserver releases"), which
  was gathered from the Triton release notes,
  https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/ (rel-YY-MM.html).
* Minimum driver: the "Driver Requirements" paragraph of each release's note, where we read it
  (``driver_source`` ``release-notes``). Where we did not find the note, the value is the CUDA
  toolkit's minimum driver for that CUDA minor (CUDA Toolkit release notes, "CUDA Toolkit and
  Corresponding Driver Versions"; ``cuda-toolkit``) — :attr:`Release.driver_source` says which.
* The notes are not always consistent with the toolkit: 24.03, 24.04 (CUDA 12.4) and 24.06
  (12.5) say 545, 25.03 (12.8) says 560, 25.08 and 25.10 (13.0) say 575, lower than the
  toolkit's 550 / 555 / 570 / 580. We keep what the note says; :attr:`Release.toolkit_driver`
  carries the toolkit's value beside it, and :attr:`Release.safe_driver` is the larger of the two
  (what we tell users to install). Data-center GPUs can run older drivers in forward-compatibility
  mode (each note lists them); we do not model that.
* From 25.01 the containers need compute capability 7.5 or newer (release notes, "GPU
  Requirements"); before, 6.0.
* glibc of each Ubuntu (:data:`UBUNTU_GLIBC`) and Debian suite (:data:`DEBIAN_SUITES`): the
  distributions' ``libc6`` package versions (packages.ubuntu.com, packages.debian.org).
* Which ``nvidia-pytriton`` wheel bundles which Triton and which python backend stubs
  (:data:`PYTRITON_STUBS`): REFERENCE.md ("Another Python than the release's"), read from the
  wheels' ``pytriton/tritonserver/python_backend_stubs/`` directories.
* Which Triton can restrict its administrative APIs to a header (:data:`RESTRICTED_APIS_FROM`):
  the server's ``src/command_line_parser.cc`` per branch, read from triton-inference-server/server:
  ``--grpc-restricted-protocol`` is in r23.04 and later, ``--http-restricted-api`` in r23.11 and
  later (commit 4b481a6f6, "Enabling option to restrict access to HTTP APIs based on header
  value pairs").
* pybind11 of each python_backend branch (:data:`PYBIND11_OF_BRANCH`): ``CMakeLists.txt`` of
  r22.12 (branch v2.10) and r24.10 (v2.10.0) in ``../shared/triton-sources``; r24.11 moved to
  pybind11 2.12 (python_backend PR 384, numpy 2). Newest CPython each pybind11 supports
  (:data:`PYBIND11_NEWEST_PYTHON`): pybind11's changelog (2.10: 3.11; 2.11: 3.12; 2.12 and
  2.13 build 3.13; 3.14 needs pybind11 3). Checked here: r22.12 with 2.13.6 compiles for 3.13.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field, replace
from enum import Enum
from importlib import resources

from builder.base.cpu import cpu_base_tag
from builder.base.gpu_slim import SLIM_SERVER_CUDA, slim_base_tag
from builder.engine.platforms import DEFAULT_PLATFORM, Platform
from builder.errors import TritonBuilderError
from builder.tritonserver.wheel import TRITON_VERSION

NGC_IMAGE = "nvcr.io/nvidia/tritonserver"
CPU_PYTHON = "3.11"

NOTES, TOOLKIT = "release-notes", "cuda-toolkit"
"""The two values of the table's ``driver_source`` column."""

TOOLKIT_DRIVER = {
    "11.4": 470, "11.5": 495, "11.6": 510, "11.7": 515, "11.8": 520, "12.0": 525, "12.1": 530,
    "12.2": 535, "12.3": 545, "12.4": 550, "12.5": 555, "12.6": 560, "12.8": 570, "12.9": 575,
    "13.0": 580,
}
"""Minimum Linux driver branch of each CUDA toolkit minor (CUDA Toolkit release notes)."""

UBUNTU_GLIBC = {"20.04": "2.31", "22.04": "2.35", "24.04": "2.39"}
"""glibc of the Ubuntu releases the NGC images are built on (Ubuntu's libc6 package per release):
the wheel platforms an image runs, known before its image is pulled."""

MINOR_VERSION_DRIVER = {"11": 450, "12": 525, "13": 580}
"""Driver branch from which any CUDA runtime of that major runs ("minor version compatibility",
CUDA Compatibility guide: 11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580)."""

MINOR_VERSION_COMPATIBILITY = "minor-version-compatibility"
"""``driver_source`` of the slim GPU route: its minimum is the lowest driver of
:data:`MINOR_VERSION_DRIVER` that runs both the server's CUDA runtime and the environment's."""

SLIM_SUITE = "bookworm"
"""The Debian of the slim GPU base (``python:X.Y-slim-bookworm`` by default)."""
SLIM_RELEASE = "slim"
""":attr:`Release.release` of the slim GPU route: no NGC release, our base."""
WHEEL_BRANCH = "r24.10"
"""The python_backend branch of the wheel's Triton 2.51 (the CPU and slim GPU bases)."""

RELEASES_FILE = "releases.csv"
"""The release table, one named record a release (``builder/base/releases.csv``; its columns:
release, triton, cuda, python, ubuntu, min_driver, driver_source, known_issue). Triton =
2.(7 + months since 21.02) until 25.06; 25.07 is a patch release (2.59.1), so from 25.08 the
minor runs one behind the month rule (REFERENCE.md: 25.08–25.11 = 2.60–2.63)."""


DEBIAN_SUITES: dict[str, tuple[str, str]] = {
    "bullseye": ("3.9", "2.31"), "bookworm": ("3.11", "2.36"), "trixie": ("3.13", "2.41"),
}
"""Debian suite → (its python3, its glibc): the CPU bases and the interpreter images."""

CPU_BASE_SUITES = {"3.11": "bookworm", "3.13": "trixie"}
"""Our CPU bases by their Python: bookworm is the default; trixie (Python 3.13) stands in for a
release whose Python is not the builder's (no NGC release has Python 3.11)."""

# nvidia-pytriton release, Triton it bundles, the stub Pythons it carries (REFERENCE.md; 0.1.x
# and 0.2.x bundle 2.29 and 2.33 with the container's 3.8 stub only, so they bridge nothing).
PYTRITON_STUBS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("0.4.0", "2.36.0", ("3.8", "3.9", "3.10", "3.11")),
    ("0.4.2", "2.39.0", ("3.8", "3.9", "3.10", "3.11")),
    ("0.5.0", "2.41.0", ("3.8", "3.9", "3.10", "3.11")),
    ("0.5.2", "2.42.0", ("3.8", "3.9", "3.10", "3.11")),
    ("0.5.3", "2.43.0", ("3.8", "3.9", "3.10", "3.11")),
    ("0.5.6", "2.44.0", ("3.8", "3.9", "3.10", "3.11", "3.12")),
    ("0.5.7", "2.45.0", ("3.8", "3.9", "3.10", "3.11", "3.12")),
    ("0.5.8", "2.46.0", ("3.8", "3.9", "3.10", "3.11", "3.12")),
    ("0.5.9", "2.47.0", ("3.8", "3.9", "3.10", "3.11", "3.12")),
    ("0.5.10", "2.48.0", ("3.8", "3.9", "3.10", "3.11", "3.12")),
    ("0.5.11", "2.49.0", ("3.8", "3.9", "3.10", "3.11", "3.12")),
    ("0.5.12", "2.50.0", ("3.8", "3.9", "3.10", "3.11", "3.12")),
    ("0.7.0", "2.51.0", ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")),
)

# First release of a pybind11 pin (python_backend CMakeLists.txt), newest CPython it builds for.
PYBIND11_OF_BRANCH: tuple[tuple[str, str], ...] = (("21.02", "2.10"), ("24.11", "2.12"))
PYBIND11_NEWEST_PYTHON = {"2.10": "3.11", "2.11": "3.12", "2.12": "3.13", "2.13": "3.13"}
PYBIND11_SUBSTITUTE = "2.13.6"
"""The pybind11 (PyPI's sdist) a compiled stub is built with where its branch's pin cannot build
the Python. pybind11 lives inside the stub only — the stub and the backend speak python_backend's
own shared-memory protocol — and NVIDIA's nvidia-pytriton 0.7.0 ships r24.10 stubs for Python
3.12 and 3.13, which r24.10's pin (2.10.0) cannot build."""


HEADER_FORWARDING_FROM = "2.33.0"
"""The first Triton (23.04) that forwards chosen HTTP and gRPC headers into a request's
parameters (``--http-header-forward-pattern``, ``--grpc-header-forward-pattern``: server PR
5575): how a client's ``traceparent`` reaches the pipeline model of a traced image. Before it
a client sends ``traceparent`` as a request parameter."""
RESTRICTED_APIS_FROM = "2.40.0"
"""The first Triton (23.11) that restricts APIs over both protocols: HTTP's
``--http-restricted-api`` came in 2.40, gRPC's ``--grpc-restricted-protocol`` in 2.33 (23.04).
Before it, a repository API that HTTP clients can reach cannot be closed to them but by keeping
explicit model control off (:attr:`Release.restricts_apis`)."""


class UnsupportedCudaError(TritonBuilderError, ValueError):
    """No release matches the requested CUDA version, Triton version or base image."""


class StubSource(str, Enum):
    """Where the python backend stub of an image can come from, in the order a build prefers them:
    the release's own, a prebuilt one from the ``nvidia-pytriton`` wheel of the same Triton, or
    compiled from the release's python_backend branch."""

    RELEASE = "release"
    WHEEL = "pytriton-wheel"
    COMPILE = "compile"


@dataclass(frozen=True)
class Release:
    """One base image to build on: an NGC release, our CPU base (``gpu=False``), or our slim GPU
    base (``slim=True``: the wheel's Triton 2.51 on Debian, the CUDA of the environment)."""

    release: str
    """``YY.MM`` of the NGC container, or ``"cpu"``."""
    triton_version: str
    cuda: str | None
    python_version: str
    """The Python of the python backend stub: the environment tarball must have the same."""
    ubuntu: str | None
    min_driver: int | None
    driver_source: str | None
    image: str
    gpu: bool
    known_issue: str = ""
    glibc: str = ""
    """glibc of the image (its Ubuntu's, or the CPU base's Debian suite's)."""
    platform: Platform = DEFAULT_PLATFORM
    """The platform of the image built on it: the CPU base's is tagged per platform, an NGC
    release's is the variant of its manifest list for that platform."""
    slim: bool = False
    """The slim GPU route (:func:`slim_release`): ``cuda`` is the environment's, the server is
    the wheel's Triton 2.51 (CUDA runtime :data:`SLIM_SERVER_CUDA`)."""

    @property
    def ngc(self) -> bool:
        """Whether the base is an ``nvcr.io/nvidia/tritonserver`` release."""
        return self.gpu and not self.slim

    @property
    def branch(self) -> str:
        """The python_backend branch of this release's Triton (``r24.10``); the CPU and slim
        bases: Triton 2.51's (:data:`WHEEL_BRANCH`)."""
        return f"r{self.release}" if self.ngc else WHEEL_BRANCH

    @property
    def pytriton_wheel(self) -> str | None:
        """The ``nvidia-pytriton`` release that bundles this Triton with several stubs."""
        return next((wheel for wheel, triton, _ in PYTRITON_STUBS
                     if triton == self.triton_version), None)

    @property
    def wheel_stub_pythons(self) -> tuple[str, ...]:
        return next((pythons for _, triton, pythons in PYTRITON_STUBS
                     if triton == self.triton_version), ())

    @property
    def pybind11(self) -> str:
        """The pybind11 the python_backend branch builds its stub with."""
        return [pin for first, pin in PYBIND11_OF_BRANCH
                if self.branch.removeprefix("r") >= first][-1]

    def compile_pybind11(self, python_version: str) -> str | None:
        """The pybind11 a stub of this release's branch compiles ``python_version`` with: the
        branch's own pin, else :data:`PYBIND11_SUBSTITUTE`; None where neither builds it."""
        return next((pybind11 for pybind11 in (self.pybind11, PYBIND11_SUBSTITUTE)
                     if version_key(python_version)
                     <= version_key(pybind11_newest_python(pybind11))), None)

    def stub_source(self, python_version: str) -> StubSource | None:
        """Where a stub for ``python_version`` comes from on this release; None: nowhere.

        Stubs speak their branch's shared-memory protocol only, so a wheel's stub serves the
        release whose Triton the wheel bundles, and a compiled one comes from the same branch.
        """
        if python_version == self.python_version:
            return StubSource.RELEASE
        if python_version in self.wheel_stub_pythons:
            return StubSource.WHEEL
        return StubSource.COMPILE if self.compile_pybind11(python_version) else None

    @property
    def forwards_headers(self) -> bool:
        """Whether this Triton forwards headers into request parameters
        (:data:`HEADER_FORWARDING_FROM`)."""
        return version_key(self.triton_version) >= version_key(HEADER_FORWARDING_FROM)

    @property
    def restricts_apis(self) -> bool:
        """Whether this Triton can put its administrative APIs behind a header over HTTP and
        gRPC alike (:data:`RESTRICTED_APIS_FROM`): only then may the repository API be on."""
        return version_key(self.triton_version) >= version_key(RESTRICTED_APIS_FROM)

    @property
    def toolkit_driver(self) -> int | None:
        """The CUDA toolkit's minimum driver branch for this release's CUDA."""
        return TOOLKIT_DRIVER.get(self.cuda) if self.cuda else None

    @property
    def safe_driver(self) -> int | None:
        """The driver branch we recommend: the stricter of the release note and the toolkit."""
        values = [v for v in (self.min_driver, self.toolkit_driver) if v is not None]
        return max(values) if values else None

    @property
    def driver_cuda(self) -> str | None:
        """The newest CUDA major every driver from :attr:`min_driver` runs (``"12.0"`` for
        525): what a driver must support for this image (``NVIDIA_REQUIRE_CUDA``)."""
        if self.min_driver is None:
            return None
        majors = [major for major, driver in MINOR_VERSION_DRIVER.items()
                  if driver <= self.min_driver]
        return f"{max(majors, key=int)}.0" if majors else None

    @property
    def min_compute_capability(self) -> str | None:
        """NGC: from 25.01 7.5, before 6.0 (release notes); slim: CUDA 13 dropped every GPU
        older than 7.5 (CUDA 13.0 release notes), CUDA 12 builds run from 6.0 as NGC's did."""
        if not self.gpu:
            return None
        if self.slim:
            return "7.5" if version_key(str(self.cuda))[0] >= 13 else "6.0"
        return "7.5" if self.release >= "25.01" else "6.0"

    def cuda_runtime_problem(self, runtime: str) -> str | None:
        """Why this release's minimum driver cannot run CUDA runtime ``runtime`` (None if it can).

        A runtime no newer than the release's own CUDA, of the same major, runs on the driver the
        release needs; a newer one of that major needs the major's minor-version-compatibility
        driver; another major never shares the release's driver guarantee.
        """
        if not self.gpu or self.cuda is None or self.min_driver is None:
            return None
        major, minor = (int(p) for p in runtime.split(".")[:2])
        own_major, own_minor = (int(p) for p in self.cuda.split("."))
        if major == own_major and minor <= own_minor:
            return None
        needed = MINOR_VERSION_DRIVER.get(str(major), TOOLKIT_DRIVER.get(f"{major}.{minor}"))
        if needed is not None and self.min_driver >= needed:
            return None
        return (f"CUDA runtime {runtime} needs driver >= {needed or 'unknown'}, but "
                f"{self.release} (CUDA {self.cuda}) only needs driver >= {self.min_driver}, so "
                f"machines that run this image may not run it")

    def describe(self) -> str:
        if not self.gpu:
            return (f"CPU base {self.image} (Triton {self.triton_version}, "
                    f"Python {self.python_version})")
        if self.slim:
            return (f"slim GPU base {self.image} (Triton {self.triton_version} from "
                    f"nvidia-pytriton, CUDA {self.cuda} environment, Python "
                    f"{self.python_version}, Debian {SLIM_SUITE}, driver >= {self.min_driver})")
        return (f"{self.image} (Triton {self.triton_version}, CUDA {self.cuda}, Python "
                f"{self.python_version}, Ubuntu {self.ubuntu}, driver >= {self.safe_driver})")


def _read_releases() -> tuple[Release, ...]:
    text = (resources.files("builder.base") / RELEASES_FILE).read_text()
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return tuple(
        Release(release=row["release"], triton_version=row["triton"], cuda=row["cuda"],
                python_version=row["python"], ubuntu=row["ubuntu"],
                min_driver=int(row["min_driver"]), driver_source=row["driver_source"],
                image=f"{NGC_IMAGE}:{row['release']}-py3", gpu=True,
                known_issue=row["known_issue"], glibc=UBUNTU_GLIBC[row["ubuntu"]])
        for row in rows)


RELEASES: tuple[Release, ...] = _read_releases()


def cpu_release(python_version: str = CPU_PYTHON,
                platform: Platform = DEFAULT_PLATFORM) -> Release:
    """Our CPU base (:mod:`builder.base.cpu`): Triton from the ``nvidia-pytriton`` wheel.

    Python 3.11 is Debian bookworm's, 3.13 Debian trixie's (:data:`CPU_BASE_SUITES`); each
    platform has its own base image.
    """
    suite = CPU_BASE_SUITES.get(python_version)
    if suite is None:
        raise UnsupportedCudaError(
            f"there is no CPU base with Python {python_version}; CPU bases: "
            f"{', '.join(f'Python {p} (Debian {s})' for p, s in CPU_BASE_SUITES.items())}")
    return Release(release="cpu", triton_version=TRITON_VERSION, cuda=None,
                   python_version=python_version, ubuntu=None, min_driver=None,
                   driver_source=None, image=cpu_base_tag(python_version, platform), gpu=False,
                   glibc=DEBIAN_SUITES[suite][1], platform=platform)


def supported_cuda_versions() -> list[str]:
    return sorted({r.cuda for r in RELEASES if r.cuda}, key=version_key)


def lowest_driver(cuda: str) -> int:
    """The lowest driver branch any CUDA ``cuda`` runtime runs on: its major's minor version
    compatibility driver (:data:`MINOR_VERSION_DRIVER`)."""
    major = cuda.split(".")[0]
    return MINOR_VERSION_DRIVER.get(major) or TOOLKIT_DRIVER[cuda]


def slim_cuda_versions() -> list[str]:
    """The CUDA versions the slim GPU route serves.

    Its server links the wheel's CUDA :data:`SLIM_SERVER_CUDA` runtime, which needs driver
    >= :func:`lowest_driver` of it (525): the route serves a CUDA version when every driver that
    runs that CUDA's runtime runs the server's too — CUDA 12.x (525) and 13.0 (580); a machine
    set up for CUDA 11.x (drivers from 450) may not run the server at all.
    """
    server = lowest_driver(SLIM_SERVER_CUDA)
    return [cuda for cuda in supported_cuda_versions() if lowest_driver(cuda) >= server]


def slim_release(cuda: str, python_version: str) -> Release:
    """The slim GPU route for CUDA ``cuda`` (a ``major.minor`` of :func:`slim_cuda_versions`)
    and the builder's Python: the wheel's Triton and the stub for that Python, so native."""
    if cuda not in slim_cuda_versions():
        raise UnsupportedCudaError(
            f"the slim GPU route cannot serve CUDA {cuda}: its server links CUDA "
            f"{SLIM_SERVER_CUDA}'s runtime, which needs driver >= "
            f"{lowest_driver(SLIM_SERVER_CUDA)}, while CUDA {cuda} runs on drivers from "
            f"{lowest_driver(cuda)}; the slim route serves CUDA "
            f"{', '.join(slim_cuda_versions())}. For CUDA {cuda} use the NGC route: "
            f"cuda='{cuda}' without slim (--cuda {cuda} without --slim)")
    driver = max(lowest_driver(cuda), lowest_driver(SLIM_SERVER_CUDA))
    return Release(release=SLIM_RELEASE, triton_version=TRITON_VERSION, cuda=cuda,
                   python_version=python_version, ubuntu=None, min_driver=driver,
                   driver_source=MINOR_VERSION_COMPATIBILITY,
                   image=slim_base_tag(python_version), gpu=True,
                   glibc=DEBIAN_SUITES[SLIM_SUITE][1], slim=True)


def builder_python() -> str:
    """The Python minor of this builder: the one ``pipe.pickle`` loads in."""
    return "{}.{}".format(*sys.version_info[:2])


def pybind11_newest_python(pybind11: str) -> str:
    """The newest Python ``pybind11`` (a series like ``2.10``, or a release like ``2.13.6``)
    builds."""
    return PYBIND11_NEWEST_PYTHON[".".join(pybind11.split(".")[:2])]


def resolve(
    cuda: str | float | None = None,
    triton_version: str | None = None,
    base_image: str | None = None,
    *,
    python_version: str | None = None,
    base_python: str | None = None,
    platform: Platform = DEFAULT_PLATFORM,
    slim: bool = False,
) -> Release:
    """The release to build on, for ``platform``.

    ``cuda='11.8'`` gives, among the releases built on CUDA 11.8 that have no known defect, the
    newest whose own Python is ``python_version`` (default: this builder's) — else the newest
    with a prebuilt stub for it in an ``nvidia-pytriton`` wheel, else the newest whose stub can
    be compiled for it (:class:`StubSource`'s order, :meth:`Release.stub_source`), else the
    newest;
    ``triton_version`` (``'2.29'``, ``'2.29.0'`` or the release ``'22.12'``) picks one exactly;
    ``base_image`` keeps the release's facts (Python above all) but builds on another image,
    e.g. a mirror of the NGC image or a custom build. ``cuda=None`` or ``'cpu'`` is our CPU base,
    ``base_python`` picks which (3.11: Debian bookworm, the default; 3.13: Debian trixie).
    ``slim=True`` is the slim GPU route instead of NGC's (:func:`slim_release`): our Debian base
    with the wheel's Triton, for ``python_version``, serving the CUDA versions of
    :func:`slim_cuda_versions`.
    """
    python_version = python_version or builder_python()
    cuda_minor = _cuda_minor(cuda)
    if slim:
        if cuda_minor is None:
            raise UnsupportedCudaError(
                "slim=True is a GPU route: pass cuda= (one of "
                f"{', '.join(slim_cuda_versions())}), or leave slim off for the CPU base")
        if triton_version and _normal_triton(triton_version) != _normal_triton(TRITON_VERSION):
            raise UnsupportedCudaError(
                f"the slim GPU route serves Triton {TRITON_VERSION} (nvidia-pytriton's); Triton "
                f"{triton_version} exists only as an NGC image: leave slim off")
        if base_python:
            raise UnsupportedCudaError(
                f"base_python={base_python!r} chooses among the CPU bases; the slim GPU base "
                f"runs the builder's own Python ({python_version})")
        if platform != DEFAULT_PLATFORM:
            raise UnsupportedCudaError(
                f"the slim GPU route has no {platform} base yet: build {platform} on an NGC "
                f"release (leave slim off), or slim for {DEFAULT_PLATFORM} alone")
        release = slim_release(cuda_minor, python_version)
        return replace(release, image=base_image) if base_image else release
    if cuda_minor is None:
        release = cpu_release(base_python or CPU_PYTHON, platform)
        if triton_version and _normal_triton(triton_version) not in (
                _normal_triton(TRITON_VERSION), "cpu"):
            raise UnsupportedCudaError(
                f"the CPU base is Triton {TRITON_VERSION}; Triton {triton_version} exists only "
                f"as an NGC GPU image: pass cuda= (one of {', '.join(supported_cuda_versions())})")
        return replace(release, image=base_image) if base_image else release
    if base_python:
        raise UnsupportedCudaError(
            f"base_python={base_python!r} chooses among the CPU bases; an NGC release brings its "
            f"own Python (pass cuda=None or 'cpu' for a CPU base)")

    candidates = [r for r in RELEASES if r.cuda == cuda_minor]
    if not candidates:
        raise UnsupportedCudaError(
            f"no nvcr.io/nvidia/tritonserver release is built on CUDA {cuda}; supported CUDA "
            f"versions: {', '.join(supported_cuda_versions())}, or cuda=None / 'cpu' for the "
            f"CPU base")
    if triton_version:
        wanted = _normal_triton(triton_version)
        matches = [r for r in candidates
                   if wanted in (r.release, _normal_triton(r.triton_version))]
        if not matches:
            choices = ", ".join(f"{r.triton_version} ({r.release})" for r in candidates)
            raise UnsupportedCudaError(
                f"Triton {triton_version} is not built on CUDA {cuda_minor}; releases for CUDA "
                f"{cuda_minor}: {choices}")
        release = matches[-1]
    else:
        healthy = [r for r in candidates if not r.known_issue] or candidates
        release = _preferred(healthy, python_version)
    release = replace(release, platform=platform)
    return replace(release, image=base_image) if base_image else release


def _preferred(releases: list[Release], python_version: str) -> Release:
    """The newest release of the most preferred stub source, in :class:`StubSource`'s order:
    the release's own Python, then a stub NVIDIA built and ships (``nvidia-pytriton``, GPU on),
    then one we compile. A compile is the longest and least tested route, so a newer release
    does not outweigh a prebuilt stub of an older one of the same CUDA. Where no source exists
    for ``python_version``, the newest (the bridge refuses it with the reason)."""
    for source in StubSource:
        matching = [r for r in releases if r.stub_source(python_version) is source]
        if matching:
            return matching[-1]
    return releases[-1]


def _cuda_minor(cuda: str | float | None) -> str | None:
    if cuda is None:
        return None
    text = str(cuda).strip().lower()
    if text in ("", "cpu", "none"):
        return None
    parts = text.removeprefix("cuda").strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise UnsupportedCudaError(
            f"not a CUDA version: {cuda!r}; supported: {', '.join(supported_cuda_versions())}, "
            f"or cuda=None / 'cpu' for the CPU base")
    return f"{int(parts[0])}.{int(parts[1])}"


def _normal_triton(version: str) -> str:
    """``'2.51'`` and ``'2.51.0'`` compare equal; release names (``'24.10'``) pass through."""
    text = str(version).strip().lower().removeprefix("v")
    parts = text.split(".")
    if len(parts) == 2 and parts[0] == "2":
        return f"{text}.0"
    return text


def version_key(version: str) -> tuple[int, ...]:
    """``"3.10"`` → ``(3, 10)``: versions, CUDA minors and ``YY.MM`` releases compare as numbers."""
    return tuple(int(p) for p in version.split("."))


@dataclass(frozen=True)
class BaseOptions:
    """The arguments of :func:`builder.base.releases.resolve`, held together once per build.

    ``cuda`` picks the ``nvcr.io/nvidia/tritonserver`` release (``None`` or ``"cpu"``: the CPU
    base; with ``slim`` our slim GPU base); ``triton_version`` or ``base_image`` override it;
    ``base_python`` picks the CPU base's Debian (3.11: bookworm, 3.13: trixie) or states a custom
    ``base_image``'s Python.
    """

    cuda: str | float | None = field(default=None, metadata={"help": (
        "CUDA version of the release (e.g. 12.6), or 'cpu' (the default): the "
        "image's base, and where model operators run.")})
    triton_version: str | None = field(default=None, metadata={"help": (
        "Pick the Triton release by its version.")})
    base_image: str | None = field(default=None, metadata={"help": (
        "Use this base image instead.")})
    base_python: str | None = field(default=None, metadata={"help": (
        "Python of the CPU base: 3.11 (bookworm, the default) or 3.13 (trixie); "
        "of a custom base image, its Python.")})
    slim: bool = field(default=False, metadata={"help": (
        "The slim GPU route for cuda (12.x, 13.0): the nvidia-pytriton wheel's "
        "Triton on Debian, CUDA libraries from NVIDIA's wheels, no NGC image.")})
