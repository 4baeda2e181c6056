"""Put the environment into a written model repository: one file, every python model using it.

Triton extracts an environment archive once per (real path, mtime) and server: models whose
``EXECUTION_ENV_PATH`` leads to the same file — directly or through symlinks — share one
extraction; copies are extracted once each (minutes for a big environment, server#5045).
``$$TRITON_MODEL_DIRECTORY`` is substituted only as a prefix, so the file has to be reached
from inside each model directory. Hence: the archive (and its lock) goes into the first python
model's directory (hard-linked from the cache where it can be), every other python model gets a
relative symlink to it, and every python model's ``config.pbtxt`` gets the same
``$$TRITON_MODEL_DIRECTORY/environment.tar.gz``.

Copy the repository with its symlinks kept (``shutil.copytree(..., symlinks=True)``, Docker's
``COPY`` does): dereferenced, each link becomes a copy and is extracted on its own.

A bridged image (:mod:`builder.bridge`) also gets one python backend stub, built
for the environment's Python: the backend launches ``<model directory>/triton_python_backend_stub``
instead of its own when that file exists, so it goes beside the archive in the same model and is
linked from the others.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from collections.abc import Iterable
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from builder.environment.errors import EnvironmentBuildError
from builder.environment.stub_rpath import point_at_environment
from builder.environment.tarball import EnvironmentTarball
from builder.repository.config_rules import PLATFORM_BACKENDS
from builder.repository.model_config import write_config

ENV_PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
LOCK_FILE = "environment.lock.txt"
STUB_FILE = "triton_python_backend_stub"
ENVIRONMENT_DIRECTORY = "environment"
"""An unpacked environment's name in the first python model's directory (the others link it)."""


def attach_environment(
    repository: str | os.PathLike,
    tarball: EnvironmentTarball,
    *,
    models: Iterable[str] | None = None,
    stub: str | os.PathLike | None = None,
    backends: Iterable[str] = ("python",),
    unpacked: bool = False,
) -> list[str]:
    """Make python models of ``repository`` use ``tarball`` (and ``stub``); return their names.

    ``models`` limits it to those models (default: every model of ``backends``, where a
    ``platform: "onnxruntime_onnx"`` model counts as an ``onnxruntime`` one: on the CPU base that
    backend is Python-based, run by the python backend's stub like a python model).
    A repository without such models is left as it is.

    ``unpacked`` puts the environment in as a directory, which the python backend uses in place:
    models of two backends (the python backend and the CPU base's Python-based onnxruntime)
    extract their archives at the same time, and the extraction changes the process's working
    directory (python_backend ``pb_env.cc``), so concurrent ones write into each other's.
    """
    repository = Path(repository)
    configs = _python_models(repository, None if models is None else set(models),
                             frozenset(backends))
    if not configs:
        return []
    holder = min(configs)
    if unpacked:
        filename = ENVIRONMENT_DIRECTORY
        _unpack(tarball.path, repository / holder / filename)
    else:
        filename = "environment" + (".tar.gz" if tarball.path.name.endswith(".tar.gz")
                                    else ".tar")
        _place(tarball.path, repository / holder / filename)
    if tarball.lock is not None:
        shutil.copyfile(tarball.lock, repository / holder / LOCK_FILE)
    shared = [filename]
    if stub is not None:
        shutil.copyfile(stub, repository / holder / STUB_FILE)
        (repository / holder / STUB_FILE).chmod(0o755)
        if unpacked:
            point_at_environment(repository / holder / STUB_FILE)
        shared.append(STUB_FILE)
    for name in configs:
        if name == holder:
            continue
        for item in shared:
            link = repository / name / item
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(Path("..") / holder / item)
    for name, config in configs.items():
        config.parameters[ENV_PARAMETER].string_value = f"{MODEL_DIRECTORY}/{filename}"
        write_config(config, repository / name)
    return sorted(configs)


def _python_models(repository: Path, wanted: set[str] | None,
                   backends: frozenset[str]) -> dict[str, model_config_pb2.ModelConfig]:
    if not repository.is_dir():
        raise EnvironmentBuildError(f"model repository {repository} does not exist")
    configs: dict[str, model_config_pb2.ModelConfig] = {}
    for directory in sorted(p for p in repository.iterdir() if p.is_dir()):
        path = directory / "config.pbtxt"
        if not path.is_file() or (wanted is not None and directory.name not in wanted):
            continue
        config = model_config_pb2.ModelConfig()
        try:
            text_format.Parse(path.read_text(), config)
        except text_format.ParseError as error:
            raise EnvironmentBuildError(f"{path} is not a valid model config: {error}") from error
        backend = config.backend or PLATFORM_BACKENDS.get(config.platform, "")
        if backend in backends:
            configs[directory.name] = config
    missing = (wanted or set()) - set(configs)
    if missing:
        raise EnvironmentBuildError(
            f"not python-backend models of {repository}: {', '.join(sorted(missing))} "
            f"(only backend: \"python\" models take an environment)"
        )
    return configs


def _unpack(archive: Path, destination: Path) -> None:
    """Extract a checked environment archive (its members stay inside: ``check_archive``)."""
    if destination.is_symlink() or destination.is_file():
        destination.unlink()
    elif destination.exists():
        shutil.rmtree(destination)
    with tarfile.open(archive) as members:
        members.extractall(destination, filter="tar")


def _place(archive: Path, destination: Path) -> None:
    """Hard-link the archive in (gigabytes are not copied per build); copy across filesystems."""
    if destination.exists() and os.path.samefile(archive, destination):
        return
    if destination.is_symlink() or destination.exists():
        destination.unlink()
    try:
        os.link(archive, destination)
    except OSError:
        shutil.copyfile(archive, destination)
    destination.chmod(0o644)
