"""One tag for amd64 and arm64 (issue 32): each platform's image built and verified — arm64
under emulation on this amd64 machine —, one OCI image index pushed under the tag, each digest
confirmed by the registry, and a second clean build giving the same index digest. And the
refusals that come before anything is built: a requirement without an aarch64 wheel, emulation
missing, an unknown platform.

Everything is real: the engine, Debian's arm64 packages, PyTriton's aarch64 Triton run under
qemu-user, Debian's ``docker-registry``, PyPI.

It runs beside other ``alongside`` tests: nothing here is timed (emulated verification has its
own allowance), the refusals look for images of their own titles only, and the builds' images
are removed by their own tags (``remove_images_made``). The second clean build reuses no layer
of anything because it is built with ``--no-cache``, and its payload is this run's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from builder import build_docker_image
from builder.engine import emulation
from builder.engine.emulation import EmulationMissingError
from builder.engine.platforms import UnknownPlatformError
from builder.environment import MissingPlatformWheelError
from builder.image.labels import PLATFORM, PLATFORMS
from builder.image.sbom import PROPERTY
from pipelines.text_embedding import pipeline
from tests.conftest import TEST_IMAGES
from tests.support.engine_images import image_ids, remove_images_made
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.alongside

BOTH = ("linux/amd64", "linux/arm64")
OWN_REQUIREMENT = "idna==3.10"
"""An environment no other test builds, so that no image another test made hands these builds
cached layers."""
NO_AARCH64_WHEEL = "nvidia-pytriton==0.4.0"
"""PyTriton before 0.4.1 published x86-64 wheels only, and no sdist (PyPI's file list)."""


def _nothing_made(client, cache: Path, title: str) -> None:
    """The refused build wrote nothing: its cache (environments, wheels, probes, bases — every
    step writes there first) stayed empty, and no image carries its name. The engine is shared
    with other checkouts' builds, so its image list as a whole may change meanwhile."""
    assert not list(cache.iterdir()), f"the refused build wrote {list(cache.rglob('*'))[:5]}"
    titled = [image["Id"] for image in client.api.images(all=True)
              if (image.get("Labels") or {}).get("org.opencontainers.image.title") == title]
    assert not titled


def test_an_unknown_platform_is_refused_before_anything():
    with pytest.raises(UnknownPlatformError, match="'linux/s390x'"):
        build_docker_image(pipeline, f"{TEST_IMAGES}/never:1",
                           platforms=("linux/amd64", "linux/s390x"), client=None)


def test_a_requirement_without_an_aarch64_wheel_is_refused_by_name_before_building(
        docker_client, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(cache))
    started = time.monotonic()
    with pytest.raises(MissingPlatformWheelError) as refused:
        build_docker_image(pipeline, f"{TEST_IMAGES}/no-wheel:1", platforms=BOTH,
                           requirements=[NO_AARCH64_WHEEL, "tabulate==0.9.0"],
                           client=docker_client)
    print(f"refused in {time.monotonic() - started:.1f}s: {refused.value}")
    message = str(refused.value)
    assert message.startswith(f"{NO_AARCH64_WHEEL} (build options) has no wheel for linux/arm64")
    assert "aarch64" in message and "glibc 2.36" in message
    assert refused.value.requirement == NO_AARCH64_WHEEL
    _nothing_made(docker_client, cache, "no-wheel")


def test_missing_emulation_is_refused_before_building(docker_client, tmp_path, monkeypatch):
    """As on a host where binfmt_misc is not mounted (this one's, before the test bed mounted
    it): the real check reads an empty directory in its place."""
    monkeypatch.setattr(emulation, "BINFMT_MISC", tmp_path / "binfmt_misc")
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(cache))
    with pytest.raises(EmulationMissingError) as refused:
        build_docker_image(pipeline, f"{TEST_IMAGES}/no-emulation:1", platforms=BOTH,
                           client=docker_client)
    message = str(refused.value)
    assert message.startswith("cannot build for linux/arm64:")
    assert "apt-get install qemu-user-static binfmt-support" in message
    assert "update-binfmts --enable qemu-aarch64" in message
    assert "linux/amd64" not in message.split(".")[0]
    _nothing_made(docker_client, cache, "no-emulation")


