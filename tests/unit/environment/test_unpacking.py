"""Archive or directory: which releases get their environment unpacked, and what the
repository and the serving image then hold.

The directory rule is read from python_backend's ``pb_env.cc``; where the source snapshots are at
hand (``../shared/triton-sources``), the rule is held against each branch's own code.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.base import resolve
from builder.environment.attach import attach_environment
from builder.environment.tarball import EnvironmentTarball
from builder.environment.unpacking import accepts_directory, ships_unpacked
from builder.image.context import plan_context
from builder.image.serving_dockerfile import render_serving_dockerfile
from builder.image.serving_image import (
    EnvironmentMismatchError,
    check_environment_cuda,
    environment_python,
)
from tests.support.paths import TRITON_SOURCES

SOURCES = TRITON_SOURCES


@pytest.mark.parametrize(("cuda", "triton", "unpacked"), [
    ("11.8", None, False),     # 22.12: r22.12 extracts an archive, nothing else
    ("12.1", "23.05", False),  # r23.05: the same
    ("12.1", None, True),      # 23.07: the first branch that uses a directory in place
    ("12.4", None, True),      # 24.05
    ("12.6", None, True),      # 24.12
    ("13.0", None, True),      # 25.11
])
def test_gpu_releases_that_take_a_directory_get_the_environment_unpacked(cuda, triton, unpacked):
    release = resolve(cuda, triton)
    assert accepts_directory(release) is unpacked
    assert ships_unpacked(release) is unpacked


def test_the_cpu_base_ships_its_environment_unpacked():
    """Triton 2.51 (r24.10) takes a directory: nothing is extracted at start, so a read-only
    container (whose tmpfs ``/tmp`` is noexec) loads the environment's shared libraries."""
    cpu = resolve(None)
    assert accepts_directory(cpu)
    assert ships_unpacked(cpu)


@pytest.mark.skipif(not SOURCES.is_dir(), reason=f"no Triton source snapshots at {SOURCES}")
def test_the_rule_matches_each_branch_pb_env_cc():
    """Every python_backend snapshot: a directory is used in place exactly where the rule says."""
    checked = []
    for tarball in sorted(SOURCES.glob("python_backend-r*.tar.gz")):
        branch = re.search(r"-(r\d+\.\d+)\.tar\.gz$", tarball.name).group(1)
        with tarfile.open(tarball) as archive:
            member = next(m for m in archive if m.name.endswith("src/pb_env.cc"))
            source = archive.extractfile(member).read().decode()
        in_place = "S_ISDIR" in source and "Returning canonical path" in source
        release = next(r for r in _releases() if r.branch == branch)
        assert accepts_directory(release) is in_place, branch
        checked.append(branch)
    assert {"r22.12", "r23.05", "r24.10"} <= set(checked)


def _releases():
    return [resolve("11.8"), resolve("12.1", "23.05"), resolve("12.6", "24.10"),
            resolve("12.6", "24.12"), resolve("13.0")]


@pytest.fixture
def gpu_environment(tmp_path) -> EnvironmentTarball:
    """A bridged environment archive of the shape the carried packer makes, carrying the
    CUDA 12.4 runtime's wheel (as torch 2.6.0 from PyPI does)."""
    prefix = tmp_path / "env"
    site = prefix / "lib" / "python3.11" / "site-packages"
    (site / "nvidia_cuda_runtime_cu12-12.4.127.dist-info").mkdir(parents=True)
    (site / "nvidia_cuda_runtime_cu12-12.4.127.dist-info" / "METADATA").write_text("")
    (prefix / "bin").mkdir()
    (prefix / "bin" / "activate").write_text("export PATH\n")
    archive = tmp_path / "environment.tar.gz"
    with tarfile.open(archive, "w:gz") as packed:
        for path in sorted(prefix.rglob("*")):
            packed.add(path, arcname=str(path.relative_to(prefix)), recursive=False)
    return EnvironmentTarball(path=archive, lock=None, key="k", packer="interpreter",
                              python_version="3.11", numpy_version="1.26.4", reused=False)


def _python_repository(root: Path) -> Path:
    for name in ("pipeline", "post"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text("class TritonPythonModel: pass\n")
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n')
    return root


@pytest.mark.parametrize(("cuda", "held"), [("12.4", "environment"),
                                             ("11.8", "environment.tar.gz")])
def test_the_repository_and_the_image_layer_hold_what_the_release_takes(
        tmp_path, gpu_environment, cuda, held):
    """As the build attaches it (``job.build_docker_image``): a directory on 24.05, the archive
    on 22.12; every python model points at the one holder; the directory is the image's
    environment layer and is checked like an archive; the Dockerfile is the same either way."""
    release = resolve(cuda)
    repository = _python_repository(tmp_path / "models")
    attach_environment(repository, gpu_environment, unpacked=ships_unpacked(release))
    holder = repository / "pipeline" / held
    assert holder.is_dir() is (held == "environment")
    assert (repository / "post" / held).readlink() == Path("../pipeline") / held
    for name in ("pipeline", "post"):
        config = mc.ModelConfig()
        text_format.Parse((repository / name / "config.pbtxt").read_text(), config)
        assert config.parameters["EXECUTION_ENV_PATH"].string_value == (
            f"$$TRITON_MODEL_DIRECTORY/{held}")
    entries = plan_context(repository).entries
    layers = {e.path: e.layer for e in entries}
    inside = "/site-packages/nvidia_cuda_runtime_cu12-12.4.127.dist-info/METADATA"
    if held == "environment":
        assert layers[f"environment/models/pipeline/environment/lib/python3.11{inside}"] == (
            "environment")
        assert [e.link for e in entries if e.path.endswith("post/environment")] == [
            "../pipeline/environment"]  # a link in the image too, not a second copy
    else:
        assert layers["environment/models/pipeline/environment.tar.gz"] == "environment"
    assert environment_python(holder) == "3.11"
    check_environment_cuda(holder, release if cuda == "12.4" else resolve("12.4"))
    with pytest.raises(EnvironmentMismatchError, match="nvidia_cuda_runtime_cu12-12.4.127"):
        check_environment_cuda(holder, resolve("11.8"))  # driver 520 runs no CUDA 12
    dockerfile = render_serving_dockerfile(release, has_environment=True)
    assert "COPY environment/ /" in dockerfile
