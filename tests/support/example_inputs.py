"""Varied inputs for the example pipelines, shared by the repository, client and image tests."""

from __future__ import annotations

import numpy as np

from pipelines import image_classification, text_embedding, text_recognizer
from pipelines.imaging import decode_image, encode_png, encode_pnm

TEXTS = [
    "hello world", "", "Triton serves pipelines.", "a", "THE QUICK BROWN FOX",
    "the quick brown fox", "naïve café — déjà vu", "emoji 🚀 ok",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17", "repeated repeated repeated",
    "punctuation!?;:", "tabs\tand\nnewlines", "x" * 200, "mixed Case words", "日本語のテキスト",
    "numbers 3.14159", "one", "two words", "three word text",
    "a much longer sentence that goes past the sixteen token limit of the tokenizer for sure",
    "  leading and trailing  ", "same", "same", "end.",
]


def images() -> list[bytes]:
    images = [image_classification.example_image(seed) for seed in range(16)]
    images += [image_classification.example_image(seed, height=20 + seed, width=70 - seed)
               for seed in range(16, 20)]
    rgb = decode_image(image_classification.example_image(21))
    images += [encode_pnm(rgb), encode_png(rgb, filter_type=4), encode_png(rgb[:, :, 1]),
               encode_png(np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)]), 3)]
    return images


def text_lines() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    lines = []
    for seed in range(24):
        text = "".join(rng.choice(list(text_recognizer.ALPHABET), rng.integers(1, 7)))
        lines.append(text_recognizer.render(text, seed))
    return lines


EXAMPLES = {
    "text_embedding": (text_embedding.pipeline, TEXTS),
    "image_classification": (image_classification.pipeline, images()),
    "text_recognizer": (text_recognizer.pipeline, text_lines()),
}
