"""End to end on the real engine: repository → verified image → registry → pulled by digest.

The sample repository (a python model and an ONNX model exported from torch) is built once on
the CPU base for the module; the tests around it check what users see: answers over gRPC and
HTTP equal to the in-process results, labels, the skipped rebuild, the code-only rebuild that
reuses every layer but the last, the push and pull by digest, and failures that leave no tag.
"""

from __future__ import annotations

import json
import re
import shutil

import docker.errors
import numpy as np
import pytest

from builder.base import BaseOptions
from builder.engine.image_build import ImageBuildError
from builder.engine.image_listing import listed_images
from builder.image import ImageOptions
from builder.image.serving_image import PAYLOAD_REPOSITORY, payload_reference
from builder.job import build_image_from_repository
from builder.verify import VerifyOptions
from builder.verify.verification import InferenceCheck, VerificationError, verify_image
from tests.support.sample_repository import (
    FEATURES,
    expected_linear,
    expected_scale,
    write_sample_repository,
)

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

IMAGE = "triton-builder-test/image:1"
LABELLED = ImageOptions(version="1.0.0", revision="0123abc",
                        labels={"org.opencontainers.image.source": 'https://example.com/a"b$c\\d'})
X = np.random.default_rng(5).standard_normal((3, FEATURES)).astype(np.float32)


def _checks(scale=expected_scale):
    """One request per model over gRPC and HTTP, against the in-process (torch / numpy) result."""
    return [InferenceCheck("scale", {"X": X}, {"Y": scale(X)}),
            InferenceCheck("linear", {"INPUT": X}, {"OUTPUT": expected_linear(X)}, atol=1e-5)]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return write_sample_repository(tmp_path_factory.mktemp("image") / "models")


@pytest.fixture(scope="module")
def built(docker_client, cpu_base_image, repository):
    log: list[str] = []
    result = build_image_from_repository(
        repository, image_name=IMAGE, tags=["latest"], checks=_checks(), client=docker_client,
        image=LABELLED, on_log=log.append)
    yield result, log
    for tag in result.tags:
        _remove(docker_client, tag)
    _remove(docker_client, payload_reference(result.labels["ai.triton-builder.payload-hash"]))


def _remove(client, reference):
    try:
        client.images.remove(reference, force=True)
    except docker.errors.ImageNotFound:
        pass


def _tag_exists(client, reference) -> bool:
    try:
        client.images.get(reference)
        return True
    except docker.errors.ImageNotFound:
        return False


def test_the_image_is_built_verified_and_tagged(built, docker_client):
    result, log = built
    assert result.built and result.verification is not None
    assert result.verification.models == ["linear", "scale"]
    assert not result.verification.gpus  # no GPU on this machine: the CPU path
    assert result.tags == [IMAGE, "triton-builder-test/image:latest"]
    for tag in result.tags:
        assert docker_client.images.get(tag).id == result.id
    assert any(line.startswith("Step ") for line in log)
    assert log[-1] == f"run it: {result.run_command}"
    assert result.run_command == ("docker run --rm -p 8000:8000 -p 8001:8001 "
                                  f"-p 8002:8002 {IMAGE}")


def test_the_container_answers_over_grpc_and_http_like_in_process(built, docker_client):
    """Started again as a user would, the image answers both protocols like torch/numpy do."""
    result, _ = built
    verification = verify_image(docker_client, IMAGE, _checks())
    assert verification.models == ["linear", "scale"]


def test_labels_describe_the_image(built, docker_client):
    result, _ = built
    labels = docker_client.images.get(IMAGE).labels
    assert labels["org.opencontainers.image.version"] == "1.0.0"
    assert labels["org.opencontainers.image.revision"] == "0123abc"
    assert labels["org.opencontainers.image.source"] == 'https://example.com/a"b$c\\d'
    assert labels["org.opencontainers.image.base.name"] == result.release.image
    assert labels["org.opencontainers.image.base.digest"].startswith("sha256:")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                        labels["org.opencontainers.image.created"])
    assert labels["ai.triton-builder.triton-version"] == "2.51.0"
    assert labels["ai.triton-builder.cuda"] == "cpu"
    assert labels["ai.triton-builder.content-hash"] == result.content_hash
    assert labels["ai.triton-builder.environment-hash"] == "none"
    signature = json.loads(labels["ai.triton-builder.signature"])
    assert signature["models"]["linear"] == {
        "max_batch_size": 64,
        "inputs": [{"name": "INPUT", "dtype": "TYPE_FP32", "shape": [FEATURES]}],
        "outputs": [{"name": "OUTPUT", "dtype": "TYPE_FP32", "shape": [3]}]}


def test_unchanged_inputs_skip_the_build(built, docker_client, repository):
    result, _ = built
    again = build_image_from_repository(repository, image_name=IMAGE, tags=["latest"],
                                        image=LABELLED, client=docker_client,
                                        on_log=lambda line: None)
    assert not again.built and again.id == result.id and again.verification is None


