"""An image whose weights travel beside it: the context without weight files, links into the
node cache in their place, the lock, and the Dockerfile's cache volume."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from builder.base.releases import resolve
from builder.engine.context_archive import context_member
from builder.image.context import plan_context
from builder.image.serving_dockerfile import layer_parts, render_serving_dockerfile
from builder.image.serving_image import ImageOptions, WeightsChoiceError
from builder.image.weights_beside import weights_beside, write_cache_directory, write_lock
from builder.push.image_index import ManifestDescriptor, index_document
from builder.push.weights_artifact import WeightsArtifact
from builder.runtime.supervisor.weights_lock import CACHE_DIR, LOCK_PATH, read_lock
from tests.unit.image.test_context import repository  # noqa: F401 - the fixture


def test_weight_files_become_links_into_the_cache_and_the_lock_names_them(repository, tmp_path):  # noqa: F811
    plan, lock, sources = weights_beside(plan_context(repository), "reg.example.com:5000/embed")
    assert not plan.has("weights") and plan.weight_parts() == ()
    data = repository / "encoder" / "1" / "model.onnx.data"
    digest = "sha256:" + hashlib.sha256(data.read_bytes()).hexdigest()
    links = {e.path: e.link for e in plan.layer("code") if e.link is not None}
    assert links["code/models/encoder/1/model.onnx.data"] == \
        f"{CACHE_DIR}/blobs/sha256/{digest.split(':')[1]}"
    assert {(f.model, f.path) for f in lock.files} == {
        ("encoder", "/models/encoder/1/model.onnx"),
        ("encoder", "/models/encoder/1/model.onnx.data")}
    assert lock.repository == "reg.example.com:5000/embed"
    assert sources[next(f for f in lock.files if f.digest == digest)] == data.resolve()
    context = plan.write(tmp_path / "context", ["code"])
    assert os.readlink(context / "code/models/encoder/1/model.onnx.data") == links[
        "code/models/encoder/1/model.onnx.data"]
    write_lock(context / "code", lock)
    assert read_lock(context / "code" / LOCK_PATH.lstrip("/")) == lock
    write_cache_directory(context)
    cache = context / "weights-cache" / CACHE_DIR.lstrip("/")
    assert cache.is_dir() and context_member(cache, "x", 0).mode == 0o1777
    assert context_member(cache.parent, "y", 0).mode == 0o755


def test_a_new_version_of_a_model_changes_the_code_layer(repository):  # noqa: F811
    before, _, _ = weights_beside(plan_context(repository), "r.example.com/x")
    (repository / "encoder" / "1" / "model.onnx.data").write_bytes(b"retrained")
    after, _, _ = weights_beside(plan_context(repository), "r.example.com/x")
    assert before.digest("code") != after.digest("code")


def test_the_payload_holds_the_cache_as_a_volume_of_the_servers_user():
    dockerfile = render_serving_dockerfile(resolve(None), stage="payload",
                                           weights_cache=CACHE_DIR)
    assert "COPY weights-cache/ /" in dockerfile
    assert f'VOLUME ["{CACHE_DIR}"]' in dockerfile
    assert "weights cache" in layer_parts(dockerfile)
    assert "VOLUME" not in render_serving_dockerfile(resolve(None), stage="payload")


def test_an_unknown_weights_choice_is_refused():
    with pytest.raises(WeightsChoiceError, match="weights must be one of image, artifact, "
                                                 "not 'registry'"):
        ImageOptions(weights="registry")


def test_the_index_names_the_weights_beside_the_image():
    from builder.engine.platforms import parse_platform

    image = ManifestDescriptor("application/vnd.oci.image.manifest.v1+json", "sha256:" + "1" * 64,
                               500)
    artifact = WeightsArtifact("encoder", "sha256:" + "2" * 64, 300, (), 0)
    document = index_document({parse_platform("linux/amd64"): image}, [artifact])
    entries = json.loads(document)["manifests"]
    assert entries[0]["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entries[1]["platform"] == {"architecture": "unknown", "os": "unknown"}
    assert entries[1]["annotations"] == {"ai.triton-builder.model": "encoder"}
