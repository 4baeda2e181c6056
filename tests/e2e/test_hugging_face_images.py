"""Answers that never depend on another request, and Hugging Face models as users write them
(issue 38), built as images, served, and compared with the in-process pipeline under 16
concurrent clients.

* The three row-mixing pipelines of the issue — a model with a batch mean, a ``@vectorized``
  batch maximum, CLIP's ``logits_per_image`` — are refused before any image is built. Before
  the check they built, passed verification (one request at a time) and then answered 84 and 56
  of 96 concurrent requests wrongly, and CLIP failed every one (``output does not fit its
  type``). With the opt-outs (``op_config={"max_batch_size": 0}``, ``@vectorized(batch=False)``)
  they build and every concurrent answer equals in process.
* ViT (hidden states ``[17, 32]``) and transformers' ResNet classifier serve beside them,
  batched, as in process.
* A raw ``BertModel`` (its ``ModelOutput``'s ``last_hidden_state`` by name) and one with
  ``return_dict=False``, behind a real ``BertTokenizerFast`` with one token length per text,
  build, serve and answer as in process. Before, the first was refused and the second failed
  its ONNX export.

Models are built from their configs with seeded random weights: nothing is downloaded.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from builder import ModelOp, build_docker_image, pipe, vectorized
from builder.client.pipeline import Client
from builder.engine.image_listing import listed_images
from builder.errors import RowDependenceError
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from tests.support.engine_images import remove_images_made
from tests.support.tiny_models import Centered

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.alongside]
CLIENTS = 16
TEXTS = ["hello world", "a seal of the river office", "red", "stamp", "the quick brown fox",
         "jumps over the lazy dog again", "ocr", "hello", "world of seals and stamps", "x y z"]
WORDS = sorted({w for text in TEXTS for w in text.split()} | set("abcdefghijklmnopqrstuvwxyz"))
ROW = np.array([0.5, -1.0, 2.0, 3.5], dtype=np.float32)


def by_batch_max(v):
    return v / np.abs(v).max()


def clip_model():
    torch.manual_seed(0)
    return transformers.CLIPModel(transformers.CLIPConfig(
        text_config=dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=16, bos_token_id=0,
                         eos_token_id=2, pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8),
        projection_dim=16))


def clip_inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(3, 99, 7).astype(np.int64),
            rng.random((3, 32, 32), dtype=np.float32))


def row_mixing_pipelines(opt_out: bool) -> dict[str, object]:
    """The issue's three pipelines, refused as written; with the opt-outs when ``opt_out``."""
    one_row = {"max_batch_size": 0} if opt_out else {}
    centered = ModelOp(Centered(), example_inputs=ROW, name="centered", op_config=one_row)
    scaled = vectorized(by_batch_max, batch=not opt_out)
    clip = ModelOp(clip_model(), example_inputs=clip_inputs(0), name="clip", op_config=one_row)
    return {
        "centered": pipe.input("x").map("x", "y", centered).output("y").with_example(ROW),
        "scaled": pipe.input("x").map("x", "y", scaled).output("y").with_example(ROW),
        "clip": (pipe.input("ids", "pixels")
                 .map(("ids", "pixels"), "logits_per_image", clip)
                 .output("logits_per_image").with_example(*clip_inputs(0))),
    }


class Tokenize:
    """A real ``BertTokenizerFast`` (:func:`bert_tokenizer`): one text → its own number of
    tokens."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text):
        encoded = self.tokenizer(text, return_tensors="np")
        return encoded["input_ids"][0], encoded["attention_mask"][0]


@vectorized
def mean_pool(hidden, mask):
    weights = mask[:, :, None].astype(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def bert_tokenizer():
    """A real ``BertTokenizerFast`` over the test's words. Built from the vocabulary itself:
    transformers 5 ignores ``vocab_file=`` (a tokenizer of 5 tokens that makes every word
    ``[UNK]``, issue 68)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tokenizer = transformers.BertTokenizerFast(vocab=dict(zip(words, range(len(words)))))
    assert tokenizer.vocab_size == len(words)
    assert tokenizer.tokenize("hello world") == ["hello", "world"]
    return tokenizer


def bert(**config):
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=64, **config))


@pytest.fixture(scope="module")
def client(docker_client, cpu_base_image):
    return docker_client


