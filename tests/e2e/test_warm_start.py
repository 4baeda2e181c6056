"""Ready means warm in the built image (issue 66): the example text-embedding image, run as
``docker run`` runs it, is ready only after its examples went through Triton's own HTTP front end
(the supervisor's ready gate), which its model index and statistics show, and then answers
concurrent distinct requests as the pipeline does in process. The first request's latency
against the next ones is a figure, in ``benchmarks/bench_warm_start.py`` (BENCHMARKS.md), not a
timed assert here."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from builder.client.pipeline import Client
from builder.runtime.supervisor import ADMIN_KEY_HEADER, ADMIN_KEY_VARIABLE, GATE_MODEL
from builder.runtime.supervisor.ready_gate import ROUNDS
from builder.runtime.warm_up import MAX_EXAMPLES
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from pipelines.text_embedding import pipeline
from tests.support.example_inputs import TEXTS

KEY = "an-operators-key-for-the-index-0123"


def _http(url: str, body: bytes | None = None) -> dict | list:
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET",
                                     headers={ADMIN_KEY_HEADER: KEY})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_the_image_is_ready_only_once_its_examples_went_through_the_front_end(
        docker_client, text_embedding_image):
    samples = min(len(pipeline.examples), MAX_EXAMPLES)
    with ServingContainer(docker_client, text_embedding_image,
                          environment={ADMIN_KEY_VARIABLE: KEY}) as endpoint:
        base = f"http://{endpoint.http_url}/v2"
        deadline = time.monotonic() + 10
        while True:  # the python backend reports a request's statistics after its response
            (stats,) = _http(f"{base}/models/pipeline/stats")["model_stats"]
            if stats["inference_count"] >= samples * (1 + ROUNDS) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert stats["inference_count"] == samples * (1 + ROUNDS), \
            "before any request: Triton's samples, then the gate's, ROUNDS times"
        container = docker_client.containers.get(endpoint.container_id)
        while "ready: " not in (logs := container.logs().decode()) \
                and time.monotonic() < deadline:  # said after the gate's unload, past ready
            time.sleep(0.05)
        assert re.search(rf"ready: {samples * ROUNDS} warm-up requests through the HTTP front "
                         r"end", logs), logs
        assert logs.index(f"successfully unloaded '{GATE_MODEL}'") < logs.index("ready: ")
        index = _http(f"{base}/repository/index", b"{}")
        assert {"name": GATE_MODEL, "state": "UNAVAILABLE", "reason": "unloaded"} in [
            {key: entry.get(key) for key in ("name", "state", "reason")} for entry in index]
        calls = TEXTS[:16]
        with Client(f"grpc://{endpoint.grpc_url}/pipeline") as served, \
                ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(served, calls))
        for call, answer in zip(calls, answers, strict=True):
            check_same(answer, pipeline(call), where=f"{call!r:.40}")
