"""Laying out the Triton of the ``nvidia-pytriton`` wheel, on a wheel written by the test.

The real wheel (55 MB) is fetched by the test bed and served from in the e2e tests; here a zip
with the same member paths and modes stands in for it, so that unpacking (only the server's
members, executables kept executable, no half-unpacked copy ever visible) and the two layouts
are checked in milliseconds.
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import pytest

from builder.tritonserver.wheel import (
    STUB_PYTHON_VERSIONS,
    DistributionError,
    TritonDistribution,
    triton_distribution,
    unpack_wheel,
)
from tests.support.at_once import at_once

SERVER = "pytriton/tritonserver/"
MEMBERS = {
    SERVER + "bin/tritonserver": 0o755,
    SERVER + "backends/python/libtriton_python.so": 0o755,
    SERVER + "backends/python/triton_python_backend_utils.py": 0o644,
    SERVER + "caches/local/libtritoncache_local.so": 0o755,
    **{SERVER + f"python_backend_stubs/{v}/triton_python_backend_stub": 0o755
       for v in STUB_PYTHON_VERSIONS},
    "nvidia_pytriton.libs/libtritonserver-7a1b2c3d.so": 0o755,
    "pytriton/__init__.py": 0o644,
    "nvidia_pytriton-0.7.0.dist-info/RECORD": 0o644,
}


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    path = tmp_path / "nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, mode in MEMBERS.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            archive.writestr(info, f"contents of {name}\n")
    return path


@pytest.fixture
def distribution(wheel: Path, tmp_path: Path, monkeypatch) -> TritonDistribution:
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path / "cache"))
    return triton_distribution(wheel)


def test_only_the_server_is_unpacked_and_executables_stay_executable(wheel, tmp_path):
    root = tmp_path / "unpacked"
    unpack_wheel(wheel, root)
    files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert files == {n for n in MEMBERS if not n.startswith(("pytriton/__", "nvidia_pytriton-"))
                     } | {".complete"}
    for name, mode in MEMBERS.items():
        if (root / name).exists():
            assert stat.S_IMODE((root / name).stat().st_mode) == mode, name


def test_an_interrupted_unpacking_is_redone_and_never_seen_half_done(wheel, tmp_path):
    """What a killed build left: its own staging directory (never taken for another's), or,
    from an older builder, a ``root`` without its marker (replaced)."""
    root = tmp_path / "unpacked"
    for left in (root.with_name(root.name + ".partial-killed"), root):
        (left / SERVER / "bin").mkdir(parents=True)
        (left / SERVER / "bin/stale").write_text("left by a killed build")
    unpack_wheel(wheel, root)
    assert not (root / SERVER / "bin/stale").exists()
    assert (root / ".complete").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("unpacked")) == [
        "unpacked", "unpacked.partial-killed"]


def _unpack_and_list(wheel: Path, root: Path) -> dict[str, str]:
    """Unpack, then read back every file of ``root`` at once, as the caller would use it."""
    unpack_wheel(wheel, root)
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_two_processes_unpacking_at_once_both_get_the_whole_tree(tmp_path):
    """Two builds that find the server not yet unpacked (two pytest-xdist workers on an empty
    cache) unpack it together: neither may delete the other's half-done or finished tree."""
    wheel = tmp_path / "nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl"
    members = {**MEMBERS, **{f"{SERVER}lib/part{i:03}.so": 0o755 for i in range(400)}}
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, mode in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            archive.writestr(info, f"contents of {name}\n" * 2000)
    expected = {name: f"contents of {name}\n" * 2000 for name in members
                if name.startswith((SERVER, "nvidia_pytriton.libs/"))}
    expected[".complete"] = ""
    for attempt in range(3):
        root = tmp_path / f"unpacked-{attempt}"
        first, second = at_once(_unpack_and_list, [(wheel, root)] * 2)
        assert first == expected
        assert second == expected
        assert _unpack_and_list(wheel, root) == expected
        assert sorted(tmp_path.glob(f"{root.name}*")) == [root], "a staging directory was left"


def test_the_distribution_is_unpacked_once_per_wheel_content(distribution, wheel):
    assert distribution.tritonserver.read_text() == f"contents of {SERVER}bin/tritonserver\n"
    marker = distribution.root / ".complete"
    before = marker.stat().st_mtime_ns
    assert triton_distribution(wheel).root == distribution.root
    assert marker.stat().st_mtime_ns == before
    assert distribution.libtritonserver.name == "libtritonserver-7a1b2c3d.so"


def test_a_wheel_without_a_server_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path / "cache"))
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("pytriton/__init__.py", "")
    with pytest.raises(DistributionError, match="holds no pytriton/tritonserver/bin/tritonserver"):
        triton_distribution(empty)


def test_stubs_exist_for_the_wheels_pythons_only(distribution):
    assert distribution.stub("3.11").read_text().endswith(
        "python_backend_stubs/3.11/triton_python_backend_stub\n")
    with pytest.raises(DistributionError, match="3.10, 3.11, 3.12, 3.13; not for 3.9"):
        distribution.stub("3.9")


def test_a_backend_directory_holds_the_wheels_python_backend_and_onnxruntime(distribution,
                                                                              tmp_path):
    dest = distribution.backend_directory(tmp_path / "backends", "3.12")
    python = dest / "python"
    assert sorted(p.name for p in python.iterdir()) == [
        "libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert (python / "triton_python_backend_stub").read_text().endswith(
        "stubs/3.12/triton_python_backend_stub\n")
    assert os.access(python / "triton_python_backend_stub", os.X_OK)
    assert "TritonPythonModel" in (dest / "onnxruntime/model.py").read_text()


def test_another_branchs_python_backend_finds_the_renamed_libtritonserver(distribution,
                                                                          tmp_path):
    compiled = tmp_path / "r22.12"
    compiled.mkdir()
    for name in ("libtriton_python.so", "triton_python_backend_utils.py",
                 "triton_python_backend_stub"):
        (compiled / name).write_text(f"r22.12 {name}\n")
    python = distribution.backend_directory(tmp_path / "backends", "3.11", compiled) / "python"
    assert (python / "libtriton_python.so").read_text() == "r22.12 libtriton_python.so\n"
    assert (python / "libtritonserver.so").resolve() == distribution.libtritonserver


def test_the_ngc_layout(distribution, tmp_path):
    dest = distribution.install_layout(tmp_path / "opt/tritonserver", "3.11")
    assert (dest / "bin/tritonserver").is_file()
    assert (dest / "lib/libtritonserver-7a1b2c3d.so").is_file()
    assert (dest / "caches/local/libtritoncache_local.so").is_file()
    assert (dest / "backends/python/triton_python_backend_stub").is_file()
    assert (dest / "backends/onnxruntime/model.py").is_file()