@pytest.fixture
def cleanup(client):
    """Removes what each build of the test made, and only that."""
    before = {image["Id"] for image in client.api.images(all=True)}
    tags: list[str] = []
    yield tags
    remove_images_made(client, before, tags)


def _served_concurrently_equals_in_process(endpoint, pipeline, calls) -> None:
    url = f"grpc://{endpoint.grpc_url}/pipeline"

    def send(call):
        with Client(url) as served:
            check_same(served(*call), pipeline(*call), where=f"{call!r:.60}")
        return call

    with ThreadPoolExecutor(CLIENTS) as pool:
        assert len(list(pool.map(send, calls))) == len(calls)


@pytest.mark.parametrize("name", ["centered", "scaled", "clip"])
def test_row_mixing_pipelines_are_refused_before_any_image_is_built(name, client):
    reference = f"triton-builder-test/row-mixing-{name}:1"
    culprit = {"centered": "centered", "scaled": "by_batch_max", "clip": "clip"}[name]
    with pytest.raises(RowDependenceError, match=rf"'{culprit}'.*depends on the other rows"):
        build_docker_image(row_mixing_pipelines(opt_out=False)[name], reference, client=client)
    assert not listed_images(client, name=reference.split(":")[0])


def vision_models() -> tuple[ModelOp, ModelOp]:
    """A ViT (hidden states ``[17, 32]``) and transformers' ResNet classifier (the
    microsoft/resnet-18 layout, smaller): rows independent, batched as they are."""
    torch.manual_seed(0)
    vit = transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
        image_size=32, patch_size=8))
    resnet = transformers.ResNetForImageClassification(transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5))
    pixels = clip_inputs(0)[1]
    return (ModelOp(vit, example_inputs=pixels, name="vit"),
            ModelOp(resnet, example_inputs=pixels, name="resnet"))


def test_with_the_opt_outs_every_concurrent_answer_equals_in_process(client, cleanup):
    """With ViT and ResNet beside them, batched as usual, in the same image."""
    pipelines = row_mixing_pipelines(opt_out=True)
    centered = pipelines["centered"].nodes[0].op
    clip = pipelines["clip"].nodes[0].op.model
    vit, resnet = vision_models()
    combined = (pipe.input("x", "ids", "pixels")
                .map("x", "centered", centered)
                .map("x", "scaled", pipelines["scaled"].nodes[0].op)
                .map(("ids", "pixels"), "logits_per_image", clip)
                .map("pixels", "last_hidden_state", vit)
                .map("pixels", "logits", resnet)
                .output("centered", "scaled", "logits_per_image", "last_hidden_state", "logits")
                .with_example(ROW, *clip_inputs(0)))
    reference = "triton-builder-test/row-mixing-opted-out:1"
    cleanup.append(reference)
    build_docker_image(combined, reference, client=client)
    calls = [(ROW * (1 + k), *clip_inputs(k)) for k in range(6 * CLIENTS)]
    with ServingContainer(client, reference) as endpoint:
        _served_concurrently_equals_in_process(endpoint, combined, calls)


def test_a_raw_bert_model_and_return_dict_false_serve_as_in_process(client, cleanup, tmp_path):
    tokenize = Tokenize(bert_tokenizer())
    example = tokenize("hello world")
    per_text = {"input_ids": [0], "attention_mask": [0], "last_hidden_state": [0]}
    raw = ModelOp(bert(), example_inputs=example, name="bert", dynamic_axes=per_text)
    as_tuple = ModelOp(bert(return_dict=False), example_inputs=example, name="bert_tuple",
                       output_names=["last_hidden_state", "pooler_output"],
                       dynamic_axes=per_text)
    pipeline = (pipe.input("text")
                .map("text", ("ids", "mask"), tokenize)
                .map(("ids", "mask"), "last_hidden_state", raw)
                .map(("last_hidden_state", "mask"), "vec", mean_pool)
                .map(("ids", "mask"), ("hidden", "pooled"), as_tuple)
                .output("vec", "pooled")
                .with_example("hello world"))
    reference = "triton-builder-test/hugging-face-bert:1"
    cleanup.append(reference)
    built = build_docker_image(pipeline, reference, client=client)
    assert sorted(built.verification.models) == ["bert", "bert_tuple", "pipeline"]
    calls = [(f"{TEXTS[k % len(TEXTS)]} {' '.join(WORDS[k % 7: k % 7 + k % 5])}",)
             for k in range(6 * CLIENTS)]
    assert len({len(tokenize(*call)[0]) for call in calls}) > 3  # lengths differ per text
    with ServingContainer(client, reference) as endpoint:
        _served_concurrently_equals_in_process(endpoint, pipeline, calls)
        with grpcclient.InferenceServerClient(endpoint.grpc_url) as triton:
            served = triton.get_model_config("bert").config
        assert [t.name for t in served.output] == ["last_hidden_state", "pooler_output"]



