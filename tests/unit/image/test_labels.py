"""Image labels: what they say, and what takes part in the content hash."""

from __future__ import annotations

import json

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.base.releases import resolve
from builder.build_epoch import BuildEpochError
from builder.image.labels import (
    CREATED,
    INPUTS,
    created_timestamp,
    hashed,
    image_inputs,
    repository_signature,
    serving_labels,
)
from builder.verify.container import docker_run_command


def _labels(**changes):
    values = dict(release=resolve("12.6", "24.12"),
                  image_name="registry.example.com:5000/team/embed:2",
                  base_digest="sha256:abc", environment_hash="e1", signature={"x": 1})
    values.update(changes)
    return serving_labels(**values)


def test_oci_and_tool_labels():
    labels = _labels(revision="deadbeef")
    assert labels["org.opencontainers.image.title"] == "embed"
    assert labels["org.opencontainers.image.version"] == "2"
    assert labels["org.opencontainers.image.revision"] == "deadbeef"
    assert labels["org.opencontainers.image.base.name"] == "nvcr.io/nvidia/tritonserver:24.12-py3"
    assert labels["org.opencontainers.image.base.digest"] == "sha256:abc"
    assert labels["ai.triton-builder.triton-version"] == "2.53.0"
    assert labels["ai.triton-builder.cuda"] == "12.6"
    assert labels["ai.triton-builder.python-version"] == "3.12"
    assert labels["ai.triton-builder.min-driver"] == "560"
    assert labels["ai.triton-builder.environment-hash"] == "e1"
    assert json.loads(labels["ai.triton-builder.signature"]) == {"x": 1}


def test_created_follows_source_date_epoch_and_stays_out_of_the_hash(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert created_timestamp() == "2023-11-14T22:13:20Z"
    first = {**_labels(), CREATED: "2023-11-14T22:13:20Z"}
    second = {**_labels(), CREATED: "2030-01-01T00:00:00Z"}
    assert hashed(first) == hashed(second)
    assert hashed(first) != hashed({**_labels(environment_hash="e2"), CREATED: "x"})


def test_created_is_never_the_clock(monkeypatch):
    """Without SOURCE_DATE_EPOCH two builds of the same inputs still carry the same date."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert created_timestamp() == "2000-01-01T00:00:00Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(BuildEpochError, match="SOURCE_DATE_EPOCH='yesterday'"):
        created_timestamp()


def test_the_repository_signature_summarises_configs_and_keeps_pipeline_signatures(tmp_path):
    carried = {"version": 1, "inputs": {"text": {"dtype": "TYPE_STRING", "dims": []}},
               "outputs": {"vector": {"dtype": "TYPE_FP32", "dims": [8]}}}
    config = mc.ModelConfig(
        name="pipeline", backend="python", max_batch_size=4,
        input=[mc.ModelInput(name="text", data_type=mc.TYPE_STRING, dims=[1])],
        output=[mc.ModelOutput(name="vector", data_type=mc.TYPE_FP32, dims=[8])])
    config.parameters["pipeline_signature"].string_value = json.dumps(carried)
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "config.pbtxt").write_text(text_format.MessageToString(config))
    summary = repository_signature(tmp_path)
    assert summary["models"]["pipeline"]["inputs"] == [
        {"name": "text", "dtype": "TYPE_STRING", "shape": [1]}]
    assert summary["pipelines"] == {"pipeline": carried}


def test_the_run_command_users_copy():
    assert docker_run_command("embed:1") == (
        "docker run --rm --gpus=all -p 8000:8000 -p 8001:8001 -p 8002:8002 embed:1")
    assert "--gpus" not in docker_run_command("embed:1", gpus=False)


def test_the_inputs_are_named_by_the_labels_that_record_them():
    labels = {**_labels(), CREATED: "2000-01-01T00:00:00Z", "ai.triton-builder.content-hash": "c"}
    inputs = image_inputs(labels)
    assert inputs[CREATED] == {
        "value": "2000-01-01T00:00:00Z",
        "stands for": "the build's epoch: SOURCE_DATE_EPOCH, else 2000-01-01"}
    assert inputs["org.opencontainers.image.base.digest"]["value"] == "sha256:abc"
    assert inputs["ai.triton-builder.environment-hash"]["value"] == "e1"
    assert set(inputs) <= set(INPUTS) and "ai.triton-builder.signature" not in inputs
