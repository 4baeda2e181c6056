"""Example 3 — text recognition: an encoder–decoder with a greedy autoregressive loop.

    image (uint8 32 x 96) ──normalize──▶ pixels ──recognizer_encoder (ONNX)──▶ memory
    memory ──greedy_decode: recognizer_decoder (ONNX) once per step until </s>──▶ text

The encoder turns the image into a sequence of feature vectors. :class:`GreedyDecoder` is a
Python operator holding the decoder model operator: it starts every sequence with ``<s>`` and
calls the decoder on the tokens so far, appending the most probable next token until ``</s>``
(or ``MAX_STEPS``). It implements ``call_batch``, so when served, each step makes *one* decoder
call (a BLS request) for the still-running sequences of every request in the dynamic batch.

``streaming_pipeline`` is the same recognizer sending each character as it is decoded
(:class:`CharacterStream`): its pipeline model is decoupled, ``streaming_pipeline.stream(image)``
yields the characters, ``streaming_pipeline(image)`` returns the whole text, as ``pipeline``
does (``whole="join"``). Served, streams that arrive while others decode join their loop between
steps (``admits_rows``), so sequences at different steps share a step's decoder call: the
decoder answers every position and pads shorter sequences at the end (``pad_values``).

The models are tiny, a decoder step well under a millisecond; ``make_pipeline(deep_layers=6)``
adds six decoder layers of 256 beside the decoder's own (:class:`DecoderLayer`), which give a
step the cost of TrOCR-small's, for the streaming benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from builder import ModelOp, pipe
from pipelines.weights import load_weights

HEIGHT, WIDTH = 32, 96
ALPHABET = "0123456789abcdef"
BOS, EOS = 0, 1
VOCAB = ("<s>", "</s>", *ALPHABET)
DIM = 32
MAX_STEPS = 12
EOS_BIAS = 8.0


class Encoder(nn.Module):
    """Two strided convolutions; each column of the feature map becomes one ``DIM`` vector."""

    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, dim, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.project = nn.Linear(dim * HEIGHT // 4, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        features = self.convs(pixels)  # [batch, dim, height / 4, width / 4]
        batch, channels, height, width = features.shape
        columns = features.reshape(batch, channels * height, width).transpose(1, 2)
        return self.norm(self.project(columns))  # [batch, width / 4, dim]


class Decoder(nn.Module):
    """Next-token logits at every position of the tokens so far: causal self-attention,
    cross-attention. Every position's, so that sequences of different lengths share one call,
    padded at the end (a position sees only those before it): each reads its own last."""

    def __init__(self, vocab: int = len(VOCAB), dim: int = DIM, max_steps: int = MAX_STEPS,
                 deep_layers: int = 0, deep_width: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(max_steps + 1, dim))
        self.self_query, self.self_key, self.self_value = (nn.Linear(dim, dim) for _ in range(3))
        self.cross_query, self.cross_key, self.cross_value = (
            nn.Linear(dim, dim) for _ in range(3))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        # Random weights stand in for training. Scaled so that positions drive where the
        # decoder looks in the image and what it sees there drives the token: sequences then
        # differ by image and end (EOS_BIAS) at varied lengths.
        nn.init.normal_(self.head.weight, std=1.0)
        nn.init.normal_(self.cross_value.weight, std=3.0)
        nn.init.normal_(self.cross_query.weight, std=3.0)
        with torch.no_grad():
            self.embed.weight.mul_(0.3)
            self.position.mul_(3.0)
            self.head.bias[EOS] += EOS_BIAS
        # ``deep_layers`` decoder layers of ``deep_width`` beside that layer give a step the
        # cost of a real decoder's (6 of 256: TrOCR-small's); their branch is added back scaled
        # down, so the tuned layer above still decides what is decoded. None by default: the
        # example's step is tiny.
        self.deep = nn.ModuleList(DecoderLayer(deep_width) for _ in range(deep_layers))
        if deep_layers:
            self.widen = nn.Linear(dim, deep_width)
            self.widen_memory = nn.Linear(dim, deep_width)
            self.narrow = nn.Linear(deep_width, dim)
            with torch.no_grad():
                self.narrow.weight.mul_(0.01)
                self.narrow.bias.zero_()

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        steps = tokens.shape[1]
        x = self.embed(tokens) + self.position[:steps]
        scale = math.sqrt(x.shape[-1])
        scores = self.self_query(x) @ self.self_key(x).transpose(1, 2) / scale
        future = torch.triu(torch.ones(steps, steps, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(future, -1e4)
        x = x + torch.softmax(scores, dim=-1) @ self.self_value(x)
        cross = self.cross_query(x) @ self.cross_key(memory).transpose(1, 2) / scale
        x = x + torch.softmax(cross, dim=-1) @ self.cross_value(memory)
        if len(self.deep):
            wide, wide_memory = self.widen(x), self.widen_memory(memory)
            for layer in self.deep:
                wide = layer(wide, wide_memory, future)
            x = x + self.narrow(wide)
        return self.head(self.norm(x))


class DecoderLayer(nn.Module):
    """A pre-norm transformer decoder layer — causal self-attention, cross-attention, an MLP —
    written out (one head) so that its export keeps the token axis variable."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(3))
        self.self_qkv, self.self_out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.cross_q, self.cross_kv = nn.Linear(width, width), nn.Linear(width, 2 * width)
        self.cross_out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                future: torch.Tensor) -> torch.Tensor:
        scale = math.sqrt(x.shape[-1])
        query, key, value = self.self_qkv(self.norms[0](x)).chunk(3, dim=-1)
        scores = (query @ key.transpose(1, 2) / scale).masked_fill(future, -1e4)
        x = x + self.self_out(torch.softmax(scores, dim=-1) @ value)
        key, value = self.cross_kv(memory).chunk(2, dim=-1)
        scores = self.cross_q(self.norms[1](x)) @ key.transpose(1, 2) / scale
        x = x + self.cross_out(torch.softmax(scores, dim=-1) @ value)
        return x + self.mlp(self.norms[2](x))


