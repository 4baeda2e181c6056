"""The Triton server that runs on a CPU machine: Triton 2.51 from the ``nvidia-pytriton`` wheel.

NGC images cannot be pulled everywhere (and need a GPU to be useful), but PyPI carries a real
``tritonserver`` with its python backend inside PyTriton's wheel. This module fetches that wheel
once into the cache, unpacks it, and lays its files out the two ways we need them:

* :meth:`TritonDistribution.backend_directory` — a ``--backend-directory`` for a host process;
* :meth:`TritonDistribution.install_layout` — the NGC layout (``/opt/tritonserver/{bin,lib,
  backends,caches}``) for a CPU base image.

Both carry our Python-based ``onnxruntime`` backend, so ONNX models load exactly as
``platform: "onnxruntime_onnx"`` models do in NGC images.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from builder.cache import DownloadError, cache_dir, cached_download, file_sha256, staged
from builder.errors import TritonBuilderError

PYTRITON_REQUIREMENT = "nvidia-pytriton==0.7.0"
"""PyTriton 0.7.0 ships Triton 2.51.0, the server of the 24.10 NGC container."""
WHEEL_PLATFORMS = {"x86_64": ("manylinux_2_35_x86_64", "manylinux_2_31_x86_64"),
                   "aarch64": ("manylinux_2_35_aarch64",)}
"""The platform tags of PyTriton 0.7.0's wheels (PyPI's file list), by machine (``uname -m``):
the same Triton 2.51.0 built for each."""

TRITON_VERSION = "2.51.0"
STUB_PYTHON_VERSIONS = ("3.10", "3.11", "3.12", "3.13")
PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
ONNXRUNTIME_BACKEND = Path(__file__).parents[1] / "runtime/backends/onnxruntime/model.py"


class DistributionError(TritonBuilderError, RuntimeError):
    """The Triton wheel could not be fetched or does not hold what we need."""


@dataclass(frozen=True)
class TritonDistribution:
    """An unpacked ``nvidia-pytriton`` wheel."""

    root: Path
    wheel: Path

    @property
    def tritonserver(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "bin" / "tritonserver"

    @property
    def library_dir(self) -> Path:
        """The shared libraries auditwheel moved out of the server (``libtritonserver`` & co)."""
        return self.root / "nvidia_pytriton.libs"

    @property
    def libtritonserver(self) -> Path:
        """``libtritonserver.so``, renamed by auditwheel (``libtritonserver-<hash>.so``)."""
        (library,) = self.library_dir.glob("libtritonserver*.so*")
        return library

    @property
    def python_backend(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "backends" / "python"

    @property
    def caches(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "caches"

    def stub(self, python_version: str) -> Path:
        """The python backend stub built against ``libpython<python_version>``."""
        if python_version not in STUB_PYTHON_VERSIONS:
            raise DistributionError(
                f"Triton {TRITON_VERSION} has python backend stubs for Python "
                f"{', '.join(STUB_PYTHON_VERSIONS)}; not for {python_version}"
            )
        return self.root / "pytriton/tritonserver/python_backend_stubs" / python_version / (
            "triton_python_backend_stub"
        )

    def backend_directory(self, dest: Path, python_version: str,
                          python_backend: Path | None = None) -> Path:
        """Write a ``--backend-directory`` with the python and onnxruntime backends to ``dest``.

        ``python_backend`` is a directory holding another branch's python backend
        (``libtriton_python.so``, ``triton_python_backend_stub``, its
        ``triton_python_backend_utils.py``) to use instead of the wheel's. Such a library asks
        for ``libtritonserver.so``, which the wheel renamed: a link of that name is put beside
        it, and the server's ``LD_LIBRARY_PATH`` must hold ``dest/python``.
        """
        python = dest / "python"
        python.mkdir(parents=True, exist_ok=True)
        if python_backend is None:
            for item in self.python_backend.iterdir():
                shutil.copy2(item, python / item.name)
            shutil.copy2(self.stub(python_version), python / "triton_python_backend_stub")
        else:
            for name in (*PYTHON_BACKEND_FILES, "triton_python_backend_stub"):
                shutil.copy2(python_backend / name, python / name)
            (python / "libtritonserver.so").symlink_to(self.libtritonserver)
        onnxruntime = dest / "onnxruntime"
        onnxruntime.mkdir(exist_ok=True)
        shutil.copy2(ONNXRUNTIME_BACKEND, onnxruntime / "model.py")
        return dest

    def install_layout(self, dest: Path, python_version: str) -> Path:
        """Copy the server into ``dest`` in the NGC layout (``bin``, ``lib``, ``backends``, ...)."""
        (dest / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.tritonserver, dest / "bin" / "tritonserver")
        shutil.copytree(self.library_dir, dest / "lib", dirs_exist_ok=True)
        shutil.copytree(self.caches, dest / "caches", dirs_exist_ok=True)
        self.backend_directory(dest / "backends", python_version)
        return dest


def triton_distribution(wheel: Path | None = None, *,
                        machine: str = "x86_64") -> TritonDistribution:
    """Return the unpacked Triton wheel for ``machine``, downloading and unpacking it on first
    use.

    ``wheel`` (or ``$TRITON_BUILDER_PYTRITON_WHEEL``, where it is that machine's) points at a
    wheel already on disk, for machines that reach no package index.
    """
    given = _env_path("TRITON_BUILDER_PYTRITON_WHEEL")
    if given is not None and not given.name.endswith(f"_{machine}.whl"):
        given = None
    wheel = wheel or given or download_wheel(machine=machine)
    digest = wheel_digest(wheel)[:16]
    root = cache_dir("tritonserver") / f"{TRITON_VERSION}-{digest}"
    if not (root / ".complete").exists():
        unpack_wheel(wheel, root)
    distribution = TritonDistribution(root=root, wheel=wheel)
    if not distribution.tritonserver.exists():
        raise DistributionError(f"{wheel} holds no pytriton/tritonserver/bin/tritonserver")
    return distribution


def download_wheel(requirement: str = PYTRITON_REQUIREMENT, *, machine: str = "x86_64") -> Path:
    """The ``nvidia-pytriton`` wheel ``requirement`` for Linux on ``machine``, downloaded once."""
    if machine not in WHEEL_PLATFORMS:
        raise DistributionError(f"{requirement} has no wheel for {machine}: only for "
                                f"{', '.join(WHEEL_PLATFORMS)}")
    platforms = WHEEL_PLATFORMS[machine]
    try:
        return cached_download(
            requirement, "wheels",
            f"nvidia_pytriton-{requirement.split('==')[1]}-*_{machine}.whl",
            "--only-binary=:all:", *(a for platform in platforms for a in ("--platform", platform)),
            "--python-version", "3.11")
    except DownloadError as error:
        raise DistributionError(
            f"could not download {requirement} (Triton and its python backend stubs):\n"
            f"{error.output}\nSet TRITON_BUILDER_PYTRITON_WHEEL to a local copy of "
            f"{PYTRITON_REQUIREMENT}, or put the wheel in {cache_dir('wheels')}."
        ) from error


def unpack_wheel(wheel: Path, root: Path,
                 prefixes: tuple[str, ...] = ("pytriton/tritonserver/",
                                              "nvidia_pytriton.libs/")) -> None:
    """Extract the members of ``wheel`` under ``prefixes`` to ``root`` with their modes (the
    executables stay executable), as a cache entry (:func:`builder.cache.staged`): two
    processes unpacking at once neither delete nor overwrite each other's tree."""
    with staged(root) as staging:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if info.filename.startswith(prefixes):
                    path = Path(archive.extract(info, staging))
                    mode = info.external_attr >> 16
                    if mode:
                        path.chmod(mode & 0o777)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def wheel_digest(path: Path) -> str:
    """The SHA-256 of a wheel file: what its unpacked copies in the cache are named by."""
    return file_sha256(path)
