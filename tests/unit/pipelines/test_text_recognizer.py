"""The text recognizer's decoder sizes: the deeper one the streaming benchmark uses answers as its
ONNX export does, at every token length (``nn.TransformerDecoderLayer`` exported so fixed the
example's length: its served steps failed)."""

from __future__ import annotations

import numpy as np
import onnxruntime
import torch

from builder.repository.export import ONNX_OPSET
from pipelines.text_recognizer import BOS, DIM, MAX_STEPS, Decoder


def test_a_deeper_decoder_exports_with_a_variable_token_axis(tmp_path):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        decoder = Decoder(deep_layers=2, deep_width=64).eval()
    memory = torch.randn(1, 24, DIM)
    path = tmp_path / "decoder.onnx"
    torch.onnx.export(decoder, (torch.tensor([[BOS, 5, 7]]), memory), str(path),
                      input_names=["tokens", "memory"], output_names=["logits"],
                      dynamic_axes={"tokens": {0: "batch", 1: "steps"}, "memory": {0: "batch"},
                                    "logits": {0: "batch", 1: "steps"}},
                      opset_version=ONNX_OPSET, dynamo=False)  # the builder's first exporter
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for steps in (1, 4, MAX_STEPS):
        tokens = torch.randint(2, 18, (3, steps))
        tokens[:, 0] = BOS
        with torch.no_grad():
            expected = decoder(tokens, memory.expand(3, -1, -1)).numpy()
        (served,) = session.run(None, {"tokens": tokens.numpy(),
                                       "memory": memory.expand(3, -1, -1).numpy()})
        np.testing.assert_allclose(served, expected, atol=1e-4)


def test_the_examples_decoder_has_no_deeper_layers():
    assert not any(name.startswith(("deep", "widen", "narrow"))
                   for name in Decoder().state_dict())


def test_lines_that_join_a_running_decode_between_steps_read_as_alone():
    """Served, streams that arrive while others decode join their loop (``admits_rows``): each
    reads what it reads alone, and the rows of every stream in flight share each step's
    decoder call."""
    from builder.pipeline.streaming import execute_stream
    from pipelines.text_recognizer import streaming_pipeline
    from tests.support.example_inputs import text_lines

    lines = text_lines()[:6]
    alone = [list(streaming_pipeline.stream(line)) for line in lines]
    assert max(len(chars) for chars in alone) > 2
    waiting = [[], [(lines[1],), (lines[2],)], [], [(line,) for line in lines[3:]]]
    plan, part = streaming_pipeline.plan, streaming_pipeline.streaming
    decoder = plan.nodes[part.node].op.decoder.decoder
    rows_per_call: list[int] = []
    call_batch = decoder.call_batch
    decoder.call_batch = lambda rows: rows_per_call.append(len(rows)) or call_batch(rows)
    try:
        events = list(execute_stream(plan, part, [(lines[0],)],
                                     arrivals=lambda: waiting.pop(0) if waiting else []))
    finally:
        del decoder.call_batch
    read = [[e.outputs["char"] for e in events if e.call == call and not e.final]
            for call in range(len(lines))]
    assert read == alone
    assert max(rows_per_call) >= 4  # rows that arrived at different steps share a call


def test_the_decoder_lets_go_of_a_line_once_it_has_ended():
    """A served decode that streams join may never end: a line stopped mid-decode (a cancelled
    stream) leaves it, its memory with it, while the others decode on."""
    import gc
    import weakref

    from builder.pipeline.streaming import StepControl
    from pipelines.text_recognizer import normalize, render, streaming_pipeline

    plan = streaming_pipeline.plan
    (encoder,) = [n.op for n in plan.nodes if getattr(n.op, "name", "") == "recognizer_encoder"]
    greedy = plan.nodes[streaming_pipeline.streaming.node].op.decoder
    steps = greedy.steps([(encoder(normalize(render("0a1b2c"))),)])
    assert list(next(steps)) == [0]
    joining = encoder(normalize(render("d3")))
    memory = weakref.ref(joining)
    assert sorted(steps.send(StepControl((), [(joining,)]))) == [0, 1]
    del joining
    assert list(steps.send(StepControl({1}))) == [0]  # the joined line is stopped
    gc.collect()
    assert memory() is None
    assert list(steps.send(StepControl())) == [0]