class GreedyDecoder:
    """Greedy decoding: call the decoder until every sequence has produced ``</s>``."""

    def __init__(self, decoder: ModelOp, max_steps: int = MAX_STEPS) -> None:
        self.decoder = decoder
        self.max_steps = max_steps

    def __call__(self, memory: np.ndarray) -> str:
        return self.call_batch([(memory,)])[0]

    def call_batch(self, rows: Sequence[tuple[np.ndarray]]) -> list[str]:
        texts = ["" for _ in rows]
        for step in self.steps(rows):
            for i, char in step.items():
                texts[i] += char
        return texts

    def steps(self, rows: Sequence[tuple[np.ndarray]]) -> Iterator[dict[int, str]]:
        """One decoder call per step for every running sequence; yields each one's new
        character. The set sent back names the rows to stop (a cancelled stream) and, served,
        the rows ``added`` since (streams that arrived), which start with the next step: each
        row ends at ``</s>`` or after ``max_steps`` of its own."""
        memories = {i: row[0] for i, row in enumerate(rows)}
        sequences = {i: [BOS] for i in memories}
        given = len(rows)  # the index the next added row takes
        while memories:
            running = list(memories)
            logits = self.decoder.call_batch(
                [(np.array(sequences[i], dtype=np.int64), memories[i]) for i in running])
            step = {}
            for i, scores in zip(running, logits, strict=True):
                token = 1 + int(np.argmax(scores[1:]))  # never <s> again
                if token != EOS:
                    sequences[i].append(token)
                    step[i] = VOCAB[token]
            control = yield step
            for i in running:  # a row that ends goes: a served loop may never end
                if i not in step or i in (control or ()) or len(sequences[i]) > self.max_steps:
                    del memories[i], sequences[i]
            added = getattr(control, "added", ())
            memories.update(zip(range(given, given + len(added)), (row[0] for row in added)))
            sequences.update((i, [BOS]) for i in range(given, given + len(added)))
            given += len(added)


class CharacterStream:
    """The decoder's characters, each sent to its client the moment it is decoded: the
    streaming form of :class:`GreedyDecoder` (``.stream(...)``), one decoder call per step for
    every stream in flight (streams that arrive while others decode join them between steps:
    ``admits_rows``)."""

    admits_rows = True

    def __init__(self, decoder: GreedyDecoder) -> None:
        self.decoder = decoder

    def call_batch(self, rows: Sequence[tuple[np.ndarray]]) -> Iterator[dict[int, str]]:
        return (yield from self.decoder.steps(rows))


