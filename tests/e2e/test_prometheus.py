"""A real Prometheus (Debian's, 2.42) scrapes a served image (issue 67, items 2 and 3).

The image serves two operators: ``slow_step`` sleeps a known 60 ms per row, ``checked``
refuses a row whose sum is negative as bad input. Requests one at a time (each call of an
operator is one row): 40 good ones, spread over several scrapes, then 5 bad ones. What
Prometheus scraped must be what the test sent — every call of each operator in its latency
histogram, the rows, the refusals — and the README's queries (:mod:`builder.deploy.metrics_queries`)
must answer with it: ``slow_step``'s p99 within its bucket (50 to 100 ms), rows per second
for both operators, refusals for ``checked`` alone, the queue time and pending requests of the
pipeline model; the autoscaler's rules (prometheus-adapter's, as ``deploy k8s --scale-on``
writes them for this image, their templates filled as the adapter fills them) evaluate too.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import yaml

from builder import InputError, build_docker_image, pipe
from builder.client.errors import RemoteInputError
from builder.client.pipeline import Client
from builder.deploy import kubernetes, metrics_queries
from builder.deploy.serving import deployable_image
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from tests.support.testbed import LocalPrometheus

pytestmark = [pytest.mark.slow]
REFERENCE = "triton-builder-test/prometheus:1"
SLEEP_S = 0.06
"""Inside the bucket (0.05, 0.1]: a call's overhead and a busy machine's late wake-up stay
well under the 40 ms to its upper bound."""
GOOD, BAD = 40, 5


def slow_step(x: np.ndarray) -> np.ndarray:
    time.sleep(SLEEP_S)
    return x * 2


def checked(y: np.ndarray) -> np.ndarray:
    if float(y.sum()) < 0:
        raise InputError("the sum is negative")
    return y + 1


PIPELINE = (pipe.input("x").map("x", "y", slow_step).map("y", "z", checked).output("z")
            .with_example(np.ones(4, np.float32)))


def _row(seed: int) -> np.ndarray:
    return np.abs(np.random.default_rng(seed).standard_normal(4)).astype(np.float32)


def _by_operator(prometheus: LocalPrometheus, query: str) -> dict[str, float]:
    return {sample["metric"].get("operator", sample["metric"].get("model")):
            float(sample["value"][1]) for sample in prometheus.query(query)}


def _scraped(prometheus: LocalPrometheus, query: str, expected: float,
             timeout: float = 60.0) -> None:
    """Wait until ``query`` (one series) reads ``expected`` in Prometheus."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        samples = prometheus.query(query)
        seen = [float(s["value"][1]) for s in samples]
        if seen == [expected]:
            return
        time.sleep(0.5)
    raise AssertionError(f"{query} read {seen}, not {expected}, within {timeout} s")


def test_prometheus_reads_each_operators_latency_rows_and_refusals_from_the_image(
        docker_client, cpu_base_image, tmp_path):
    slow, check = (json.dumps(node.label) for node in PIPELINE.plan.nodes)
    try:
        build_docker_image(PIPELINE, REFERENCE, client=docker_client)
        with ServingContainer(docker_client, REFERENCE) as endpoint, \
                LocalPrometheus(tmp_path, [endpoint.metrics_url]) as prometheus:
            _scraped(prometheus, 'up{job="triton"}', 1)
            with Client(f"grpc://{endpoint.grpc_url}/pipeline") as client:
                for k in range(GOOD):
                    check_same(client(_row(k)), PIPELINE(_row(k)), where=f"request {k}")
                    time.sleep(0.05)  # spread over several scrapes: rate() needs two points
                for k in range(BAD):
                    with pytest.raises(RemoteInputError, match="the sum is negative"):
                        client(-_row(k) - 1)
            calls = GOOD + BAD
            _scraped(prometheus,
                     f"triton_builder_operator_latency_seconds_count{{operator={slow}}}", calls)
            _scraped(prometheus, f"triton_builder_operator_rows{{operator={check}}}", calls)
            _scraped(prometheus, f"triton_builder_operator_rejected{{operator={check}}}", BAD)
            buckets = {sample["metric"]["le"]: float(sample["value"][1]) for sample in
                       prometheus.query(f"triton_builder_operator_latency_seconds_bucket"
                                        f"{{operator={slow}}}")}
            assert buckets["0.05"] == 0 and buckets["0.1"] == calls, buckets
            time.sleep(2)  # one more scrape of every series

            p99 = _by_operator(prometheus, metrics_queries.OPERATOR_P99_S)
            print("p99 per operator:", p99)
            assert 0.05 < p99[json.loads(slow)] <= 0.1, p99
            assert p99[json.loads(check)] <= 0.05, p99
            rows = _by_operator(prometheus, metrics_queries.OPERATOR_ROWS_PER_S)
            assert rows[json.loads(slow)] > 0 and rows[json.loads(check)] > 0, rows
            refusals = _by_operator(prometheus, metrics_queries.OPERATOR_REFUSALS_PER_S)
            assert refusals[json.loads(check)] > 0 and refusals[json.loads(slow)] == 0, refusals
            failures = _by_operator(prometheus, metrics_queries.OPERATOR_FAILURES_PER_S)
            assert set(failures.values()) <= {0.0}, failures
            queue = _by_operator(prometheus, metrics_queries.QUEUE_MS_PER_REQUEST)
            assert math.isfinite(queue["pipeline"]) and queue["pipeline"] >= 0, queue
            pending = _by_operator(prometheus, metrics_queries.PENDING_REQUESTS)
            assert pending["pipeline"] == 0, pending
            for scale_on in kubernetes.SCALE_METRICS:  # the adapter's rules, filled as it does
                documents = kubernetes.manifests(
                    deployable_image(REFERENCE, client=docker_client),
                    kubernetes.KubernetesOptions(scale_on=scale_on))
                (rule,) = yaml.safe_load(
                    documents["adapter-rules"]["data"]["config.yaml"])["rules"]
                query = (rule["metricsQuery"].replace("<<.LabelMatchers>>", 'job="triton"')
                         .replace("<<.GroupBy>>", "job"))
                (sample,) = prometheus.query(query)
                assert sample["metric"] == {"job": "triton"}, (scale_on, sample)
                assert math.isfinite(float(sample["value"][1])), (scale_on, sample)
    finally:
        try:
            docker_client.images.remove(REFERENCE, force=True)
        except Exception:  # noqa: BLE001 - the build may have failed before tagging
            pass
