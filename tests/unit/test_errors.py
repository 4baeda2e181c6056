"""``except TritonBuilderError`` catches every failure of ``build_docker_image`` that is ours:
one of each family, raised for real by the job (the end-to-end suites raise the rest)."""

from __future__ import annotations

import pytest

import builder
from builder import TritonBuilderError, build_docker_image, pipe


def _fails_on_negative(x: float) -> float:
    if x < 0:
        raise ArithmeticError("negative input")
    return x


def _pipeline(example: float = 1.0):
    return pipe.input("x").map("x", "y", _fails_on_negative).output("y").with_example(example)


# Each of these fails before any engine is asked: no Docker needed.
@pytest.mark.parametrize("arguments, family, builtin, message", [
    ({"image_name": "Embed:1"}, builder.InvalidReferenceError, ValueError,
     "not a valid image reference"),
    ({"image_name": "embed:1", "tags": ["bad tag"]}, builder.InvalidReferenceError, ValueError,
     "bad tag"),
    ({"image_name": "embed:1", "cuda": "10.2"}, builder.UnsupportedCudaError, ValueError, "10.2"),
    ({"image_name": "embed:1", "example": -1.0}, builder.OperatorError, ValueError,
     "negative input"),
    ({"image_name": "embed:1", "verify_calls": []}, builder.NothingToVerifyError, ValueError,
     "verification needs at least one call"),
])
def test_each_early_family_is_caught_by_the_root(arguments, family, builtin, message):
    arguments = dict(arguments)
    pipeline = _pipeline(arguments.pop("example", 1.0))
    with pytest.raises(TritonBuilderError, match=message) as caught:
        build_docker_image(pipeline, **arguments)
    assert isinstance(caught.value, family) and isinstance(caught.value, builtin)


@pytest.mark.slow
def test_an_environment_failure_is_caught_by_the_root(docker_client, cpu_base_image, tmp_path):
    missing = tmp_path / "no-such-spec.txt"
    with pytest.raises(TritonBuilderError, match="no-such-spec.txt") as caught:
        build_docker_image(_pipeline(), "triton-builder-test/errors:1", env_specs=[missing],
                           client=docker_client)
    assert isinstance(caught.value, builder.EnvironmentBuildError)