def normalize(image: np.ndarray) -> np.ndarray:
    """``uint8 H x W`` → ``float32 1 x H x W`` in [0, 1] (dark ink on light paper → ink = 1)."""
    return (1.0 - image.astype(np.float32) / 255.0)[None]


def decoder_inputs(tokens: np.ndarray, memory: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return tokens[None], memory[None]


def add_batch_axis(array: np.ndarray) -> np.ndarray:
    return array[None]


def first_row(batch: np.ndarray) -> np.ndarray:
    return batch[0]


def last_position(logits: np.ndarray) -> np.ndarray:
    """A sequence's next-token logits: its row's, at its last position."""
    return logits[0, -1]


_GLYPHS = {  # 3 x 5 bitmaps, row by row
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001010010010", "8": "111101111101111",
    "9": "111101111001111", "a": "010101111101101", "b": "110101110101110",
    "c": "011100100100011", "d": "110101101101110", "e": "111100110100111",
    "f": "111100110100100",
}


def render(text: str, seed: int = 0) -> np.ndarray:
    """A text line as a ``uint8 32 x 96`` image: dark glyphs on paper, jitter and noise."""
    rng = np.random.default_rng(seed)
    image = np.full((HEIGHT, WIDTH), 235.0) + rng.normal(0, 8, (HEIGHT, WIDTH))
    scale = 4
    x = int(rng.integers(2, 8))
    for char in text:
        glyph = np.array([int(b) for b in _GLYPHS[char]], dtype=float).reshape(5, 3)
        block = np.kron(glyph, np.ones((scale, scale)))
        y = int(rng.integers(2, HEIGHT - block.shape[0] - 2))
        if x + block.shape[1] > WIDTH:
            break
        image[y:y + block.shape[0], x:x + block.shape[1]] -= block * rng.uniform(150, 220)
        x += block.shape[1] + int(rng.integers(2, 5))
    return np.clip(image, 0, 255).astype(np.uint8)


def make_pipeline(streaming: bool = False, deep_layers: int = 0):
    """The recognizer answering with the whole text, or (``streaming``) each character as it
    is decoded. The example's decoder step is tiny (well under a millisecond); ``deep_layers=6``
    gives it the cost of TrOCR-small's (``benchmarks/bench_streaming.py``). Streams join one
    loop with the tiny decoder, whose step costs less than its call; with the deep one, whose
    compute dominates on a CPU, each batch of streams decodes on a loop of its own."""
    encoder_module = load_weights(Encoder, "recognizer_encoder", seed=2)
    decoder_module = load_weights(
        lambda: Decoder(deep_layers=deep_layers),
        f"recognizer_decoder-deep{deep_layers}" if deep_layers else "recognizer_decoder", seed=3)
    example_pixels = torch.from_numpy(normalize(render("0a1b"))[None])
    with torch.no_grad():
        example_memory = encoder_module(example_pixels)
    encoder = ModelOp(encoder_module, example_inputs=example_pixels, pre=add_batch_axis,
                      post=first_row, name="recognizer_encoder")
    decoder = ModelOp(
        decoder_module,
        example_inputs=(torch.tensor([[BOS, 5, 7]]), example_memory),
        pre=decoder_inputs,
        post=last_position,
        name="recognizer_decoder",
        dynamic_axes={"tokens": [1], "output_0": [1]},
        pad_values={"tokens": EOS},  # streams at different steps share a step's call
    )
    recognized = (
        pipe.input("image")
        .map("image", "pixels", normalize)
        .map("pixels", "memory", encoder)
    )
    if streaming:
        characters = CharacterStream(GreedyDecoder(decoder))
        if deep_layers:  # compute-bound on a CPU: loops side by side serve more (BENCHMARKS.md)
            characters.admits_rows = False
        recognized = recognized.stream("memory", "char", characters,
                                       name="greedy_decode", whole="join").output("char")
    else:
        recognized = recognized.map("memory", "text", GreedyDecoder(decoder),
                                    name="greedy_decode").output("text")
    return recognized.with_example(render("0a1b"))


pipeline = make_pipeline()
streaming_pipeline = make_pipeline(streaming=True)
