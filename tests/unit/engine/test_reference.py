"""The one image-reference parser: the distribution grammar, split the way the engine splits."""

from __future__ import annotations

import pytest

from builder import TritonBuilderError
from builder.engine.reference import ImageReference, InvalidReferenceError, tag_references


@pytest.mark.parametrize("text, host, path, tag, repository, registry, registry_path", [
    ("127.0.0.1:5000/team/app:1", "127.0.0.1:5000", "team/app", "1",
     "127.0.0.1:5000/team/app", "127.0.0.1:5000", "team/app"),
    ("localhost/app", "localhost", "app", "latest", "localhost/app", "localhost", "app"),
    ("nvcr.io/nvidia/tritonserver:24.10-py3", "nvcr.io", "nvidia/tritonserver", "24.10-py3",
     "nvcr.io/nvidia/tritonserver", "nvcr.io", "nvidia/tritonserver"),
    ("app:2", None, "app", "2", "app", "registry-1.docker.io", "library/app"),
    ("team/app", None, "team/app", "latest", "team/app", "registry-1.docker.io", "team/app"),
    ("triton-builder/cpu:py3.11", None, "triton-builder/cpu", "py3.11", "triton-builder/cpu",
     "registry-1.docker.io", "triton-builder/cpu"),
])
def test_references_split_like_the_engine_splits_them(text, host, path, tag, repository,
                                                      registry, registry_path):
    parsed = ImageReference.parse(text)
    assert (parsed.host, parsed.path, parsed.tag) == (host, path, tag)
    assert (parsed.repository, parsed.registry, parsed.registry_path) == (
        repository, registry, registry_path)
    assert str(parsed) == (text if ":" in text.rsplit("/", 1)[-1] else f"{text}:latest")


def test_bare_tags_belong_to_the_image_repository_and_every_reference_is_checked():
    assert tag_references("localhost:5000/embed:1", ["2", "latest", "other/name:3", "2"]) == [
        "localhost:5000/embed:1", "localhost:5000/embed:2", "localhost:5000/embed:latest",
        "other/name:3"]
    with pytest.raises(InvalidReferenceError, match="bad tag"):
        tag_references("embed:1", ["bad tag"])


@pytest.mark.parametrize("text", [
    "embed:1\nRUN id", "embed:$(id)", "Embed:1", "embed 1", "embed:1;id", 'embed:"1"',
    "embed:1\\", "-embed", "embed:" + "x" * 129, "", "embed:", "/embed",
])
def test_hostile_image_names_are_refused_as_our_input_errors(text):
    with pytest.raises(InvalidReferenceError, match="not a valid image reference") as caught:
        ImageReference.parse(text)
    assert isinstance(caught.value, TritonBuilderError) and isinstance(caught.value, ValueError)
