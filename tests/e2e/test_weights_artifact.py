"""Weights beside the image (issue 65, item 3), end to end: ``weights="artifact"``.

The two-model pipeline of ``test_weight_layers`` built and pushed to a registry started for the
test (listening where containers reach it, the engine's bridge gateway). The build verifies the
image with its weights served by the build itself; the push puts each model's artifact in the
repository and an index of image and artifacts under the tag. Then the image runs as a user runs
it: the image holds no weight file (each is a link into the cache); a first start with an
empty cache volume fetches every file from the registry and answers 32 distinct requests sent
at once as the pipeline does in process; a second start with the same volume and the registry
stopped serves from the cache; a start with an empty cache and the registry stopped is never
ready and exits naming the registry.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from builder import build_docker_image
from builder.doctor import weights_cache_check
from builder.runtime.supervisor.main import WEIGHTS_FAILED
from builder.runtime.supervisor.weights_lock import CACHE_DIR, CACHE_VOLUME, LOCK_PATH
from builder.runtime.supervisor.weights_registry import INSECURE_VARIABLE, REGISTRY_VARIABLE
from builder.verify.concurrent import concurrent_check
from builder.verify.container import ContainerError, ServingContainer
from builder.verify.equality import TOLERANCE
from builder.verify.weights_source import bridge_gateway
from tests.e2e.test_weight_layers import _pipeline, _row, doubled
from tests.support.testbed import LocalRegistry

pytestmark = [pytest.mark.slow]
INDEX = "application/vnd.oci.image.index.v1+json"


@pytest.fixture
def registry(tmp_path):
    (tmp_path / "registry").mkdir()
    with LocalRegistry(tmp_path / "registry", bind="0.0.0.0") as running:  # noqa: S104 - containers reach it
        yield running


def _files(docker_client, reference: str, path: str) -> dict[str, tarfile.TarInfo]:
    """Every member under ``path`` in the image, read from a container never started."""
    container = docker_client.containers.create(reference)
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            return {member.name: member for member in archive.getmembers()}
    finally:
        container.remove(force=True)


def test_weights_travel_beside_the_image_and_are_fetched_at_start(docker_client, cpu_base_image,
                                                                   registry):
    reference = f"{registry.host}/triton-builder-test/weights-beside:1"
    pipeline = _pipeline(1, doubled)
    volume = docker_client.volumes.create(f"triton-builder-test-{uuid.uuid4().hex[:8]}")
    source = {REGISTRY_VARIABLE: f"{bridge_gateway(docker_client)}:{registry.port}",
              INSECURE_VARIABLE: "1"}
    mounted = {volume.name: {"bind": CACHE_DIR, "mode": "rw"}}
    calls = [_row(200 + k) for k in range(32)]
    expected = [((call,), pipeline(call)) for call in calls]
    try:
        built = build_docker_image(pipeline, reference, push=True, client=docker_client,
                                   weights="artifact", verify_calls=[(_row(2),)])
        assert built.verification is not None and built.weights_lock is not None
        lock = built.weights_lock
        assert lock.models == ["encoder", "head"] and lock.repository == reference.rsplit(":", 1)[0]
        assert f"-v triton-builder-weights:{CACHE_DIR}" in built.run_command

        members = _files(docker_client, reference, "/models")
        for file in lock.files:
            member = members[file.path.lstrip("/")]
            assert member.issym() and member.linkname.endswith(file.hex), member
        versions = [m.name for m in members.values() if m.isfile()  # every file a link
                    and m.name.split("/")[1] in lock.models and m.name.split("/")[2].isdigit()]
        assert versions == [], versions
        print("pipeline model files over 100 KB:", {m.name: m.size for m in members.values()
              if m.isfile() and m.size > 100_000 and "/environment/" not in m.name})
        (carried,) = _files(docker_client, reference, LOCK_PATH).values()
        assert carried.isfile()

        name, tag = reference.split("/", 1)[1].rsplit(":", 1)
        request = urllib.request.Request(f"http://{registry.host}/v2/{name}/manifests/{tag}",
                                         headers={"Accept": INDEX})
        with urllib.request.urlopen(request, timeout=30) as answer:
            index = json.loads(answer.read())
        named = {entry.get("annotations", {}).get("ai.triton-builder.model")
                 for entry in index["manifests"]}
        assert named == {None, "encoder", "head"}, index

        first = ServingContainer(docker_client, reference, volumes=mounted, environment=source)
        try:
            concurrent_check("pipeline", expected, TOLERANCE, timeout=120)(first.start())
            assert f"(0 from the cache, {len(lock.unique())} fetched)" in first.logs()
        finally:
            first.remove()
        registry.stop()
        started = ServingContainer(docker_client, reference, volumes=mounted, environment=source)
        try:
            endpoint = started.start()
            concurrent_check("pipeline", expected, TOLERANCE, timeout=120)(endpoint)
            assert f"weights in place: {len(lock.unique())} files" in started.logs()
            assert f"({len(lock.unique())} from the cache, 0 fetched)" in started.logs()
        finally:
            started.remove()

        check = weights_cache_check(docker_client)  # the node's cache verification filled
        assert not any(file.digest in check.detail for file in lock.files), check
        node = Path(docker_client.volumes.get(CACHE_VOLUME).attrs["Mountpoint"])
        stray = node / "blobs" / "sha256" / ("e" * 64)
        stray.write_bytes(b"an old model")
        try:
            check = weights_cache_check(docker_client)
            assert check.status == "warn" and f"sha256:{'e' * 64}" in check.detail, check
        finally:
            stray.unlink()

        empty = docker_client.volumes.create(f"triton-builder-test-{uuid.uuid4().hex[:8]}")
        refused = ServingContainer(docker_client, reference, environment={
            **source, "TRITON_BUILDER_WEIGHTS_TIMEOUT_S": "5"},
            volumes={empty.name: {"bind": CACHE_DIR, "mode": "rw"}})
        try:
            began = time.monotonic()
            with pytest.raises(ContainerError, match=f"exited with code {WEIGHTS_FAILED}"):
                refused.start(timeout=120)
            assert time.monotonic() - began < 60
            log = refused.logs()
            assert "cannot start: model operator" in log and "within 5s" in log, log[-2000:]
            assert "started tritonserver" not in log
        finally:
            refused.remove()
            empty.remove(force=True)
    finally:
        try:
            docker_client.images.remove(reference, force=True)
        except Exception:  # noqa: BLE001 - a build may have failed before tagging
            pass
        volume.remove(force=True)
