"""A latency budget as Triton's queue policy: under overload, refuse at once what would be late.

Why: Triton's queues are unbounded by default. Under an open-loop overload — requests arriving
faster than they are served, as real traffic does — every queue grows, and with it every
request's latency, until clients time out while the server goes on computing answers nobody
waits for. A queue policy (``dynamic_batching.default_queue_policy``) makes Triton reject a
request that has waited longer than a timeout (``REJECT``: answered ``UNAVAILABLE`` / 503,
"Request timeout expired") and one that finds the queue full (``max_queue_size``: "Exceeds
maximum queue size"), so the requests it accepts keep their latency and the rest learn at once
that they should go elsewhere or come back later.

How a pipeline's budget is split (a request waits in the pipeline model's queue, then in each
model operator's queue its BLS calls reach): :data:`PIPELINE_SHARE` of it for the pipeline
model's queue, :data:`OPERATOR_SHARE` for each model operator's, the rest for execution. An
operator's ``op_config["latency_budget_ms"]`` replaces its share (the longest its queue holds a
request); ``op_config["max_queue_size"]`` bounds its queue. A pipeline model whose BLS call is
refused answers ``UNAVAILABLE`` itself (:mod:`builder.runtime.pipeline_model`).

A model under a queue policy gets two instances at least (:data:`MIN_INSTANCES`). Measured on
Triton 2.51 with one instance: at one request in flight, about one request in twenty waited
500 ms in the queue — and, its timeout spent, was refused — while the model was idle; with two,
none did (1 in flight, 5 s: 150 against 420 requests answered). The cause is upstream, in
core's dynamic batcher: any queue policy turns off payload prefetching
(``PriorityQueue``: ``support_prefetching_``), and without it the batcher waits for an idle
instance on a condition that the finishing payload may signal before the instance counts as
waiting, so the batcher sleeps out its 500 ms default (``WaitForPayloadSlotAvailable``, the
same in r24.10 and r25.11; triton-inference-server/server#8870 reports the same path's
waiting-consumer count drifting). A second instance is waiting whenever the first is busy.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_INSTANCES = 2
"""Instances of a model under a queue policy, at least (see above)."""
PIPELINE_SHARE = 0.5
"""Of a pipeline's latency budget: the longest its pipeline model's queue holds a request."""
OPERATOR_SHARE = 0.25
"""Of a pipeline's latency budget: the longest a model operator's queue holds a request."""


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy`` with ``timeout_action: REJECT``; None leaves a bound off."""

    timeout_us: int | None = None
    max_queue_size: int | None = None


def queue_policy(budget_ms: float | None, share: float,
                 max_queue_size: int | None = None) -> QueuePolicy | None:
    """The policy of a queue that may hold a request ``share`` of ``budget_ms``."""
    if budget_ms is None and max_queue_size is None:
        return None
    timeout = None if budget_ms is None else max(1, round(budget_ms * share * 1000))
    return QueuePolicy(timeout_us=timeout, max_queue_size=max_queue_size)
