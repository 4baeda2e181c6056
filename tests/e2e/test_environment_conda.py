"""The conda path: real ``conda-pack`` on a conda-layout prefix, loaded by a real Triton.

No conda channel is reachable here, so no conda can create an environment; what stands in for
``conda create`` is :func:`conda_layout_prefix`, which lays out what conda leaves behind: a
prefix with its own CPython (this host's pyenv build, copied), a package cache ``pkgs/`` whose
files are hardlinked into the prefix, ``conda-meta/<name>-<version>-<build>.json`` records
listing each package's files and pointing at its cache entry, and packages that pip (run by the
prefix's own Python, as an ``environment.yml`` ``pip:`` section does) installed on top. Python
and numpy are conda-managed, ``tabulate`` is pip's. Everything after that is the product's:
``CondaPacker(prefix=...)``, conda-pack, the checks, the cache, attach, tritonserver.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from builder.environment.attach import attach_environment
from builder.environment.errors import ArchiveCheckError
from builder.environment.packers import CondaPacker
from builder.environment.spec import EnvironmentSpec
from builder.environment.tarball import pack_environment
from builder.environment.target import host_target
from tests.e2e.test_environment_host import write_probe_repository

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
_STDLIB_LEFT_OUT = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip",
                    "lib2to3", "__pycache__"}


def conda_layout_prefix(root: Path, pip_requirements: list[str],
                        conda_managed: tuple[str, ...] = ("numpy",)) -> Path:
    """Lay out ``root/envs/model`` as conda would (see the module docstring); return it."""
    pkgs, prefix = root / "pkgs", root / "envs" / "model"
    version = sys.version.split()[0]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    python_files = {f"bin/python{PYTHON_VERSION}": Path(sys.executable).resolve()}
    libdir = Path(sysconfig.get_config_var("LIBDIR"))
    for library in libdir.glob(f"libpython{PYTHON_VERSION}.so*"):
        python_files[f"lib/{library.name}"] = library
    for path in stdlib.rglob("*"):
        relative = path.relative_to(stdlib)
        if path.is_file() and not (_STDLIB_LEFT_OUT & set(relative.parts)) and not (
                relative.parts[0].startswith("config-")):
            python_files[f"lib/python{PYTHON_VERSION}/{relative}"] = path
    links = {"bin/python3": f"python{PYTHON_VERSION}", "bin/python": f"python{PYTHON_VERSION}"}
    _install_package(pkgs, prefix, "python", version, python_files, links)
    (prefix / f"lib/python{PYTHON_VERSION}/site-packages").mkdir(parents=True, exist_ok=True)

    python = prefix / "bin" / "python3"
    wheels = root / "wheels"
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels), "pip",
          *pip_requirements])
    pip = next(wheels.glob("pip-*.whl")) / "pip"
    _run([str(python), str(pip), "install", "--quiet", "--no-index", "--find-links", str(wheels),
          "--no-compile", "--disable-pip-version-check", *pip_requirements],
         env={"PIP_CONFIG_FILE": os.devnull})
    for name in conda_managed:
        _adopt(pkgs, prefix, name)
    (prefix / "conda-meta" / "history").write_text("==> 2024-10-01 00:00:00 <==\n")
    return prefix


def _install_package(pkgs: Path, prefix: Path, name: str, version: str,
                     files: dict[str, Path], links: dict[str, str]) -> None:
    """Extract a package into the cache, hardlink it into the prefix, write its record."""
    build = "0"
    cache = pkgs / f"{name}-{version}-{build}"
    paths = []
    for relative, source in sorted(files.items()):
        cached = cache / relative
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, cached)
        target = prefix / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        os.link(cached, target)
        paths.append({"_path": relative, "path_type": "hardlink",
                      "size_in_bytes": cached.stat().st_size})
    for relative, destination in sorted(links.items()):
        for base in (cache, prefix):
            (base / relative).symlink_to(destination)
        paths.append({"_path": relative, "path_type": "softlink"})
    info = {"name": name, "version": version, "build": build, "build_number": 0,
            "subdir": "linux-64", "channel": "https://conda.anaconda.org/conda-forge/linux-64"}
    (cache / "info").mkdir()
    (cache / "info" / "index.json").write_text(json.dumps(info))
    (cache / "info" / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}))
    record = {**info, "url": f"{info['channel']}/{name}-{version}-{build}.conda",
              "files": [entry["_path"] for entry in paths],
              "paths_data": {"paths": paths, "paths_version": 1},
              "link": {"source": str(cache), "type": 1}, "requested_spec": name}
    (prefix / "conda-meta").mkdir(exist_ok=True)
    (prefix / "conda-meta" / f"{name}-{version}-{build}.json").write_text(json.dumps(record))


def _adopt(pkgs: Path, prefix: Path, name: str) -> None:
    """Turn a pip-installed distribution into a conda-managed package (as conda-forge ships it)."""
    site = prefix / f"lib/python{PYTHON_VERSION}/site-packages"
    (dist_info,) = site.glob(f"{name}-*.dist-info")
    version = dist_info.name[len(name) + 1:-len(".dist-info")]
    files = {}
    for line in (dist_info / "RECORD").read_text().splitlines():
        relative = line.split(",")[0]
        path = (site / relative).resolve()
        if path.is_file() and prefix.resolve() in path.parents:
            files[str(path.relative_to(prefix.resolve()))] = path
    staged = {relative: Path(shutil.copy2(path, str(path) + ".adopt"))
              for relative, path in files.items()}
    for path in files.values():
        path.unlink()
    _install_package(pkgs, prefix, name, version, staged, {})
    for path in staged.values():
        path.unlink()


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    variables = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(command, capture_output=True, text=True, env={**variables,
                                                                          **(env or {})})
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def conda_prefix(tmp_path_factory) -> Path:
    return conda_layout_prefix(tmp_path_factory.mktemp("conda"), ["numpy<2", "tabulate"])


def test_conda_pack_environment_loads_in_triton(conda_prefix, tmp_path, triton_server):
    """conda-pack packs the prefix, the checks pass, Triton extracts it and the model answers."""
    spec = EnvironmentSpec(conda=True)
    tarball = pack_environment(spec, host_target(), packer=CondaPacker(prefix=conda_prefix),
                               cache=tmp_path / "cache")
    assert tarball.packer == "conda" and tarball.numpy_version.startswith("1.")
    lock = tarball.lock.read_text()
    assert f"python={sys.version.split()[0]}=0" in lock and "tabulate==" in lock
    assert "numpy=1." in lock  # conda-managed, so listed as a conda package

    repository = write_probe_repository(tmp_path / "models", ["table"])
    assert attach_environment(repository, tarball) == ["table"]
    server = triton_server(repository, log_verbose=1)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        x = grpcclient.InferInput("X", [2, 2], "FP32")
        x.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.float32))
        table, prefix, numpy_version = client.infer("table", [x]).as_numpy("Y")
    assert table.decode() == "1  2\n3  4"
    assert prefix.decode().startswith("/tmp/python_env_"), prefix
    assert numpy_version.decode() == tarball.numpy_version

    again = pack_environment(spec, host_target(), packer=CondaPacker(prefix=conda_prefix),
                             cache=tmp_path / "cache")
    assert again.reused and again.path == tarball.path


def test_conda_prefix_with_another_python_fails_before_packing(conda_prefix, tmp_path):
    """A conda environment whose Python is not the stub's is refused before conda-pack runs."""
    target = host_target(stub_python_version="3.12")
    with pytest.raises(ArchiveCheckError, match=r"python=3\.12") as failure:
        pack_environment(EnvironmentSpec(conda=True), target,
                         packer=CondaPacker(prefix=conda_prefix), cache=tmp_path)
    assert f"has Python {sys.version.split()[0]}" in str(failure.value)
    assert not list(tmp_path.rglob("*.tar.gz"))
