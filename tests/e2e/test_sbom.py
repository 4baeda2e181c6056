"""The bill of materials against real parts: a packed lock, a Debian image, the example image.

The lock is made by the project's venv packer (``envs/tabulate-demo.txt``) and its hashes are
checked by pip against the package index; the example image's SBOM is read with
``triton-builder inspect IMAGE --sbom`` and checked against the lock that image ships.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from builder.environment.lock import read_lock
from builder.image.os_packages import image_os_packages
from builder.image.sbom import ShippedEnvironment
from tests.support.paths import REPO_ROOT
from tests.unit.cli.test_commands import cli
from tests.unit.image.test_sbom import example_sbom, validate

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

SPEC = REPO_ROOT / "envs" / "tabulate-demo.txt"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from builder.environment.spec import load_spec
    from builder.environment.tarball import pack_environment
    from builder.environment.target import host_target

    return pack_environment(load_spec([SPEC]), host_target(),
                            cache=tmp_path_factory.mktemp("environments"))


def test_the_packers_lock_carries_the_wheels_real_hashes_into_the_sbom(packed, tmp_path):
    """pip itself checks the lock's hashes against the wheels of the package index."""
    lock = packed.lock.read_text()
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
                    "--only-binary=:all:", "-d", str(tmp_path), "-r", str(packed.lock)],
                   check=True, capture_output=True)
    document = example_sbom(environments=[ShippedEnvironment("/models/x/environment.lock.txt",
                                                      read_lock(lock))])
    validate(document)
    components = {c.get("purl"): c for c in json.loads(document)["components"]}
    for package in read_lock(lock):
        component = components[f"pkg:pypi/{package.name.lower()}@{package.version}"]
        assert component["version"] == package.version
        assert [f"sha256:{h['content']}" for h in component["hashes"]] == list(package.hashes)
    assert {p.name for p in read_lock(lock)} >= {"numpy", "tabulate"}


def test_the_os_packages_of_the_debian_image(docker_client, os_image):
    listed = image_os_packages(docker_client, docker_client.images.get(os_image).id)
    assert listed is not None and (listed.distribution, listed.distribution_version) == (
        "debian", "12")
    names = {package.name for package in listed.packages}
    assert {"dpkg", "libc6", "libpython3.11"} <= names


def test_inspect_sbom_lists_every_package_of_the_images_environment_lock(
        docker_client, text_embedding_image):
    """The lock is read from the image with ``docker run`` (not the SBOM's own reader)."""
    labels = docker_client.images.get(text_embedding_image).labels
    assert labels["ai.triton-builder.sbom"] == "/opt/triton-builder/sbom.cdx.json"
    document = cli("inspect", text_embedding_image, "--sbom").stdout
    validate(document)
    found = docker_client.containers.run(
        text_embedding_image, ["sh", "-c", "find /models -name environment.lock.txt -type f "
                               "-exec cat {} +"], remove=True).decode()
    locked = read_lock(found)
    assert {"cloudpickle", "numpy", "onnxruntime"} <= {package.name for package in locked}
    assert all(package.hashes for package in locked)
    components = {c.get("purl"): c for c in json.loads(document)["components"]}
    for package in locked:
        component = components.get(f"pkg:pypi/{package.name.lower().replace('_', '-')}@"
                                   f"{package.version}")
        assert component is not None, f"{package.name}=={package.version} is not in the SBOM"
        assert component["version"] == package.version
        assert [f"sha256:{h['content']}" for h in component["hashes"]] == list(package.hashes)
    by_ref = {c["bom-ref"]: c for c in json.loads(document)["components"]}
    assert by_ref["triton"]["version"] == labels["ai.triton-builder.triton-version"]
    assert by_ref["base-image"]["version"] == labels["org.opencontainers.image.base.digest"]
    assert any(purl and purl.startswith("pkg:deb/debian/libc6@") for purl in components)
