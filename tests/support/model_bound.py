"""A pipeline whose model, and not the host, is what saturates: the shape of GPU serving, on a
machine without a GPU.

Its model operator stands in for a model on a GPU (there is none here): a batch takes
:data:`BATCH_S` of device time for up to :data:`MAX_BATCH` rows (more rows, more such steps),
and leaves the CPU to the server and its clients. The example pipelines are not model-bound on
two cores: at twice their capacity the host's CPU, shared by the load generator, the gRPC
frontend and the stubs, saturates before any model queue does, and no queue policy can bound
that (BENCHMARKS.md, "Overload").
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from builder import pipe, vectorized

BATCH_S = 0.02
"""What one batch of the stand-in model takes, whatever its size up to MAX_BATCH rows."""
MAX_BATCH = 4


@vectorized
def accelerator(features):
    """Holds each batch BATCH_S for every MAX_BATCH rows it holds (a device that a batch of
    MAX_BATCH fills), as a model on a device would, then answers."""
    time.sleep(BATCH_S * -(-len(features) // MAX_BATCH))
    return features * 2.0


def features(text):
    return np.frombuffer(hashlib.sha256(text.encode()).digest(), dtype=np.uint8).astype(
        np.float32) / 255.0


MODEL_BOUND = (pipe.input("text").map("text", "features", features)
               .map("features", "vec", accelerator).output("vec").with_example("hello"))
TEXTS = [f"request {n}" for n in range(32)]