def _index(registry, repository: str, reference: str) -> dict:
    request = urllib.request.Request(
        f"http://{registry.host}/v2/{repository}/manifests/{reference}",
        headers={"Accept": "application/vnd.oci.image.index.v1+json"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def _clean_build(workdir: Path, reference: str, drain_s: float) -> str:
    """A second build as on a fresh machine (own process, empty cache), unverified, pushed."""
    (workdir / "cache").mkdir(parents=True)
    environment = {key: value for key, value in os.environ.items()  # no OS image named:
                   if key != "SOURCE_DATE_EPOCH"  # the ones base os made are found
                   and not key.startswith("TRITON_BUILDER_OS_IMAGE")}
    environment.update(TRITON_BUILDER_CACHE=str(workdir / "cache"), PYTHONHASHSEED="2")
    program = Path(sys.executable).parent / "triton-builder"
    result = subprocess.run(
        [str(program), "image", f"{REPO_ROOT / 'pipelines' / 'text_embedding.py'}:pipeline",
         "-t", reference, "--platform", "linux/amd64", "--platform", "linux/arm64",
         "--no-verify-platform", "linux/amd64", "--no-verify-platform", "linux/arm64",
         "--requirement", OWN_REQUIREMENT, "--drain-seconds", str(drain_s), "--push",
         "--no-cache"],
        cwd=workdir, env=environment,
        capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


@pytest.mark.slow
def test_one_tag_one_index_each_platform_verified_and_reproducible(
        docker_client, cpu_base_image, arm64_cpu_base_image, registry, tmp_path):
    repository = f"{TEST_IMAGES}/multi-platform"
    reference = f"{registry.host}/{repository}:1"
    before = image_ids(docker_client)
    made = (f"{registry.host}/{repository}:",)
    drain_s = round(2 + time.time() % 997 / 1000, 3)  # this run's payload: see _build_push…
    try:
        _build_push_and_again(docker_client, registry, repository, reference, before, made,
                              tmp_path, drain_s)
    finally:
        remove_images_made(docker_client, before, made)


def _build_push_and_again(docker_client, registry, repository: str, reference: str,
                          before: set[str], made: tuple[str, ...], tmp_path: Path,
                          drain_s: float) -> None:
    """The first build (verified, pushed) and its checks, then the second, clean.

    ``drain_s``, a value of this run's own, is in the payload's Dockerfile: so the payload and
    every layer above it are this run's, never an image an earlier, interrupted run left on the
    engine (which would hand the second build its cached layers)."""
    lines: list[str] = []
    built = build_docker_image(pipeline, reference, platforms=BOTH, push=True,
                               requirements=[OWN_REQUIREMENT], drain_s=drain_s,
                               client=docker_client, on_log=lines.append)
    log = "\n".join(lines)
    assert "linux/arm64 runs under emulation here: allowing" in log

    amd64, arm64 = built.platform_images["linux/amd64"], built.platform_images["linux/arm64"]
    assert arm64.verification.platform == "linux/arm64" and arm64.verification.models
    assert amd64.verification.platform is None
    assert built.id == amd64.id and reference in amd64.tags
    assert arm64.tags == [f"{reference}-arm64"] and f"{reference}-amd64" in amd64.tags
    for name, image in built.platform_images.items():
        attributes = docker_client.api.inspect_image(image.id)
        assert attributes["Architecture"] == name.split("/")[1]
        assert attributes["Config"]["Labels"][PLATFORM] == name
        assert attributes["Config"]["Labels"][PLATFORMS] == ",".join(BOTH)

    index = built.pushed[reference]
    served = _index(registry, repository, "1")
    assert served["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
            for m in served["manifests"]} == index.platforms == {
        name: image.pushed[f"{reference}-{name.split('/')[1]}"].digest
        for name, image in built.platform_images.items()}
    assert index.digest == _digest_of_tag(registry, repository, "1")

    pulled = subprocess.run(["docker", "pull", "--platform", "linux/arm64",
                             f"{registry.host}/{repository}@{index.digest}"],
                            capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr
    assert docker_client.images.get(
        f"{registry.host}/{repository}@{index.digest}").id == arm64.id

    sbom = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "triton-builder"), "inspect", arm64.tags[0],
         "--sbom"], capture_output=True, text=True, check=True).stdout)
    properties = {p["name"]: p["value"] for p in sbom["metadata"]["component"]["properties"]}
    assert properties[PROPERTY + "platform"] == "linux/arm64"
    assert any("arch=arm64" in c.get("purl", "") for c in sbom["components"])
    shown = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "triton-builder"), "inspect", reference],
        capture_output=True, text=True, check=True).stdout)
    assert shown["platforms"]["linux/arm64"]["id"] == arm64.id
    assert shown["platforms"]["linux/amd64"]["tag"] == f"{reference}-amd64"

    remove_images_made(docker_client, before, made)
    log = _clean_build(tmp_path / "machine-2", reference, drain_s)  # the same tag, pushed again
    cached = [line for line in log.splitlines() if "Using cache" in line or "Step" in line]
    assert "Using cache" not in log, f"the second build was handed cached layers: {cached}"
    again = {name: docker_client.api.inspect_image(f"{reference}-{name.split('/')[1]}")
             for name in BOTH}
    assert {name: attributes["Id"] for name, attributes in again.items()} == {
        name: image.id for name, image in built.platform_images.items()}, (
        "another image ID; bases: "
        + str({name: attributes["Config"]["Labels"].get("org.opencontainers.image.base.digest")
               for name, attributes in again.items()}))
    assert _served_platforms(registry, repository, "1") == index.platforms
    assert _digest_of_tag(registry, repository, "1") == index.digest


