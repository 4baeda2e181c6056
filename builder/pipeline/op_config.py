"""``op_config``: what a model operator may set of its Triton model, checked where it is given.

Checked when the operator is made (and the pipeline model's own settings when the repository is
written), so a wrong key or value is refused naming the operator before anything is exported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from builder.errors import PipelineError

OP_CONFIG_KEYS = ("device", "device_ids", "dynamic_batching", "format_priority",
                  "instance_count", "latency_budget_ms", "max_batch_size", "max_queue_size")
"""What ``op_config`` may set for a model operator's Triton model (see
:mod:`builder.repository.model_config`).

Tuples, not sets: this module is pickled by value into ``pipe.pickle``, and a set of strings is
pickled in an order that changes from one process to the next (string hashes are salted), which
would make the bytes — and the image — differ for an unchanged pipeline."""

DYNAMIC_BATCHING_KEYS = ("max_queue_delay_microseconds", "preferred_batch_size")
DEVICES = ("cpu", "gpu")
"""``op_config["device"]``: where the model's instances run (default: the target's GPUs, if any)."""


def validate_op_config(config: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """Check ``op_config`` keys and value types; the error names the operator."""
    config = dict(config)
    unknown = set(config).difference(OP_CONFIG_KEYS)
    if unknown:
        raise PipelineError(
            f"operator {owner!r}: unknown op_config keys {sorted(unknown)}; "
            f"known: {sorted(OP_CONFIG_KEYS)}"
        )

    def fail(key: str, expected: str) -> None:
        raise PipelineError(
            f"operator {owner!r}: op_config[{key!r}] must be {expected}, got {config[key]!r}"
        )

    for key in ("instance_count", "max_batch_size", "max_queue_size"):
        lowest = 0 if key == "max_batch_size" else 1  # 0: no batching, one row per model call
        if key in config and (not isinstance(config[key], int) or isinstance(config[key], bool)
                              or config[key] < lowest):
            fail(key, "an int >= 0 (0: no batching, one row at a time)"
                 if lowest == 0 else "a positive int")
    if "latency_budget_ms" in config and (
            not isinstance(config["latency_budget_ms"], (int, float))
            or isinstance(config["latency_budget_ms"], bool) or config["latency_budget_ms"] <= 0):
        fail("latency_budget_ms", "a positive number of milliseconds")
    if "device_ids" in config and (
        not isinstance(config["device_ids"], (list, tuple))
        or not all(isinstance(d, int) and d >= 0 for d in config["device_ids"])
    ):
        fail("device_ids", "a list of GPU indices")
    if "device" in config and config["device"] not in DEVICES:
        fail("device", f"one of {list(DEVICES)}")
    if config.get("device") == "cpu" and config.get("device_ids"):
        raise PipelineError(
            f"operator {owner!r}: op_config pins GPUs {list(config['device_ids'])} and asks for "
            f"device 'cpu': drop one of them"
        )
    if "format_priority" in config:
        if isinstance(config["format_priority"], str) or not config["format_priority"]:
            fail("format_priority", "a non-empty list of formats")
        config["format_priority"] = list(config["format_priority"])
    if "dynamic_batching" in config:
        batching = config["dynamic_batching"]
        if not isinstance(batching, Mapping) or set(batching).difference(DYNAMIC_BATCHING_KEYS):
            fail("dynamic_batching", f"a mapping with keys {sorted(DYNAMIC_BATCHING_KEYS)}")
        config["dynamic_batching"] = dict(batching)
    return config
