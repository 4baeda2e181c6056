"""Which Python the python models of an image run on, decided before anything is pulled.

``pipe.pickle`` holds code objects of the builder's Python minor and loads nowhere else, while
every NGC release runs its python backend on its own Python (3.8, 3.10 or 3.12; none has 3.11).
So an image either matches (*native*: the release's stub, an environment made by its python3)
or is *bridged*: a stub built for the builder's Python from the release's own python_backend
branch (:func:`builder.bridge.routes.stub_route`) and an environment that carries the
builder's interpreter — the interpreter of an image that holds that Python on a glibc no newer
than the release's (the route this version builds), or conda-pack of ``python=X.Y`` when asked
for with ``packer="conda"`` (in the table, refused at build time).

:func:`plan_python` makes that decision from the tables in :mod:`builder.base.releases` alone,
and refuses — naming the reason and the CUDA versions that would work — when no bridge exists or
the bridge is turned off. What a bridged build then needs (stub, interpreter, packer) is
:func:`builder.bridge.parts.prepare_bridge`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from builder.base.releases import (
    PYBIND11_SUBSTITUTE,
    RELEASES,
    Release,
    StubSource,
    builder_python,
    pybind11_newest_python,
    supported_cuda_versions,
)
from builder.bridge.errors import PythonBridgeError
from builder.bridge.interpreter import INTERPRETER_IMAGE_VARIABLE, interpreter_image_for
from builder.bridge.routes import StubRoute, compiled_stub, no_stub_reason, stub_route


@dataclass(frozen=True)
class InterpreterRoute:
    """Where the environment's interpreter comes from."""

    kind: str
    """``release`` (its python3), ``conda-pack`` or ``interpreter-image``."""
    description: str
    image: str | None = None
    """The image the interpreter is taken from (``interpreter-image``)."""


@dataclass(frozen=True)
class PythonPlan:
    """How the python models of an image on ``release`` run ``python_version``."""

    release: Release
    python_version: str
    stub: StubRoute
    interpreter: InterpreterRoute
    options: BridgeOptions | None = field(default=None, compare=False)
    conda: bool | None = field(default=None, compare=False)
    """What :func:`plan_python` was asked, to plan again for a release whose facts the base
    image corrected (:mod:`builder.bridge.base_python`)."""

    @property
    def bridged(self) -> bool:
        """The release's Python is not the pipeline's: the environment carries an interpreter."""
        return self.python_version != self.release.python_version

    @property
    def own_stub(self) -> bool:
        """The python models get a stub of their own (bridged, or compiled on request)."""
        return self.stub.kind is not StubSource.RELEASE

    def describe(self) -> str:
        if not self.bridged:
            stub = f"; stub {self.stub.description}" if self.own_stub else ""
            return f"native: {self.release.describe()} runs Python {self.python_version}{stub}"
        return (f"bridged: Python {self.python_version} on {self.release.describe()}; stub "
                f"{self.stub.description}; interpreter {self.interpreter.description}")


@dataclass(frozen=True)
class BridgeOptions:
    """How a build may bridge the builder's Python onto a release whose Python differs."""

    enabled: bool = field(default=True, metadata={"help": (
        "Serve this Python on a release whose Python differs (a stub and an environment "
        "carrying the interpreter); off, such a release is refused before anything is "
        "pulled.")})
    interpreter_image: str | None = field(default=None, metadata={"help": (
        "Image the bridged interpreter is taken from (default: "
        "$TRITON_BUILDER_INTERPRETER_IMAGE, else python:X.Y-slim-<debian> on a glibc no "
        "newer than the release's).")})
    compile_stub: bool = field(default=False, metadata={"help": (
        "Compile the stub from the release's python_backend branch even where the "
        "release's own stub or a wheel's would do (a custom Triton, or a check of the "
        "route).")})
    triton_sources: str | os.PathLike | None = field(default=None, metadata={"help": (
        "Directory of python_backend source tarballs, for builders that reach no source "
        "host (default: $TRITON_BUILDER_TRITON_SOURCES, else fetched).")})