def _served_platforms(registry, repository: str, tag: str) -> dict[str, str]:
    return {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
            for m in _index(registry, repository, tag)["manifests"]}


def _digest_of_tag(registry, repository: str, tag: str) -> str:
    from builder.engine.registry import manifest_digest

    return manifest_digest(f"{registry.host}/{repository}:{tag}")


def _small_image(client, tmp_path: Path, platform: str, tag: str) -> str:
    """A one-file image of ``platform`` (no RUN step: nothing runs, nothing is emulated)."""
    context = tmp_path / platform.replace("/", "-")
    context.mkdir()
    (context / "payload").write_text(f"built for {platform}\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY payload /payload\n")
    from builder.engine.image_build import build_image

    return build_image(client, context, [tag], platform=platform).id


def test_another_platforms_base_is_pulled_by_its_digest_in_the_index(
        docker_client, registry, tmp_path):
    """The route an NGC release's arm64 base takes (NGC is not reachable here): a
    multi-platform tag of a registry, its arm64 manifest found in the index and pulled by
    digest, the tag's local image (amd64) left where it was."""
    from builder.base import ensure_base_image, pin_platform_variant
    from builder.base.releases import resolve
    from builder.engine.platforms import AMD64, ARM64
    from builder.push import push_image, push_index

    repository = f"{registry.host}/{TEST_IMAGES}/multi-base"
    ids = {target: _small_image(docker_client, tmp_path, target.name,
                                f"{repository}:1-{target.architecture}")
           for target in (AMD64, ARM64)}
    pushed = {target: push_image(docker_client, f"{repository}:1-{target.architecture}")
              for target in (AMD64, ARM64)}
    index = push_index(docker_client, f"{repository}:1", pushed)
    assert index.platforms == {"linux/amd64": pushed[AMD64].digest,
                               "linux/arm64": pushed[ARM64].digest}
    docker_client.images.get(ids[AMD64]).tag(repository, "1")
    docker_client.images.remove(f"{repository}:1-arm64")
    try:
        docker_client.images.remove(ids[ARM64], force=True)
    except Exception:  # noqa: BLE001 - already gone with its tag
        pass

    release = pin_platform_variant(docker_client, resolve("12.6", base_image=f"{repository}:1",
                                                          platform=ARM64))
    assert release.image == f"{repository}@{pushed[ARM64].digest}"
    base = ensure_base_image(docker_client, release)
    assert base.id == ids[ARM64] and base.attrs["Architecture"] == "arm64"
    assert docker_client.images.get(f"{repository}:1").id == ids[AMD64]
    for reference in (f"{repository}:1", f"{repository}:1-amd64", release.image):
        docker_client.images.remove(reference)
