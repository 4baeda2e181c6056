"""What can go wrong bridging the builder's Python onto a release, as one family of errors.

:class:`PythonBridgeError` is bad input (no route exists, or the bridge is turned off) and is
raised before anything is pulled; the others are failed steps of making the bridge's parts.
"""

from __future__ import annotations

from builder.errors import TritonBuilderError


class PythonBridgeError(TritonBuilderError, ValueError):
    """The builder's Python cannot run on the chosen release (no bridge, or bridge turned off)."""


class BridgeBuildError(TritonBuilderError, RuntimeError):
    """A part of the bridge (stub, CMake, interpreter) could not be made."""


class StubBuildError(BridgeBuildError):
    """The stub cannot be compiled from these sources on this image."""


class CMakeDownloadError(BridgeBuildError):
    """The CMake wheel could not be downloaded for the release image's architecture."""