def plan_python(
    release: Release,
    python_version: str | None = None,
    options: BridgeOptions = BridgeOptions(),
    *,
    conda: bool | None = None,
) -> PythonPlan:
    """Decide how ``python_version`` (default: the builder's) runs on ``release``.

    ``conda`` asks for the interpreter from conda (``packer="conda"``); by default it comes from
    an interpreter image, conda on ``PATH`` or not, since that route is the one this version
    builds (:func:`require_buildable`). Raises :class:`PythonBridgeError` when the Pythons
    differ and no bridge exists or the bridge is off.
    """
    python_version = python_version or builder_python()
    route = stub_route(release, python_version)
    if options.compile_stub:
        route = compiled_stub_route(release, python_version)
    if release.python_version == python_version and route is not None:
        return PythonPlan(release, python_version, route,
                          InterpreterRoute("release", f"the release's python3 "
                                                      f"({release.python_version})"),
                          options, conda)
    if not options.enabled:
        raise PythonBridgeError(
            f"{release.describe()} runs its python models on Python {release.python_version}, "
            f"but the pipeline is pickled by Python {python_version} (pickled code loads only "
            f"in the same minor), and the bridge is turned off (bridge=False). "
            f"{alternatives(python_version)}")
    if route is None:
        raise PythonBridgeError(
            f"no bridge to Python {python_version} exists on {release.release}: "
            f"{no_stub_reason(release, python_version)}. {alternatives(python_version)}")
    if conda:
        interpreter = InterpreterRoute(
            "conda-pack", f"conda-pack of a conda environment with python={python_version}")
    else:
        image = (options.interpreter_image or os.environ.get(INTERPRETER_IMAGE_VARIABLE)
                 or interpreter_image_for(release, python_version))
        interpreter = InterpreterRoute(
            "interpreter-image", f"Python {python_version} taken from {image} (glibc no newer "
                                 f"than the release's {release.glibc})", image=image)
    return PythonPlan(release, python_version, route, interpreter, options, conda)


def compiled_stub_route(release: Release, python_version: str) -> StubRoute:
    """The compile route for ``release``, refused where no pybind11 we build with supports the
    Python."""
    route = compiled_stub(release, python_version)
    if route is None:
        raise PythonBridgeError(
            f"no stub for Python {python_version} compiles from python_backend "
            f"{release.branch}: pybind11 {release.pybind11} (its own) supports Python up to "
            f"{pybind11_newest_python(release.pybind11)}, pybind11 {PYBIND11_SUBSTITUTE} up to "
            f"{pybind11_newest_python(PYBIND11_SUBSTITUTE)}")
    return route


def require_buildable(plan: PythonPlan) -> None:
    """Refuse, before anything is pulled, a bridged plan whose routes this version cannot build."""
    if plan.bridged and plan.interpreter.kind != "interpreter-image":
        raise PythonBridgeError(
            f"{plan.describe()}: this version builds bridged environments from an interpreter "
            f"image only, not with conda-pack; leave packer unset or pass packer='venv' (the "
            f"interpreter then comes from "
            f"{interpreter_image_for(plan.release, plan.python_version)})")


def alternatives(python_version: str) -> str:
    """The CUDA versions (and releases) that serve ``python_version`` natively or bridged."""
    native: dict[str, list[str]] = {}
    bridged: dict[str, list[str]] = {}
    for release in RELEASES:
        if release.known_issue:
            continue
        route = stub_route(release, python_version)
        if route is None:
            continue
        found = native if route.kind is StubSource.RELEASE else bridged
        found.setdefault(str(release.cuda), []).append(release.release)

    def listed(found: dict[str, list[str]]) -> str:
        return "; ".join(f"CUDA {cuda} ({_span(found[cuda])})"
                         for cuda in supported_cuda_versions() if cuda in found) or "none"

    return (f"Python {python_version} runs natively on {listed(native)}; through the bridge "
            f"on {listed(bridged)}.")


def _span(releases: list[str]) -> str:
    return releases[0] if len(releases) == 1 else f"{releases[0]}–{releases[-1]}"

