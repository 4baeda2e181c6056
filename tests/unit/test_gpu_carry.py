"""What is carried to a lent GPU machine (tests/support/gpu_carry.py): wheels pip still reads,
with only what the GPU tier uses of them."""

from __future__ import annotations

import zipfile

from tests.support.gpu_carry import CLIENT_PROGRAMS, STUBS, repack, stub_only_for

LIBS = "nvidia_pytriton.libs/"


def test_the_triton_wheel_keeps_only_the_machines_stub_and_the_libraries_the_server_needs(
        tmp_path):
    members = [f"{STUBS}{version}/triton_python_backend_stub" for version in ("3.11", "3.12",
                                                                             "3.13")]
    members += [f"{LIBS}libpython3-419a3a08.13.so.1.0", f"{LIBS}libtritonserver-717102f0.so",
                "pytriton/tritonserver/bin/tritonserver", "nvidia_pytriton-0.7.0.dist-info/RECORD"]
    source = tmp_path / "source.whl"
    with zipfile.ZipFile(source, "w") as wheel:
        for name in members:
            wheel.writestr(name, b"\0" * 4096)
    packed = repack(source, tmp_path / "packed.whl", stub_only_for("3.12"))
    with zipfile.ZipFile(packed) as wheel:
        assert sorted(wheel.namelist()) == sorted([
            f"{STUBS}3.12/triton_python_backend_stub", f"{LIBS}libtritonserver-717102f0.so",
            "pytriton/tritonserver/bin/tritonserver", "nvidia_pytriton-0.7.0.dist-info/RECORD"])
        assert {info.compress_type for info in wheel.infolist()} == {zipfile.ZIP_LZMA}
        assert wheel.testzip() is None
    assert stub_only_for("3.13")(f"{LIBS}libpython3-419a3a08.13.so.1.0")


def test_the_client_wheel_leaves_its_programs_behind(tmp_path):
    source = tmp_path / "tritonclient-2.51.0-py3-none-manylinux1_x86_64.whl"
    with zipfile.ZipFile(source, "w") as wheel:
        wheel.writestr(f"tritonclient-2.51.0{CLIENT_PROGRAMS}perf_analyzer", b"x")
        wheel.writestr("tritonclient-2.51.0.data/purelib/tritonclient/grpc/__init__.py", b"")
    packed = repack(source, tmp_path / "packed.whl", lambda name: CLIENT_PROGRAMS not in name)
    assert zipfile.ZipFile(packed).namelist() == [
        "tritonclient-2.51.0.data/purelib/tritonclient/grpc/__init__.py"]
