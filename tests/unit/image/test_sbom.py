"""The image's bill of materials from its parts: the lock it reads, the dpkg status, the document.

Every document is checked with CycloneDX's own JSON schema validator. The lock of a real packed
environment, the dpkg packages of a real image and ``triton-builder inspect IMAGE --sbom`` on
the example image are in ``tests/e2e/test_sbom.py``.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from builder.base.releases import resolve
from builder.bridge.routes import stub_route
from builder.environment.errors import PackError
from builder.environment.lock import LockedPackage, hash_lock, read_lock
from builder.image.os_packages import (
    OsPackage,
    OsPackages,
    parse_dpkg_status,
    parse_os_release,
)
from builder.image.sbom import (
    BaseImage,
    PythonRuntime,
    ShippedEnvironment,
    ShippedStub,
    image_sbom,
    sbom_packages,
)

LOCK = """\
# The model environment, as packed by triton-builder (venv packer) for image x
numpy==1.26.4 --hash=sha256:666dbfb6ec68962c033a450943ded891bed2d54e6755e35e5835d63f4f6931d5
Typing_Extensions==4.12.2 --hash=sha256:{a} --hash=sha256:{b}
# conda packages: name=version=build (channel)
python=3.11.9=hab00c5b_0  # conda-forge
""".format(a="a" * 64, b="b" * 64)

DPKG_STATUS = """\
Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u4
Description: GNU C Library
 shared libraries.

Package: dpkg
Status: install ok installed
Architecture: amd64
Version: 1.21.22

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""

BASE = BaseImage("triton-builder/tritonserver-cpu:2.51.0-py3.11", "sha256:" + "1" * 64,
                 "sha256:" + "1" * 64,
                 {"org.opencontainers.image.base.name": "triton-builder/debian-bookworm:3.11"})
DEBIAN = OsPackages("debian", "12", parse_dpkg_status(DPKG_STATUS))


def validate(document: str) -> None:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(document)
    assert error is None, error


def test_a_lock_names_pip_pins_with_their_hashes_and_conda_records():
    assert read_lock(LOCK) == (
        LockedPackage("numpy", "1.26.4", "pypi", (
            "sha256:666dbfb6ec68962c033a450943ded891bed2d54e6755e35e5835d63f4f6931d5",)),
        LockedPackage("python", "3.11.9", "conda", channel="conda-forge", build="hab00c5b_0"),
        LockedPackage("Typing_Extensions", "4.12.2", "pypi", ("sha256:" + "a" * 64,
                                                              "sha256:" + "b" * 64)),
    )


def test_hash_lock_refuses_a_frozen_package_whose_wheel_was_not_downloaded(tmp_path):
    (tmp_path / "tabulate-0.9.0-py3-none-any.whl").write_bytes(b"wheel")
    assert hash_lock("tabulate==0.9.0\n", tmp_path) == (
        f"tabulate==0.9.0 --hash=sha256:{hashlib.sha256(b'wheel').hexdigest()}\n")
    with pytest.raises(PackError, match="numpy==1.26.4"):
        hash_lock("tabulate==0.9.0\nnumpy==1.26.4\n", tmp_path)


def test_dpkg_status_lists_installed_packages_only():
    assert parse_dpkg_status(DPKG_STATUS) == (
        OsPackage("dpkg", "1.21.22", "amd64"),
        OsPackage("libc6", "2.36-9+deb12u4", "amd64", source="glibc"))
    assert parse_os_release('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
                            'VERSION_ID="12"\n# comment\n') == {
        "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)", "ID": "debian", "VERSION_ID": "12"}


def example_sbom(**changes) -> str:
    values = dict(title="embed", version="1", release=resolve(None), base=BASE,
                  os_packages=DEBIAN, environments=[ShippedEnvironment(
                      "/models/pipeline/environment.lock.txt", read_lock(LOCK))])
    values.update(changes)
    return image_sbom(**values)


def test_the_document_is_valid_cyclonedx_and_the_same_bytes_for_the_same_inputs():
    document = example_sbom()
    validate(document)
    assert document == example_sbom()
    data = json.loads(document)
    assert "timestamp" not in data["metadata"]
    other = example_sbom(version="2")
    assert json.loads(other)["serialNumber"] != data["serialNumber"]
    packages = sbom_packages(document)
    assert packages["pkg:pypi/numpy@1.26.4"] == {"name": "numpy", "version": "1.26.4"}
    assert "pkg:pypi/typing-extensions@4.12.2" in packages
    assert "pkg:conda/python@3.11.9?build=hab00c5b_0&channel=conda-forge" in packages
    assert packages["pkg:deb/debian/libc6@2.36-9%2Bdeb12u4?arch=amd64&distro=debian-12"] == {
        "name": "libc6", "version": "2.36-9+deb12u4"}
    assert not any("gone" in purl for purl in packages)
    by_ref = {c["bom-ref"]: c for c in data["components"]}
    assert by_ref["triton"]["version"] == "2.51.0"
    assert by_ref["base-image"]["version"] == BASE.digest
    assert {"name": "triton-builder:stub-route", "value": "release"} in by_ref[
        "python-backend-stub"]["properties"]
    assert [h["content"] for h in by_ref["pkg:pypi/typing-extensions@4.12.2"]["hashes"]] == [
        "a" * 64, "b" * 64]
    root = next(d for d in data["dependencies"] if d["ref"] == "image")
    assert set(root["dependsOn"]) == set(by_ref)


@pytest.mark.parametrize(("triton", "kind", "origin"), [
    ("2.51.0", "pytriton-wheel", "nvidia-pytriton==0.7.0"),
    ("2.53.0", "compile", "python_backend r24.12")])
def test_a_bridged_image_names_its_stub_file_and_the_interpreter_it_carries(triton, kind,
                                                                             origin):
    release = resolve("12.6", triton)
    route = stub_route(release, "3.11")
    assert route is not None and route.kind == kind
    document = example_sbom(
        release=release, os_packages=None,
        stub=ShippedStub(("/models/pipeline/triton_python_backend_stub",), ("ab" * 32,)),
        runtime=PythonRuntime(route, "3.11.2", "python:3.11-slim-bookworm", "sha256:" + "2" * 64))
    validate(document)
    by_ref = {c["bom-ref"]: c for c in json.loads(document)["components"]}
    stub = by_ref["python-backend-stub"]
    assert stub["hashes"] == [{"alg": "SHA-256", "content": "ab" * 32}]
    assert {"name": "triton-builder:from", "value": origin} in stub["properties"]
    assert by_ref["carried-interpreter"]["version"] == "3.11.2"
    assert {"name": "triton-builder:os-packages",
            "value": "not listed: the image has no dpkg status"} in by_ref["base-image"][
        "properties"]