def test_a_code_only_change_rebuilds_only_the_last_layer(built, docker_client, repository,
                                                          tmp_path):
    result, _ = built
    changed = tmp_path / "models"
    shutil.copytree(repository, changed, symlinks=True)
    model = changed / "scale" / "1" / "model.py"
    model.write_text(model.read_text().replace("2 * x + 1", "2 * x + 2"))
    log: list[str] = []
    reference = "triton-builder-test/image:code-change"
    rebuilt = build_image_from_repository(
        changed, image_name=reference, client=docker_client,
        image=ImageOptions(version="1.0.0"),
        checks=_checks(scale=lambda x: (2 * x + 2).astype(np.float32)), on_log=log.append)
    try:
        assert rebuilt.built and rebuilt.id != result.id
        assert rebuilt.payload_id == result.payload_id
        assert any(line.startswith("payload layers reused") for line in log)
        old_image = docker_client.images.get(result.id)
        new_image = docker_client.images.get(rebuilt.id)
        old_layers = old_image.attrs["RootFS"]["Layers"]
        new_layers = new_image.attrs["RootFS"]["Layers"]
        assert len(new_layers) == len(old_layers)
        assert new_layers[:-1] == old_layers[:-1]
        assert new_layers[-1] != old_layers[-1]
        # The history says the same: every step up to the code's COPY — base, payload, runtime
        # scripts — is the same step; the code's COPY (with the bill of materials) is new, and
        # after it come metadata steps without content.
        old_steps = [(h["CreatedBy"], h["Size"]) for h in reversed(old_image.history())]
        new_steps = [(h["CreatedBy"], h["Size"]) for h in reversed(new_image.history())]
        code = max(index for index, (by, _) in enumerate(new_steps) if " COPY " in by)
        assert new_steps[:code] == old_steps[:code]
        assert new_steps[code] != old_steps[code] and new_steps[code][1] > 0
        assert all(size == 0 for _, size in new_steps[code + 1:])
    finally:
        _remove(docker_client, reference)


def test_push_remove_pull_by_digest_still_answers(docker_client, cpu_base_image, repository,
                                                  registry):
    reference = f"{registry.host}/triton-builder-test/image:1"
    result = build_image_from_repository(repository, image_name=reference, checks=_checks(),
                                         push=True, client=docker_client,
                                         on_log=lambda line: None)
    pushed = result.pushed[reference]
    assert pushed.digest.startswith("sha256:")
    docker_client.images.remove(reference, force=True)
    assert not _tag_exists(docker_client, reference)
    pulled = docker_client.images.pull(pushed.pinned)
    try:
        assert pulled.id == result.id
        verify_image(docker_client, pushed.pinned, _checks())
    finally:
        _remove(docker_client, pushed.pinned)


def test_a_failing_verification_raises_with_the_logs_and_leaves_no_tag(
        docker_client, cpu_base_image, repository, tmp_path):
    """A model that fails to load: the image builds, the server exits, its log says why."""
    broken = tmp_path / "models"
    shutil.copytree(repository, broken, symlinks=True)
    model = broken / "scale" / "1" / "model.py"
    model.write_text(model.read_text() + (
        "\n    def initialize(self, args):\n"
        "        raise RuntimeError('broken on purpose')\n"))
    reference = "triton-builder-test/broken-verification:1"
    with pytest.raises(VerificationError, match="exited with code") as failure:
        build_image_from_repository(broken, image_name=reference, client=docker_client,
                                    verify=VerifyOptions(timeout_s=120),
                                    on_log=lambda line: None)
    assert "broken on purpose" in failure.value.logs
    assert "broken on purpose" in str(failure.value)
    assert not _tag_exists(docker_client, reference)
    leftovers = listed_images(docker_client, all=True, filters={
        "label": "org.opencontainers.image.title=broken-verification"})
    assert leftovers == []


@pytest.fixture(scope="module")
def shell_less_image(docker_client, tmp_path_factory):
    """An image without /bin/sh: any RUN step fails on it (a real failing build step)."""
    context = tmp_path_factory.mktemp("no-shell")
    (context / "hello").write_text("no shell here\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY hello /hello\n")
    tag = "triton-builder-test/no-shell:1"
    docker_client.images.build(path=str(context), tag=tag, rm=True)
    yield tag
    _remove(docker_client, tag)


def test_a_failing_build_step_raises_with_its_output_and_leaves_no_tag(
        docker_client, shell_less_image, repository):
    reference = "triton-builder-test/broken-build:1"
    with pytest.raises(ImageBuildError) as failure:
        build_image_from_repository(repository, image_name=reference,
                                    base=BaseOptions(base_image=shell_less_image),
                                    image=ImageOptions(user="triton"),
                                    client=docker_client, on_log=lambda line: None)
    assert "useradd" in failure.value.step
    assert "no such file or directory" in str(failure.value).lower()
    assert not _tag_exists(docker_client, reference)


def test_payload_images_are_cached_under_one_repository(built, docker_client):
    result, _ = built
    cached = listed_images(docker_client, name=PAYLOAD_REPOSITORY)
    assert result.payload_id in {image.id for image in cached}

