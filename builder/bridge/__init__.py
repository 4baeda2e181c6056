"""The Python bridge: serving a pipeline pickled by one Python on a release built for another.

A stage between the base (:mod:`builder.base`, which knows each release's Python and which
stubs exist for it) and the environment (:mod:`builder.environment`, which packs what runs on
the stub). :func:`plan_python` decides, before anything is pulled, whether an image is *native*
or *bridged* and by which routes (:mod:`.routes`, :mod:`.plan`); :func:`prepare_bridge` makes
the parts (:mod:`.parts`): the stub — prebuilt in an ``nvidia-pytriton`` wheel
(:mod:`.wheel_stub`) or compiled from the release's python_backend branch (:mod:`.stub_build`,
with CMake from PyPI: :mod:`.cmake_wheel`) — and the image whose interpreter the environment
carries (:mod:`.interpreter`, copied by :mod:`.interpreter_copy`).
"""

from builder.bridge.errors import (
    BridgeBuildError,
    CMakeDownloadError,
    PythonBridgeError,
    StubBuildError,
)
from builder.bridge.parts import BridgeParts, prepare_bridge
from builder.bridge.plan import BridgeOptions, PythonPlan, plan_python, require_buildable
from builder.bridge.routes import StubRoute, stub_route

__all__ = [
    "BridgeBuildError",
    "BridgeOptions",
    "BridgeParts",
    "CMakeDownloadError",
    "PythonBridgeError",
    "PythonPlan",
    "StubBuildError",
    "StubRoute",
    "plan_python",
    "prepare_bridge",
    "require_buildable",
    "stub_route",
]