class DecoderStep(torch.nn.Module):
    """One step of TrOCR's decoder: the tokens so far and the image's encoding → logits."""

    def __init__(self, decoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids, encoder_hidden_states):
        return self.decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                            use_cache=False).logits


class GreedyDecode:
    """Greedy decoding of every image of a batch at once: one encoder call, then one decoder
    call per step for all sequences (``call_batch``), finished ones padded."""

    START, PAD, END = 0, 1, 2

    def __init__(self, encoder: ModelOp, decoder: ModelOp, steps: int) -> None:
        self.encoder, self.decoder, self.steps = encoder, decoder, steps

    def __call__(self, pixels):
        return self.call_batch([(pixels,)])[0]

    def call_batch(self, rows):
        hidden = self.encoder.call_batch(rows)
        tokens = [[self.START] for _ in rows]
        for _ in range(self.steps):
            logits = self.decoder.call_batch([(np.array(t, dtype=np.int64), h)
                                              for t, h in zip(tokens, hidden)])
            for sequence, scores in zip(tokens, logits):
                done = len(sequence) > 1 and sequence[-1] in (self.PAD, self.END)
                sequence.append(self.PAD if done else int(scores[-1].argmax()))
        return [np.array(t[1:], dtype=np.int64) for t in tokens]


def trocr():
    """TrOCR's architecture (``VisionEncoderDecoderModel``: ViT encoder, TrOCR decoder)."""
    torch.manual_seed(0)
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=37, image_size=32, patch_size=8),
        transformers.TrOCRConfig(vocab_size=40, d_model=32, decoder_layers=2,
                                 decoder_attention_heads=2, decoder_ffn_dim=37,
                                 max_position_embeddings=32, cross_attention_hidden_size=32,
                                 decoder_start_token_id=0, pad_token_id=1, eos_token_id=2,
                                 bos_token_id=0, use_cache=False, init_std=1.0))
    model = transformers.VisionEncoderDecoderModel(config=config).eval()
    model.generation_config.decoder_start_token_id = 0
    return model


def test_a_vision_encoder_decoder_decodes_greedily_as_in_process(client, cleanup):
    """The seal-recognition use case: TrOCR's architecture decoding greedily in the pipeline,
    its decoder called once per step for every sequence in flight."""
    model = trocr()
    pixels = clip_inputs(0)[1]
    encoder = ModelOp(model.encoder, example_inputs=pixels, name="encoder",
                      output_names=["last_hidden_state"])
    decoder = ModelOp(DecoderStep(model.decoder), name="decoder",
                      example_inputs=(np.array([0, 5, 7]), encoder(pixels)),
                      dynamic_axes={"input_ids": [0], "output_0": [0]})
    steps = 6
    pipeline = (pipe.input("pixels").map("pixels", "tokens", GreedyDecode(encoder, decoder, steps))
                .output("tokens").with_example(pixels))
    images = [clip_inputs(k)[1] for k in range(6 * CLIENTS)]
    with torch.no_grad():  # transformers' own greedy search agrees, in process
        for image in images[:4]:
            generated = model.generate(torch.from_numpy(image[None]), max_new_tokens=steps,
                                       do_sample=False, num_beams=1)[0, 1:].numpy()
            np.testing.assert_array_equal(pipeline(image)[:len(generated)], generated)
    reference = "triton-builder-test/hugging-face-trocr:1"
    cleanup.append(reference)
    build_docker_image(pipeline, reference, client=client)
    with ServingContainer(client, reference) as endpoint:
        _served_concurrently_equals_in_process(endpoint, pipeline, [(i,) for i in images])
