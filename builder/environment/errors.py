"""What can go wrong making a model environment, as one family of errors.

A build catches :class:`EnvironmentBuildError` to stop before any image is made; the subclasses
say which step failed. Every message says what to do about it: environment problems are the
ones Triton users report most (a Python that does not match the stub, a silent conda-pack
failure, a tarball that fails to extract and takes every later model down with it).
"""

from __future__ import annotations

from builder.errors import TritonBuilderError


class EnvironmentBuildError(TritonBuilderError, RuntimeError):
    """The model environment could not be made or would not work in the target image."""


class SpecError(EnvironmentBuildError, ValueError):
    """A spec file or an operator's requirements cannot be read or merged: bad input (a
    ``ValueError`` too, so the command line exits 2)."""


class TargetError(EnvironmentBuildError):
    """The target (image or host) cannot run an environment, or a command in it failed."""


class PackError(EnvironmentBuildError):
    """Installing or packing the environment failed; carries the tool's own output."""


class ArchiveCheckError(EnvironmentBuildError):
    """The packed archive would fail in Triton: wrong format, corrupt, wrong Python, no numpy."""


class IndexUnreachableError(TritonBuilderError, ConnectionError):
    """A package index did not answer a listing or a wheel's metadata."""
