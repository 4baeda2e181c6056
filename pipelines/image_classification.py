"""Example 2 — image classification: PNG/PPM bytes → small CNN → top-k labels and scores.

    image (bytes) ──decode──▶ rgb ──preprocess──▶ pixels ──image_classifier (ONNX)──▶ logits
                                                             logits ──top_k──▶ labels, scores

Decoding, resizing and top-k are Python operators (NumPy only, see :mod:`pipelines.imaging`;
resizing is :func:`~builder.vectorized`, top-k batch-aware);
the CNN is served as its own ONNX model. The outputs are typed tensors: ``labels`` is
``TYPE_STRING [3]``, ``scores`` is ``TYPE_FP32 [3]``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from builder import ModelOp, pipe, vectorized
from pipelines.imaging import decode_image, encode_png, resize
from pipelines.weights import load_weights

LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
          "truck")
SIZE = 32
MEAN = np.array([0.49, 0.48, 0.45], dtype=np.float32)
STD = np.array([0.25, 0.24, 0.26], dtype=np.float32)


class TinyCNN(nn.Module):
    """Two convolutions, global average pooling, a linear classifier."""

    def __init__(self, classes: int = len(LABELS)) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Linear(16, classes)
        # A wide random classifier spreads the logits, so that images get distinct rankings
        # (PyTorch's default init gives near-uniform probabilities on this tiny network).
        nn.init.normal_(self.classifier.weight, std=3.0)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(pixels))


@vectorized
def preprocess(rgb: np.ndarray) -> np.ndarray:
    """RGB ``uint8 N x H x W x 3`` → normalised ``float32 N x 3 x SIZE x SIZE``.

    Vectorized: served, the images of a dynamic batch that share a size are resized together.
    """
    scaled = resize(rgb, SIZE, SIZE) / 255.0
    return np.ascontiguousarray(((scaled - MEAN) / STD).transpose(0, 3, 1, 2),
                                dtype=np.float32)


class TopK:
    """The ``k`` most probable labels (softmax over logits), most probable first.

    Batch-aware (``call_batch``): served, the logits of a dynamic batch go through one softmax
    and one sort; ``top_k(logits)`` is a batch of one.
    """

    def __init__(self, labels: tuple[str, ...], k: int = 3) -> None:
        self.labels = labels
        self.k = k

    def __call__(self, logits: np.ndarray) -> tuple[list[str], np.ndarray]:
        return self.call_batch([(logits,)])[0]

    def call_batch(self, rows: list[tuple[np.ndarray]]) -> list[tuple[list[str], np.ndarray]]:
        probabilities = np.array([row[0] for row in rows], dtype=np.float64)
        probabilities -= probabilities.max(axis=1, keepdims=True)
        np.exp(probabilities, out=probabilities)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        best = np.argsort(-probabilities, axis=1, kind="stable")[:, : self.k]
        scores = probabilities[np.arange(len(rows))[:, None], best].astype(np.float32)
        labels = self.labels
        return [([labels[i] for i in indices], row_scores)
                for indices, row_scores in zip(best.tolist(), scores)]


def add_batch_axis(pixels: np.ndarray) -> np.ndarray:
    return pixels[None]


def first_row(batch: np.ndarray) -> np.ndarray:
    return batch[0]


def example_image(seed: int = 0, height: int = 40, width: int = 48) -> bytes:
    """A synthetic PNG: a random dominant colour, gradients and noise; distinct per seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = rng.uniform(0, 255, 3)
    pattern = np.sin(x / rng.uniform(2, 12) + rng.uniform(0, 6)) * np.cos(
        y / rng.uniform(2, 12) + rng.uniform(0, 6))
    image = base + rng.uniform(20, 120, 3) * pattern[:, :, None]
    image = image + rng.normal(0, rng.uniform(2, 30), (height, width, 3))
    return encode_png(np.clip(image, 0, 255).astype(np.uint8))


def make_pipeline():
    classifier = ModelOp(
        load_weights(TinyCNN, "image_classifier", seed=1),
        example_inputs=torch.zeros(1, 3, SIZE, SIZE),
        pre=add_batch_axis,
        post=first_row,
        name="image_classifier",
    )
    return (
        pipe.input("image")
        .map("image", "rgb", decode_image)
        .map("rgb", "pixels", preprocess)
        .map("pixels", "logits", classifier)
        .map("logits", ("labels", "scores"), TopK(LABELS, k=3))
        .output("labels", "scores")
        .with_example(example_image(0))
    )


pipeline = make_pipeline()
