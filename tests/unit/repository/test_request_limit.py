"""The largest request a pipeline serves: its default, where it is written, the shared memory
it takes."""

from __future__ import annotations

import pytest

from builder import BuildError, build_pipeline_model, pipe
from builder.repository.model_config import read_config
from builder.repository.request_limit import (
    DEFAULT_MAX_REQUEST_BYTES,
    MIB,
    max_request_bytes,
    shm_size,
)


def _echo(x):
    return x


def _pipeline(example):
    return pipe.input("data").map("data", "out", _echo).output("out").with_example(example)


def test_the_default_is_16_mib_unless_the_examples_are_large():
    small = _pipeline(b"x" * 100)
    assert max_request_bytes(None, small.signature(), small.examples) == \
        DEFAULT_MAX_REQUEST_BYTES == 16 * MIB
    large = _pipeline(b"x" * (MIB // 2))  # 64 x half a MiB (and 4 bytes) in whole MiB
    assert max_request_bytes(None, large.signature(), large.examples) == 33 * MIB


def test_an_asked_limit_is_kept_and_checked():
    pipeline = _pipeline(b"x")
    assert max_request_bytes(1000, pipeline.signature(), pipeline.examples) == 1000
    for bad in (0, -1, 1.5, True, "16m"):
        with pytest.raises(BuildError, match="max_request_bytes must be a positive"):
            max_request_bytes(bad, pipeline.signature(), pipeline.examples)


def test_the_pipeline_models_config_carries_the_limit(tmp_path):
    result = build_pipeline_model(_pipeline(b"x"), tmp_path / "models",
                                  max_request_bytes=40 * MIB)
    config = read_config(tmp_path / "models" / "pipeline")
    assert config.parameters["max_request_bytes"].string_value == str(40 * MIB)
    assert result.max_request_bytes == 40 * MIB and result.shm_size == "160m"


def test_a_bad_limit_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(BuildError):
        build_pipeline_model(_pipeline(b"x"), tmp_path / "models", max_request_bytes=0)
    assert not (tmp_path / "models").exists()


def test_the_shared_memory_a_replica_needs():
    """Docker's default 64 MiB holds four requests at the default limit; more asks for more."""
    assert shm_size(DEFAULT_MAX_REQUEST_BYTES) is None
    assert shm_size(100 * MIB) == "400m"
    assert shm_size(16 * MIB + 1) == "65m"
