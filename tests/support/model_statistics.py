"""Triton's per-model statistics, read once they include the requests a test has its answers to.

The python backend reports a request's statistics only after it has sent the response (the
destructor of ``PbMetricReporter``, python_backend ``src/pb_metric_reporter.cc``, r22.12 to
r25.11), so a client holding its answer can read counts that do not include it yet: a loaded
machine showed ``inference_count`` 0 for a model that had just answered.
"""

from __future__ import annotations

import time

SETTLE_S = 10.0


def settled_statistics(client, model: str, at_least: int = 0):
    """``model``'s statistics (tritonclient's gRPC ``ModelStatistics``) once its inference count
    is at least ``at_least``, or as they are after :data:`SETTLE_S`."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        (stats,) = client.get_inference_statistics(model).model_stats
        if stats.inference_count >= at_least or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def warm_up_rows(client, model: str) -> int:
    """The rows Triton ran through ``model`` for its ``model_warmup`` while loading it (each
    instance warms itself), which its statistics count: what they hold before any request."""
    config = client.get_model_config(model, as_json=True)["config"]
    rows = sum(int(sample.get("batch_size", 0)) * max(1, int(sample.get("count", 1)))
               for sample in config.get("model_warmup", []))
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", []))
    return rows * max(1, instances)
