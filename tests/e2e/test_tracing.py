"""One request through the served pipeline, traced (issue 67, item 1): real dockerd, Triton and
OpenTelemetry SDK in the image, a real OTLP/HTTP receiver here.

The image is built ``--tracing`` and run with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at the
receiver (through the bridge's gateway). Sixteen clients at once — half over gRPC, half over
HTTP — each call under a span of their own; our ``Client`` sends it as ``traceparent``, Triton
forwards the header into the request's parameters. Every answer must equal the pipeline's in
process, and for every request the receiver must hold one tree with the client's trace id:
``pipeline`` under the client's span, each operator under it, the model call under the model
operator — and no span of one request under another's, however Triton batched them.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider

from builder import build_docker_image, pipe
from builder.client.pipeline import Client
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from builder.verify.weights_source import bridge_gateway
from tests.support.otlp_receiver import OtlpReceiver, trees
from tests.support.tiny_models import affine_op

pytestmark = [pytest.mark.slow]
REFERENCE = "triton-builder-test/tracing:1"
CLIENTS = 16


def scaled(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float32) * 2


def total(y: np.ndarray) -> float:
    return float(np.sum(y))


PIPELINE = (pipe.input("v").map("v", "scaled", scaled).map("scaled", "y", affine_op())
            .map("y", "total", total).output("y", "total")
            .with_example(np.ones(4, np.float32)))
LABELS = [node.label for node in PIPELINE.plan.nodes]
SPANS_PER_REQUEST = 1 + len(LABELS) + 1  # the pipeline, each operator, the model call


def _row(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(4).astype(np.float32)


def test_every_concurrent_request_is_one_tree_under_its_clients_span(docker_client,
                                                                     cpu_base_image):
    tracer = TracerProvider().get_tracer("test-clients")
    try:
        build_docker_image(PIPELINE, REFERENCE, client=docker_client, tracing=True)
        with OtlpReceiver() as receiver:
            environment = {
                "OTEL_EXPORTER_OTLP_ENDPOINT":
                    f"http://{bridge_gateway(docker_client)}:{receiver.port}",
                "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_SERVICE_NAME": "embed-test"}
            with ServingContainer(docker_client, REFERENCE, environment=environment) as endpoint:
                urls = [f"grpc://{endpoint.grpc_url}/pipeline",
                        f"http://{endpoint.http_url}/pipeline"]
                clients = [Client(url) for url in urls]
                sent: dict[int, tuple[str, str]] = {}
                failures: list[BaseException] = []
                start = threading.Barrier(CLIENTS)

                def one(k: int) -> None:
                    try:
                        start.wait()
                        with tracer.start_as_current_span(f"client {k}") as span:
                            context = span.get_span_context()
                            sent[k] = (f"{context.trace_id:032x}", f"{context.span_id:016x}")
                            check_same(clients[k % 2](_row(k)), PIPELINE(_row(k)),
                                       where=f"client {k}")
                    except BaseException as error:  # noqa: BLE001 - raised below
                        failures.append(error)

                threads = [threading.Thread(target=one, args=(k,)) for k in range(CLIENTS)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                for client in clients:
                    client.close()
                assert not failures, failures
                spans = receiver.wait_for(CLIENTS * SPANS_PER_REQUEST, timeout=60)
    finally:
        try:
            docker_client.images.remove(REFERENCE, force=True)
        except Exception:  # noqa: BLE001 - the build may have failed before tagging
            pass

    found = trees(spans)
    assert set(found) == {trace for trace, _ in sent.values()}, "a trace per client, no other"
    batched = []
    for k, (trace, client_span) in sent.items():
        tree = found[trace]
        assert sum(len(children) for children in tree.values()) == SPANS_PER_REQUEST, (k, tree)
        (root,) = tree[client_span]
        assert root.name == "pipeline pipeline" and root.service == "embed-test"
        assert root.attributes["triton_builder.calls"] == 1
        batched.append(root.attributes["triton_builder.batch_requests"])
        operators = tree[root.span_id]
        assert [span.name for span in operators] == [f"operator {label}" for label in LABELS]
        for span in operators:
            assert span.attributes["triton_builder.rows"] == 1
            assert span.attributes["triton_builder.outcome"] == "ok"
            assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns
        (model_call,) = tree[operators[1].span_id]
        assert model_call.name == "model affine"
        assert model_call.attributes["triton_builder.route"] == "in_process"
        assert model_call.attributes["triton_builder.rows"] == 1
        assert operators[1].start_ns <= model_call.start_ns <= model_call.end_ns \
            <= operators[1].end_ns
    print(f"requests per served batch, as each request saw it: {sorted(batched)}")
