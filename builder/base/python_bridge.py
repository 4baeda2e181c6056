"""Which Python the python models of an image run on, decided before anything is pulled.

``pipe.pickle`` holds code objects of the builder's Python minor and loads nowhere else, while
every NGC release runs its python backend on its own Python (3.8, 3.10 or 3.12; none has 3.11).
So an image either matches (*native*: the release's stub, an environment made by its python3)
or is *bridged*: a stub built for the builder's Python from the release's own python_backend
branch (:func:`builder.base.releases.stub_route`) and an environment that carries the
builder's interpreter — the interpreter of an image that holds that Python on a glibc no newer
than the release's (the route this version builds), or conda-pack of ``python=X.Y`` when asked
for with ``packer="conda"`` (in the table, refused at build time).

:func:`plan_python` makes that decision from the tables in :mod:`builder.base.releases` alone,
and refuses — naming the reason and the CUDA versions that would work — when no bridge exists or
the bridge is turned off. What a bridged build then needs (stub, interpreter, packer) is
:func:`builder.environment.bridge.bridge_environment`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from builder.base.releases import (
    DEBIAN_SUITES,
    PYBIND11_SUBSTITUTE,
    RELEASES,
    Release,
    StubRoute,
    builder_python,
    compiled_stub,
    no_stub_reason,
    pybind11_newest_python,
    stub_route,
    supported_cuda_versions,
)
from builder.errors import TritonBuilderError

INTERPRETER_IMAGE = "python:{python}-slim-{suite}"
"""Docker Hub's official Python images (Debian based, ``libpython`` shared, in /usr/local)."""
INTERPRETER_IMAGE_VARIABLE = "TRITON_BUILDER_INTERPRETER_IMAGE"
"""Overrides the interpreter image (a mirror, or an image made without a registry)."""


class PythonBridgeError(TritonBuilderError, ValueError):
    """The builder's Python cannot run on the chosen release (no bridge, or bridge turned off)."""


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
    options: dict = field(default_factory=dict, compare=False)
    """The keyword arguments :func:`plan_python` was given, to plan again for a release whose
    facts were corrected (:mod:`builder.base.base_python`)."""

    @property
    def bridged(self) -> bool:
        """The release's Python is not the pipeline's: the environment carries an interpreter."""
        return self.python_version != self.release.python_version

    @property
    def own_stub(self) -> bool:
        """The python models get a stub of their own (bridged, or compiled on request)."""
        return self.stub.kind != "release"

    def describe(self) -> str:
        if not self.bridged:
            stub = f"; stub {self.stub.description}" if self.own_stub else ""
            return f"native: {self.release.describe()} runs Python {self.python_version}{stub}"
        return (f"bridged: Python {self.python_version} on {self.release.describe()}; stub "
                f"{self.stub.description}; interpreter {self.interpreter.description}")


def plan_python(
    release: Release,
    python_version: str | None = None,
    *,
    bridge: bool = True,
    conda: bool | None = None,
    interpreter_image: str | None = None,
    compile_stub: bool = False,
) -> PythonPlan:
    """Decide how ``python_version`` (default: the builder's) runs on ``release``.

    ``compile_stub`` compiles the stub from the release's python_backend branch even where the
    release's own stub or a wheel's would do (a custom build of Triton, or a check of the route).

    ``conda`` asks for the interpreter from conda (``packer="conda"``); by default it comes from
    an interpreter image, conda on ``PATH`` or not, since that route is the one this version
    builds (:func:`require_buildable`). ``interpreter_image`` overrides the image the
    interpreter is taken from (default ``$TRITON_BUILDER_INTERPRETER_IMAGE``, else
    :func:`interpreter_image_for`). Raises
    :class:`PythonBridgeError` when the Pythons differ and no bridge exists or ``bridge`` is off.
    """
    python_version = python_version or builder_python()
    options = dict(bridge=bridge, conda=conda, interpreter_image=interpreter_image,
                   compile_stub=compile_stub)
    route = stub_route(release, python_version)
    if compile_stub:
        route = compiled_stub_route(release, python_version)
    if release.python_version == python_version and route is not None:
        return PythonPlan(release, python_version, route,
                          InterpreterRoute("release", f"the release's python3 "
                                                      f"({release.python_version})"), options)
    if not bridge:
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
        image = (interpreter_image or os.environ.get(INTERPRETER_IMAGE_VARIABLE)
                 or interpreter_image_for(release, python_version))
        interpreter = InterpreterRoute(
            "interpreter-image", f"Python {python_version} taken from {image} (glibc no newer "
                                 f"than the release's {release.glibc})", image=image)
    return PythonPlan(release, python_version, route, interpreter, options)


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


def interpreter_image_for(release: Release, python_version: str) -> str:
    """The official Python image on the newest Debian whose glibc the release's is not older than.

    The interpreter and its extension modules are copied into the environment; they must run on
    the release's glibc.
    """
    fitting = [suite for suite, (_, glibc) in DEBIAN_SUITES.items()
               if _key(glibc) <= _key(release.glibc)]
    if not fitting:
        raise PythonBridgeError(
            f"{release.describe()} has glibc {release.glibc}, older than every Debian suite we "
            f"take interpreters from ({', '.join(DEBIAN_SUITES)}): install conda, or pass "
            f"interpreter_image=")
    suite = max(fitting, key=lambda name: _key(DEBIAN_SUITES[name][1]))
    return INTERPRETER_IMAGE.format(python=python_version, suite=suite)


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
        found = native if route.kind == "release" else bridged
        found.setdefault(str(release.cuda), []).append(release.release)

    def listed(found: dict[str, list[str]]) -> str:
        return "; ".join(f"CUDA {cuda} ({_span(found[cuda])})"
                         for cuda in supported_cuda_versions() if cuda in found) or "none"

    return (f"Python {python_version} runs natively on {listed(native)}; through the bridge "
            f"on {listed(bridged)}.")


def _span(releases: list[str]) -> str:
    return releases[0] if len(releases) == 1 else f"{releases[0]}–{releases[-1]}"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))

