"""Where model operators run, by target: the ``instance_group`` of every generated config.

The three example pipelines are built for the CPU base and for three NGC releases (22.12,
before BLS had ``PreferredMemory``; 24.05; 25.11, CUDA 13), with and without ``op_config``,
and each ``config.pbtxt`` is read back through Triton's own protobuf (``model_config_pb2``).
"""

from __future__ import annotations

import copy

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from builder import build_pipeline_model
from builder.base.releases import resolve
from builder.errors import BuildError, PipelineError
from builder.pipeline.op_config import validate_op_config
from builder.repository.model_config import read_config
from tests.support.example_inputs import EXAMPLES

CPU, GPU = mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_GPU

TARGETS = {
    "cpu": resolve(None),
    "22.12": resolve("11.8", "22.12"),
    "24.05": resolve("12.4", "24.05"),
    "25.11": resolve("13.0", "25.11"),
}

MODEL_OPS = {
    "text_embedding": ["text_encoder"],
    "image_classification": ["image_classifier"],
    "text_recognizer": ["recognizer_encoder", "recognizer_decoder"],
}


def _build(tmp_path, example: str, target_name: str, first_op_config=None, op_defaults=None):
    pipeline = copy.deepcopy(EXAMPLES[example][0])
    if first_op_config is not None:
        op = pipeline.model_ops()[0]
        op.op_config = validate_op_config(first_op_config, op.name)
    root = tmp_path / "models"
    build_pipeline_model(pipeline, root, name=example, target=TARGETS[target_name],
                         op_defaults=op_defaults)
    return {path.parent.name: read_config(path.parent) for path in root.glob("*/config.pbtxt")}


def _groups(config: mc.ModelConfig) -> list[tuple[int, int, list[int]]]:
    return [(group.kind, group.count, list(group.gpus)) for group in config.instance_group]


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("example", list(MODEL_OPS))
def test_without_op_config_models_go_to_the_targets_gpus(tmp_path, example, target):
    configs = _build(tmp_path, example, target)
    assert sorted(configs) == sorted([example, *MODEL_OPS[example]])
    expected = [(CPU if target == "cpu" else GPU, 1, [])]
    for name in MODEL_OPS[example]:
        assert _groups(configs[name]) == expected, name
    assert _groups(configs[example]) == [(CPU, 1, [])]  # the pipeline model stays on the CPU


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("example", list(MODEL_OPS))
def test_op_config_count_device_and_pins(tmp_path, example, target):
    gpu = target != "cpu"
    first, *rest = MODEL_OPS[example]

    counted = _build(tmp_path / "count", example, target, op_defaults={"instance_count": 3})
    for name in MODEL_OPS[example]:
        assert _groups(counted[name]) == [(GPU if gpu else CPU, 3, [])], name

    on_cpu = _build(tmp_path / "cpu", example, target, first_op_config={"device": "cpu"})
    assert _groups(on_cpu[first]) == [(CPU, 1, [])]
    for name in rest:
        assert _groups(on_cpu[name]) == [(GPU if gpu else CPU, 1, [])], name
    assert _groups(on_cpu[example]) == [(CPU, 1, [])]

    pins = {"device_ids": [1, 2], "instance_count": 2}
    if not gpu:
        with pytest.raises(BuildError, match=rf"{first}.*GPUs \[1, 2\].*CPU base"):
            _build(tmp_path / "pinned", example, target, first_op_config=pins)
        assert not (tmp_path / "pinned" / "models").exists()
        return
    pinned = _build(tmp_path / "pinned", example, target, first_op_config=pins)
    assert _groups(pinned[first]) == [(GPU, 2, [1, 2])]
    for name in rest:
        assert _groups(pinned[name]) == [(GPU, 1, [])], name


def test_without_a_target_only_explicit_requests_make_gpu_models(tmp_path):
    pipeline = copy.deepcopy(EXAMPLES["text_recognizer"][0])
    encoder, decoder = pipeline.model_ops()
    decoder.op_config = validate_op_config({"device": "gpu"}, decoder.name)
    build_pipeline_model(pipeline, tmp_path / "models", name="text_recognizer")
    assert _groups(read_config(tmp_path / "models" / encoder.name)) == [(CPU, 1, [])]
    assert _groups(read_config(tmp_path / "models" / decoder.name)) == [(GPU, 1, [])]


def test_device_is_checked_where_op_config_is_given():
    with pytest.raises(PipelineError, match=r"'enc'.*op_config\['device'\] must be one of"):
        validate_op_config({"device": "cuda"}, "enc")
    with pytest.raises(PipelineError, match=r"'enc'.*pins GPUs \[0\].*device 'cpu'"):
        validate_op_config({"device": "cpu", "device_ids": [0]}, "enc")


def test_before_23_04_gpu_models_bring_torch_into_the_environment_for_dlpack():
    from builder.environment.prepare import _dlpack_requirements

    assert _dlpack_requirements(TARGETS["22.12"], ["text_encoder"]).requirements == ("torch",)
    assert "GPU outputs of text_encoder read via dlpack" in _dlpack_requirements(
        TARGETS["22.12"], ["text_encoder"]).where("torch")
    assert _dlpack_requirements(TARGETS["22.12"], []).requirements == ()
    assert _dlpack_requirements(TARGETS["24.05"], ["text_encoder"]).requirements == ()
    assert _dlpack_requirements(TARGETS["cpu"], []).requirements == ()


def test_model_operators_run_in_the_pipeline_model_only_on_the_cpu_base(tmp_path):
    """The CPU base runs ONNX model operators in the pipeline model (its environment gets the
    CPU base's onnxruntime pin); GPU releases keep BLS to the native backends."""
    from builder.base.cpu import cpu_backend_requirements
    from builder.environment.prepare import _in_process_requirements

    found = {}
    for name in ("cpu", "24.05"):
        result = build_pipeline_model(EXAMPLES["text_embedding"][0], tmp_path / name,
                                      target=TARGETS[name])
        found[name] = [(m.name, m.in_process) for m in result.models]
        requirements = _in_process_requirements(result.models, "3.11")
        assert requirements == ([r for r in cpu_backend_requirements("3.11")
                                 if r.startswith("onnxruntime==")] if name == "cpu" else [])
    assert found == {"cpu": [("text_encoder", True)], "24.05": [("text_encoder", False)]}
