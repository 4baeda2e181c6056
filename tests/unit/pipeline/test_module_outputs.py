"""Hugging Face models as users write them: ``ModelOp(BertModel(config))``, outputs by field.

Before issue 38 ``ModelOp(BertModel(config), ...)`` was refused ("the module must return a
tensor or a tuple of tensors, got BaseModelOutputWithPoolingAndCrossAttentions") and, with
``return_dict=False``, the ONNX export failed ("got multiple values for argument 'use_cache'").
"""

from __future__ import annotations

import json
from collections import namedtuple

import numpy as np
import onnxruntime as ort
import pytest
import torch
from google.protobuf import json_format

from builder import ModelOp, build_pipeline_model, pipe
from builder.errors import PipelineError
from builder.pipeline.module_outputs import choose_outputs, describe_outputs
from builder.pipeline.operators import ModelFields
from builder.repository.model_config import read_config

transformers = pytest.importorskip("transformers")

IDS = np.array([2, 17, 33, 5, 61, 9, 3, 0], dtype=np.int64)
MASK = np.array([1, 1, 1, 1, 1, 1, 1, 0], dtype=np.int64)


def bert(**config) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=32, **config))


def test_a_model_output_is_named_by_its_fields_nested_ones_with_dots():
    Pair = namedtuple("Pair", "left right")
    result = {"logits": torch.ones(1), "hidden": None,
              "inner": transformers.modeling_outputs.BaseModelOutputWithPooling(
                  last_hidden_state=torch.ones(1), pooler_output=torch.ones(1)),
              "pair": Pair(torch.ones(1), torch.ones(1))}
    outputs = describe_outputs(result)
    assert outputs.named
    assert outputs.names == ("logits", "inner.last_hidden_state", "inner.pooler_output",
                             "pair.left", "pair.right")
    assert outputs.paths[1] == ("inner", "last_hidden_state")
    assert describe_outputs((torch.ones(1), torch.ones(1))).names == ("output_0", "output_1")
    with pytest.raises(PipelineError, match=r"output_names \['pooled'\] are not fields .* "
                                            r"logits, inner.last_hidden_state"):
        choose_outputs("m", result, ["pooled"])


def test_a_raw_bert_model_builds_with_its_outputs_named_as_hugging_face_names_them(tmp_path):
    op = ModelOp(bert(), example_inputs=(IDS, MASK), name="bert")
    assert op.input_names == ("input_ids", "attention_mask")
    assert op.output_names == ("last_hidden_state", "pooler_output")
    pipeline = (pipe.input("ids", "mask")
                .map(("ids", "mask"), "last_hidden_state", op)
                .output("last_hidden_state")
                .with_example(IDS, MASK))
    assert isinstance(pipeline.nodes[0].op, ModelFields)
    in_process = pipeline(IDS, MASK)
    with torch.no_grad():
        reference = op.module(torch.from_numpy(IDS[None]), torch.from_numpy(MASK[None]))
    np.testing.assert_allclose(in_process, reference.last_hidden_state[0].numpy(), atol=1e-6)

    result = build_pipeline_model(pipeline, tmp_path / "models")
    assert [(m.name, m.format) for m in result.models] == [("bert", "onnx")]
    config = read_config(tmp_path / "models" / "bert")
    assert [t.name for t in config.output] == ["last_hidden_state", "pooler_output"]
    session = ort.InferenceSession(str(tmp_path / "models" / "bert" / "1" / "model.onnx"))
    rows = np.stack([IDS, IDS[::-1]]), np.stack([MASK, MASK])
    served = session.run(["last_hidden_state"], dict(zip(op.input_names, rows)))[0]
    alone = [pipeline(ids, mask) for ids, mask in zip(*rows)]
    np.testing.assert_allclose(served, np.stack(alone), atol=1e-5)


def test_fields_are_chosen_by_output_names_or_by_the_columns_a_map_names():
    model = bert()
    pooled = ModelOp(model, example_inputs=(IDS, MASK), name="pooled",
                     output_names=["pooler_output"])
    assert pooled.output_names == ("pooler_output",) and pooled(IDS, MASK).shape == (32,)
    both = ModelOp(model, example_inputs=(IDS, MASK), name="both")
    pipeline = (pipe.input("ids", "mask")
                .map(("ids", "mask"), ("pooler_output", "last_hidden_state"), both)
                .output("pooler_output", "last_hidden_state").with_example(IDS, MASK))
    pooler, hidden = pipeline(IDS, MASK)
    assert pooler.shape == (32,) and hidden.shape == (8, 32)


def test_return_dict_false_exports_too(tmp_path):
    op = ModelOp(bert(return_dict=False), example_inputs=(IDS, MASK), name="bert_tuple",
                 output_names=["last_hidden_state", "pooler_output"])
    pipeline = (pipe.input("ids", "mask").map(("ids", "mask"), ("hidden", "pooled"), op)
                .output("hidden").with_example(IDS, MASK))
    result = build_pipeline_model(pipeline, tmp_path / "models")
    assert [(m.format, [a.ok for a in m.attempts]) for m in result.models] == [("onnx", [True])]


def test_the_python_format_serves_a_model_output_by_field(tmp_path, monkeypatch):
    from builder.runtime import torch_model
    from tests.support import pb_utils_standin as pb

    op = ModelOp(bert(), example_inputs=(IDS, MASK), name="bert_python",
                 op_config={"format_priority": ["python"]})
    pipeline = (pipe.input("ids", "mask").map(("ids", "mask"), "pooler_output", op)
                .output("pooler_output").with_example(IDS, MASK))
    build_pipeline_model(pipeline, tmp_path / "models")
    directory = tmp_path / "models" / "bert_python"
    monkeypatch.setattr(torch_model, "pb_utils", pb)
    model = torch_model.TritonPythonModel()
    model.initialize({"model_config": json.dumps(json_format.MessageToDict(
                          read_config(directory), preserving_proto_field_name=True)),
                      "model_repository": str(directory), "model_version": "1",
                      "model_instance_kind": "CPU", "model_instance_device_id": "0"})
    (response,) = model.execute([pb.Request({"input_ids": IDS[None],
                                             "attention_mask": MASK[None]})])
    assert not response.has_error()
    served = {t.name(): t.as_numpy() for t in response.output_tensors}
    np.testing.assert_allclose(served["pooler_output"][0], pipeline(IDS, MASK), atol=1e-5)



def test_outputs_are_declared_as_tight_as_the_examples_where_no_input_axis_varies(tmp_path):
    """Tracing names the token axis of ``last_hidden_state``: it was declared ``[-1, 32]``."""
    fixed = ModelOp(bert(), example_inputs=(IDS, MASK), name="fixed",
                    output_names=["last_hidden_state"])
    varying = ModelOp(bert(), example_inputs=(IDS, MASK), name="varying",
                      output_names=["last_hidden_state"],
                      dynamic_axes={"input_ids": [0], "attention_mask": [0],
                                    "last_hidden_state": [0]})
    pipeline = (pipe.input("ids", "mask")
                .map(("ids", "mask"), "a", fixed).map(("ids", "mask"), "b", varying)
                .output("a", "b").with_example(IDS, MASK))
    build_pipeline_model(pipeline, tmp_path / "models")
    dims = {name: [list(t.dims) for t in read_config(tmp_path / "models" / name).output]
            for name in ("fixed", "varying")}
    assert dims == {"fixed": [[8, 32]], "varying": [[-1, 32]]}
