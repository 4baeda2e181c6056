"""The image index's bytes: canonical, in the build's platform order, one entry a platform."""

from __future__ import annotations

import hashlib
import json

from builder.engine.platforms import AMD64, ARM64
from builder.push.image_index import INDEX_MEDIA_TYPE, ManifestDescriptor, index_document

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def _entries(order):
    made = {AMD64: ManifestDescriptor(DOCKER_MANIFEST, "sha256:" + "a" * 64, 2423),
            ARM64: ManifestDescriptor(DOCKER_MANIFEST, "sha256:" + "b" * 64, 2425)}
    return {target: made[target] for target in order}


def test_the_index_names_each_platforms_manifest_with_its_platform():
    document = json.loads(index_document(_entries((AMD64, ARM64))))
    assert document["schemaVersion"] == 2 and document["mediaType"] == INDEX_MEDIA_TYPE
    assert [(m["platform"], m["digest"][-1], m["size"], m["mediaType"])
            for m in document["manifests"]] == [
        ({"architecture": "amd64", "os": "linux"}, "a", 2423, DOCKER_MANIFEST),
        ({"architecture": "arm64", "os": "linux", "variant": "v8"}, "b", 2425, DOCKER_MANIFEST)]


def test_the_same_manifests_give_the_same_bytes_and_digest():
    first, second = index_document(_entries((AMD64, ARM64))), index_document(
        _entries((AMD64, ARM64)))
    assert first == second
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest()
    assert b" " not in first and b"\n" not in first
    assert index_document(_entries((ARM64, AMD64))) != first  # the build's order is kept
