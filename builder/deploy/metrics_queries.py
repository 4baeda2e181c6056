"""The PromQL that reads a served image's metrics, defined once: the README shows these
queries, the tests run them against a real Prometheus scraping an image, and the Kubernetes
autoscaler's queue metrics are made of them (:mod:`builder.deploy.kubernetes`).

The series: the pipeline model's per-operator metrics (:mod:`builder.runtime.operator_metrics`:
``triton_builder_operator_*``, labelled ``model``, ``version``, ``operator``) and Triton's own
per model (``nv_inference_*``, labelled ``model``, ``version``). Windows of five minutes:
four scrapes or more at the usual intervals, so ``rate`` has points to work with.
"""

from __future__ import annotations

WINDOW = "5m"

OPERATOR_P99_S = ("histogram_quantile(0.99, sum by (model, operator, le) "
                  f"(rate(triton_builder_operator_latency_seconds_bucket[{WINDOW}])))")
"""Seconds: the p99 of each operator's calls (a batch of requests is one call)."""

OPERATOR_ROWS_PER_S = ("sum by (model, operator) "
                       f"(rate(triton_builder_operator_rows[{WINDOW}]))")
"""Rows each operator runs on, per second."""

OPERATOR_REFUSALS_PER_S = ("sum by (model, operator) "
                           f"(rate(triton_builder_operator_rejected[{WINDOW}]))")
"""Calls each operator refused as bad input (answered ``INVALID_ARGUMENT``), per second."""

OPERATOR_FAILURES_PER_S = ("sum by (model, operator) "
                           f"(rate(triton_builder_operator_failures[{WINDOW}]))")
"""Calls each operator failed (answered ``INTERNAL``), per second: what to alert on."""

def queue_ms_per_request(selector: str = "", by: str = "model", window: str = WINDOW) -> str:
    """Milliseconds a request waited in Triton's queue, on average over ``window``, summed
    ``by`` those labels (0 when no request came): the first number to grow when a replica has
    more work than it can take."""
    return (f"sum by ({by}) (rate(nv_inference_queue_duration_us{selector}[{window}])) / 1000"
            f" / clamp_min(sum by ({by}) (rate(nv_inference_request_success{selector}"
            f"[{window}])), 1e-9)")


def pending_requests(selector: str = "", by: str = "model") -> str:
    """Requests held that no model instance runs yet (Triton 2.41 on)."""
    return f"sum by ({by}) (nv_inference_pending_request_count{selector})"


QUEUE_MS_PER_REQUEST = queue_ms_per_request()
PENDING_REQUESTS = pending_requests()

QUERIES = {
    "p99 per operator (s)": OPERATOR_P99_S,
    "rows per second, per operator": OPERATOR_ROWS_PER_S,
    "refusals per second, per operator": OPERATOR_REFUSALS_PER_S,
    "failures per second, per operator": OPERATOR_FAILURES_PER_S,
    "queue time per request (ms), per model": QUEUE_MS_PER_REQUEST,
    "pending requests, per model": PENDING_REQUESTS,
}
"""What the README's "Traces and metrics" lists, by what each says."""
