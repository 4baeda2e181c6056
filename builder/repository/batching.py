"""The dynamic batching the builder writes when a pipeline does not choose its own.

One table, by kind of release, because what pays differs. On the CPU base the pipeline model
gets no queue delay: a request that arrives alone waits out the whole delay, and the measured
sweep (``benchmarks/bench_serving.py``, section "Dynamic batching of the pipeline model" of
``BENCHMARKS.md``) finds that even 100 µs costs more p50 at 1 in flight than the overhead goal
(0.2 ms) leaves, while what it buys at 32 in flight is within the spread between runs; the
benchmark applies that rule to each run and says when this table no longer follows it. GPU
releases keep Triton's own defaults until a GPU measurement says otherwise: none could be
taken where this table was made.

``op_config["dynamic_batching"]`` (model operators) and ``build_pipeline_model(...,
dynamic_batching=...)`` (the pipeline model) override it; ``{}`` there means Triton's defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from builder.base.releases import Release

MAX_BATCH_SIZE = 64
"""The largest batch a model takes where nothing says otherwise: the pipeline model's, every
model operator's (``op_config["max_batch_size"]``), the tuner's starting point."""

MODEL_BATCH_BYTES = 16 * 1024 * 1024
"""The most bytes a full batch of a model operator may hold (its inputs and outputs) where
nothing sets its ``max_batch_size``: a quarter of the 64 MiB ``/dev/shm`` of a plain ``docker
run``. A batch served over BLS lies in the calling stub's shared memory region and in the
model's; one over the room left there fails inside the python backend ("Failed to increase the
shared memory pool size"), at start while the model warms up at that size (a ViT-base's hidden
states, 1.2 MB a row, at 64 rows) and under load otherwise."""


def fitted_max_batch_size(row_bytes: int, largest: int = MAX_BATCH_SIZE) -> int:
    """The largest batch, ``largest`` halved until a batch of rows of ``row_bytes`` fits in
    :data:`MODEL_BATCH_BYTES` (1 at least)."""
    size = largest
    while size > 1 and size * row_bytes > MODEL_BATCH_BYTES:
        size //= 2
    return size


DEFAULT_BATCHING: dict[str, dict[str, dict[str, Any]]] = {
    "cpu": {
        "pipeline": {"max_queue_delay_microseconds": 0},
        "model": {"max_queue_delay_microseconds": 0},
    },
    "gpu": {
        "pipeline": {"max_queue_delay_microseconds": 0},
        "model": {},
    },
}
"""Release kind → model kind (the pipeline model, a model operator's model) → the settings."""


def default_batching(target: Release | None, model: str) -> dict[str, Any]:
    """The default ``dynamic_batching`` of ``model`` (``"pipeline"`` or ``"model"``) on
    ``target`` (``None``: the CPU base or a host server)."""
    kind = "gpu" if target is not None and target.gpu else "cpu"
    return dict(DEFAULT_BATCHING[kind][model])
