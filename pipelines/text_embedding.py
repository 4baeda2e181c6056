"""Example 1 — text embedding: text → tokens → transformer encoder → mean pool → unit vector.

    text ──tokenize──▶ ids, mask ──text_encoder (ONNX)──▶ hidden ─┐
                          └──────────── mask ───────────────────────┴─mean_pool──▶ vec

The tokenizer and the pooling are Python operators; the encoder (embedding, one self-attention
block, feed-forward) is a torch module served as its own ONNX model. ``mask`` is produced once
and read by two operators: the pipeline is a DAG.
"""

from __future__ import annotations

import math
import re
import zlib

import numpy as np
import torch
from torch import nn

from builder import ModelOp, pipe, vectorized
from pipelines.weights import load_weights

VOCAB_SIZE = 1024
MAX_TOKENS = 16
DIM = 32
PAD, CLS = 0, 1


class Tokenizer:
    """Lower-cased words and punctuation, hashed into the vocabulary; ``[CLS]`` first, padded.

    Returns ``ids`` (``int64 [MAX_TOKENS]``) and ``mask`` (``float32``, 1 for real tokens).
    """

    def __init__(self, max_tokens: int = MAX_TOKENS, vocab_size: int = VOCAB_SIZE) -> None:
        self.max_tokens = max_tokens
        self.vocab_size = vocab_size

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        words = re.findall(r"\w+|[^\w\s]", text.lower())
        tokens = [CLS] + [2 + zlib.crc32(w.encode()) % (self.vocab_size - 2) for w in words]
        tokens = tokens[: self.max_tokens]
        ids = np.full(self.max_tokens, PAD, dtype=np.int64)
        ids[: len(tokens)] = tokens
        mask = (ids != PAD).astype(np.float32)
        return ids, mask


class TinyEncoder(nn.Module):
    """A one-block transformer encoder: token + position embeddings, attention, feed-forward."""

    def __init__(self, vocab_size: int = VOCAB_SIZE, dim: int = DIM,
                 max_tokens: int = MAX_TOKENS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.position = nn.Parameter(torch.randn(max_tokens, dim) * 0.1)
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(),
                                          nn.Linear(2 * dim, dim))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position
        scores = self.query(x) @ self.key(x).transpose(1, 2) / math.sqrt(x.shape[-1])
        scores = scores + (1.0 - mask)[:, None, :] * -1e4  # padding is never attended to
        attended = torch.softmax(scores, dim=-1) @ self.value(x)
        x = self.norm1(x + self.out(attended))
        return self.norm2(x + self.feed_forward(x))


def add_batch_axis(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """One call's arrays → the model's batch of one."""
    return tuple(a[None] for a in arrays)


def first_row(batch: np.ndarray) -> np.ndarray:
    """The model's batch of one → this call's array."""
    return batch[0]


@vectorized
def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average the real tokens' vectors and scale to unit length (cosine-ready).

    Vectorized (``N x tokens x DIM`` and ``N x tokens`` in): served, one call pools every row
    of a dynamic batch.
    """
    weights = mask[:, :, None]
    pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
    norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return (pooled / norms).astype(np.float32)


def make_pipeline():
    tokenizer = Tokenizer()
    ids, mask = tokenizer("hello world")
    encoder = ModelOp(
        load_weights(TinyEncoder, "text_encoder", seed=0),
        example_inputs=(torch.from_numpy(ids[None]), torch.from_numpy(mask[None])),
        pre=add_batch_axis,
        post=first_row,
        name="text_encoder",
    )
    return (
        pipe.input("text")
        .map("text", ("ids", "mask"), tokenizer)
        .map(("ids", "mask"), "hidden", encoder)
        .map(("hidden", "mask"), "vec", mean_pool)
        .output("vec")
        .with_example("hello world")
        .with_example("Triton serves this pipeline, batched.")
    )


pipeline = make_pipeline()
