"""A custom operator from a module outside the project deploys without any patching.

The user's code lives in a temporary directory (two modules, one importing the other, and torch
modules of their own: one exported to ONNX, one served in the python format). After the build
the directory is removed from ``sys.path`` and from disk, and its modules from ``sys.modules``:
the served pipeline must still load and answer exactly like the in-process run did.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from builder import build_pipeline_model
from builder.repository.model_config import read_config
from builder.tritonserver.host_process import TritonServer
from builder.verify.equality import check_same as assert_same
from tests.support.pipeline_client import infer, infer_concurrently

pytestmark = pytest.mark.alongside

HELPERS = '''
import zlib

VOCABULARY = 50


def word_id(word):
    return zlib.crc32(word.encode()) % VOCABULARY
'''

OPERATORS = '''
import numpy as np
import torch
from torch import nn

from {helpers} import word_id
from builder import ModelOp, pipe


class BagOfWords:
    """A custom operator: hashed word counts."""

    def __init__(self, size):
        self.size = size

    def __call__(self, text):
        counts = np.zeros(self.size, dtype=np.float32)
        for word in text.lower().split():
            counts[word_id(word)] += 1
        return counts


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(50, 4)

    def forward(self, counts):
        return torch.softmax(self.linear(counts), dim=-1)


class Sharpen(nn.Module):
    """Served in the python format: its class exists only in this user module."""

    def forward(self, scores):
        return scores ** 2 / (scores ** 2).sum(dim=-1, keepdim=True)


def verdict(scores):
    return ["spam", "ham", "eggs", "bacon"][int(np.argmax(scores))]


def build():
    torch.manual_seed(0)
    scorer = ModelOp(Scorer(), torch.zeros(1, 50), pre=lambda c: c[None],
                     post=lambda s: s[0], name="scorer")
    sharpen = ModelOp(Sharpen(), torch.zeros(1, 4) + 0.25, pre=lambda s: s[None],
                      post=lambda s: s[0], name="sharpen",
                      op_config={{"format_priority": ["python"]}})
    return (pipe.input("text")
            .map("text", "counts", BagOfWords(50))
            .map("counts", "scores", scorer)
            .map("scores", "sharp", sharpen)
            .map("sharp", "label", verdict)
            .output("label", "sharp")
            .with_example("hello spam world"))
'''

TEXTS = ["buy now", "hello friend", "spam spam spam", "meeting at noon", "free money",
         "lunch?", "", "a b c d e f", "Hello Friend", "quarterly report attached",
         "win a prize", "see you soon", "urgent", "newsletter", "ham and eggs",
         "bacon", "click here", "invoice 42", "weekend plans", "unsubscribe", "re: re: re:"]


@contextlib.contextmanager
def user_pipeline(tmp_path, prefix: str = "user") -> Iterator[Any]:
    """The pipeline of two user modules written outside the project; after the block the
    directory is gone from ``sys.path`` and from disk, and its modules from ``sys.modules``."""
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    suffix = tmp_path.name.replace("-", "_")
    helpers, operators = f"{prefix}_helpers_{suffix}", f"{prefix}_operators_{suffix}"
    (directory / f"{helpers}.py").write_text(textwrap.dedent(HELPERS))
    (directory / f"{operators}.py").write_text(OPERATORS.format(helpers=helpers))
    sys.path.insert(0, str(directory))
    try:
        yield importlib.import_module(operators).build()
    finally:
        sys.path.remove(str(directory))
        for name in (helpers, operators):
            sys.modules.pop(name, None)
        shutil.rmtree(directory)


@pytest.fixture
def user_repository(tmp_path):
    """Build from user modules in a temporary directory, then make that code disappear."""
    root = tmp_path / "models"
    with user_pipeline(tmp_path) as pipeline:
        expected = [pipeline(text) for text in TEXTS]
        build_pipeline_model(pipeline, root)
    return root, pipeline.signature(), expected


@pytest.mark.slow
def test_custom_operators_from_a_removed_directory_are_served(user_repository):
    root, signature, expected = user_repository
    assert read_config(root / "sharpen").backend == "python"
    assert read_config(root / "scorer").platform == "onnxruntime_onnx"
    with TritonServer(root) as server, grpcclient.InferenceServerClient(server.grpc_url) as client:
        served = [infer(client, "pipeline", signature, [(text,)])[0] for text in TEXTS]
        assert_same(served, expected)
        assert_same(infer(client, "pipeline", signature, [(t,) for t in TEXTS[:6]]),
                    expected[:6])
        assert_same(infer_concurrently(client, "pipeline", signature, [(t,) for t in TEXTS]),
                    expected)
    assert all(isinstance(label, str) and isinstance(sharp, np.ndarray)
               for label, sharp in expected)
