"""The stub route of an image: which stub its python models run on, and where it comes from.

:meth:`builder.base.releases.Release.stub_source` says *whether* a stub for a Python can be had
on a release, from the release facts alone (the resolver ranks releases by it); a route adds
what the build needs to get it — the wheel to take it from, or the branch and pybind11 to
compile — and the words that tell a user why.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.base.releases import (
    PYBIND11_SUBSTITUTE,
    Release,
    StubSource,
    pybind11_newest_python,
)


@dataclass(frozen=True)
class StubRoute:
    """Where the python backend stub of an image comes from."""

    kind: StubSource
    description: str
    requirement: str | None = None
    """The wheel to take it from (:attr:`StubSource.WHEEL`)."""
    branch: str | None = None
    """The python_backend branch to compile (:attr:`StubSource.COMPILE`)."""
    pybind11: str | None = None
    """The pybind11 to build it with instead of the branch's pin (:attr:`StubSource.COMPILE`;
    see :data:`builder.base.releases.PYBIND11_SUBSTITUTE`)."""


def stub_route(release: Release, python_version: str) -> StubRoute | None:
    """The route :meth:`~builder.base.releases.Release.stub_source` picks; None: no stub."""
    source = release.stub_source(python_version)
    if source is StubSource.RELEASE:
        return StubRoute(source, f"the release's own stub (Python {python_version})")
    if source is StubSource.WHEEL:
        return StubRoute(source,
                         f"nvidia-pytriton=={release.pytriton_wheel} (Triton "
                         f"{release.triton_version}, stub for Python {python_version})",
                         requirement=f"nvidia-pytriton=={release.pytriton_wheel}")
    return compiled_stub(release, python_version)


def compiled_stub(release: Release, python_version: str) -> StubRoute | None:
    """The stub compiled from the release's python_backend branch, with its own pybind11 or,
    where that cannot build ``python_version``, :data:`PYBIND11_SUBSTITUTE`; None where
    neither can."""
    pybind11 = release.compile_pybind11(python_version)
    described = f"compiled from python_backend {release.branch} for Python {python_version}"
    if pybind11 is None:
        return None
    if pybind11 == release.pybind11:
        return StubRoute(StubSource.COMPILE, f"{described} (pybind11 {release.pybind11})",
                         branch=release.branch)
    return StubRoute(StubSource.COMPILE,
                     f"{described} (pybind11 {PYBIND11_SUBSTITUTE} from PyPI: the branch's "
                     f"{release.pybind11} builds Python up to "
                     f"{pybind11_newest_python(release.pybind11)})",
                     branch=release.branch, pybind11=PYBIND11_SUBSTITUTE)


def no_stub_reason(release: Release, python_version: str) -> str:
    wheel = (f"nvidia-pytriton=={release.pytriton_wheel} bundles stubs for Python "
             f"{', '.join(release.wheel_stub_pythons)} only" if release.pytriton_wheel else
             f"no nvidia-pytriton wheel bundles Triton {release.triton_version}")
    return (f"{release.release} (Triton {release.triton_version}) runs Python "
            f"{release.python_version}; {wheel}, and no pybind11 a stub of python_backend "
            f"{release.branch} is compiled with (its own {release.pybind11}, or "
            f"{PYBIND11_SUBSTITUTE}) supports Python {python_version}")
