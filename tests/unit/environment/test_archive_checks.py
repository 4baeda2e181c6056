"""Environments that would fail in Triton are refused before any image is made, saying why.

Every archive here is real: venvs made by real interpreters (this host's 3.11, pyenv's 3.12 when
present), packed by venv-pack or by the product's packer in a container of the CPU base image;
the corrupt ones are real archives cut short or with a flipped byte.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import docker.errors
import pytest
import venv_pack

from builder.engine.image_build import build_image
from builder.environment.archive_check import check_archive
from builder.environment.attach import attach_environment
from builder.environment.errors import ArchiveCheckError, SpecError, TargetError
from builder.environment.spec import requirements_spec
from builder.environment.tarball import EnvironmentTarball, pack_environment
from builder.environment.target import host_target, image_target
from tests.e2e.test_environment_host import write_probe_repository

FAILED_TAG = "triton-builder-test/environment-refused:latest"
PYTHON_3_12 = next(iter(sorted(Path("/root/.pyenv/versions").glob("3.12.*/bin/python3.12"))),
                   None) or shutil.which("python3.12")


def packed_venv(tmp_path: Path, python: str = sys.executable, name: str = "venv",
                packages: tuple[str, ...] = ()) -> Path:
    """A real venv of ``python`` with ``packages`` (pip, from outside), packed by venv-pack."""
    venv = tmp_path / name
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True)
    if packages:
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                        "install", "--quiet", "--no-compile", *packages],
                       check=True, capture_output=True)
    return Path(venv_pack.pack(prefix=str(venv), output=str(tmp_path / f"{name}.tar.gz")))


def build_served_image(client, base_image: str, workdir: Path, make_tarball) -> None:
    """What a build does, in its order: the environment first, the image only after it."""
    repository = write_probe_repository(workdir / "context" / "models", ["table"])
    attach_environment(repository, make_tarball())
    (workdir / "context" / "Dockerfile").write_text(f"FROM {base_image}\nCOPY models/ /models/\n")
    build_image(client, workdir / "context", [FAILED_TAG])


def assert_refused_before_image(client, base_image, tmp_path, make_tarball, error, match):
    with pytest.raises(error, match=match) as failure:
        build_served_image(client, base_image, tmp_path, make_tarball)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(FAILED_TAG)
    return str(failure.value)


@pytest.fixture(scope="module")
def cpu_target(docker_client, cpu_base_image):
    return image_target(docker_client, cpu_base_image)


@pytest.mark.slow
@pytest.mark.skipif(PYTHON_3_12 is None, reason="no Python 3.12 interpreter on this machine")
def test_python_minor_other_than_the_stub_is_refused(docker_client, cpu_base_image, cpu_target,
                                                     tmp_path):
    archive = packed_venv(tmp_path, PYTHON_3_12)
    message = assert_refused_before_image(
        docker_client, cpu_base_image, tmp_path,
        lambda: EnvironmentTarball.from_archive(archive, cpu_target),
        ArchiveCheckError, r"Python 3\.12 environment")
    assert "built for Python 3.11" in message and "Rebuild it with Python 3.11" in message

    with pytest.raises(TargetError, match=r"stub is built for Python 3\.11"):
        pack_environment(requirements_spec(["numpy<2"], "test"),
                         host_target(PYTHON_3_12, stub_python_version="3.11"), cache=tmp_path)


@pytest.mark.slow
def test_corrupt_archives_are_refused(docker_client, cpu_base_image, cpu_target, tmp_path):
    archive = packed_venv(tmp_path)
    data = archive.read_bytes()
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(data[: len(data) // 2])
    message = assert_refused_before_image(
        docker_client, cpu_base_image, tmp_path,
        lambda: EnvironmentTarball.from_archive(truncated, cpu_target),
        ArchiveCheckError, "corrupt or truncated")
    assert "Re-pack it" in message and "every later environment model" in message

    with pytest.raises(ArchiveCheckError, match="has no numpy"):  # intact: read to the end
        check_archive(archive, host_target())
    flipped = tmp_path / "flipped.tar.gz"
    for tenth in range(1, 10):  # a byte flipped in a header, in file data, in the deflate stream
        at = len(data) * tenth // 10
        changed = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
        if _inflates_to(changed) == _inflates_to(data):
            continue  # a flip deflate ignores (an unused code length): the archive is intact
        flipped.write_bytes(changed)
        with pytest.raises(ArchiveCheckError, match="corrupt or truncated"):
            check_archive(flipped, cpu_target)


def _inflates_to(data: bytes) -> bytes | None:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error):
        return None


def test_formats_triton_cannot_extract_are_refused(tmp_path):
    archive = packed_venv(tmp_path)
    target = host_target()
    zipped = Path(shutil.make_archive(str(tmp_path / "env"), "zip", tmp_path / "venv"))
    with pytest.raises(ArchiveCheckError, match=r"only \.tar\.gz or \.tar"):
        check_archive(zipped, target)
    plain = tmp_path / "plain.tar.gz"
    plain.write_bytes(gzip.decompress(archive.read_bytes()))
    with pytest.raises(ArchiveCheckError, match="is not gzip-compressed"):
        check_archive(plain, target)
    raw = tmp_path / "raw.tar.gz"
    with tarfile.open(raw, "w:gz") as tar:  # a plain tar of the venv: activate hard-codes it
        tar.add(tmp_path / "venv", arcname=".")
    with pytest.raises(ArchiveCheckError, match="VIRTUAL_ENV to the absolute path"):
        check_archive(raw, target)


@pytest.mark.slow
def test_environment_without_numpy_is_refused(docker_client, cpu_base_image, cpu_target,
                                             tmp_path):
    """Built for real in the CPU image (tabulate only): the check names the fix."""
    message = assert_refused_before_image(
        docker_client, cpu_base_image, tmp_path,
        lambda: pack_environment(requirements_spec(["tabulate==0.9.0"], "test"), cpu_target,
                                 cache=tmp_path / "cache"),
        ArchiveCheckError, "has no numpy")
    assert "Add numpy<2 to the environment's requirements" in message
    assert not list((tmp_path / "cache").rglob("*.tar.gz")), "a refused tarball was cached"


@pytest.mark.slow
def test_archive_with_numpy_2_is_refused(tmp_path):
    """Made outside the builder (pip into a venv, venv-pack): the check reads numpy's version."""
    archive = packed_venv(tmp_path, packages=("numpy==2.0.2",))
    with pytest.raises(ArchiveCheckError, match=r"numpy 2\.0\.2.*empty output tensors") as failure:
        EnvironmentTarball.from_archive(archive, host_target())
    assert "Pin numpy<2" in str(failure.value)


def test_numpy_2_cannot_get_into_an_environment_for_the_2_51_stub(tmp_path):
    """Asked for outright: refused before any download; pulled in by another package: the
    ``numpy<2`` constraint every venv build passes makes pip refuse it, with pip's reason."""
    with pytest.raises(SpecError, match=r"'numpy>=2' \(operator embed\) asks for numpy 2"):
        pack_environment(requirements_spec(["numpy>=2"], "operator embed"), host_target(),
                         cache=tmp_path)
    assert not list(tmp_path.iterdir())
