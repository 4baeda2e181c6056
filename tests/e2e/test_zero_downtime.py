"""A replica that stops under load answers every request it took, and refuses the rest only with
errors a client may retry (gRPC ``UNAVAILABLE``, HTTP 503, a refused connection) — never
``NOT_FOUND`` / 400, which Triton's own SIGTERM answered for the seconds it took to unload.

Measured on the images before the drain (the demo image, ``docker stop`` under 16 looping gRPC
clients): 624 requests failed with ``NOT_FOUND: Request for unknown model: 'pipeline' has no
available versions``. Here: ``docker stop`` under 16 clients (8 gRPC, 8 HTTP, no retries), every
answer counted and compared with the in-process pipeline.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from builder import build_pipeline_model
from builder.client.errors import ServerUnavailableError
from builder.client.pipeline import Client
from builder.runtime.supervisor import FINISH_S
from builder.verify.container import ServingContainer
from builder.verify.equality import check_same
from tests.support.client_threads import ClientThreads
from tests.support.example_inputs import EXAMPLES
from tests.support.model_bound import BATCH_S, MAX_BATCH, MODEL_BOUND, TEXTS

pytestmark = pytest.mark.slow
DRAIN_S = 2.0
"""The container's drain period here (TRITON_BUILDER_DRAIN_S), shorter than the image's 5 s."""
THREADS = 16


class Looping(ClientThreads):
    """THREADS clients, half gRPC and half HTTP, each sending the next example as soon as its
    last answer came; every outcome kept with when its request was sent."""

    def __init__(self, endpoint) -> None:
        self.pipeline, self.texts = EXAMPLES["text_embedding"]
        self.expected = {text: self.pipeline(text) for text in self.texts}
        self.urls = [f"grpc://{endpoint.grpc_url}/pipeline", f"http://{endpoint.http_url}/pipeline"]
        self.outcomes: list[tuple[float, str, str]] = []
        """(sent, "ok" | "mismatch" | "unavailable" | "error", detail)"""
        super().__init__((self._loop, (self.urls[i % 2],)) for i in range(THREADS))

    def _loop(self, url: str) -> None:
        with Client(url, retries=0, timeout=30) as client:
            for text in itertools.cycle(self.texts):
                if self.stop.is_set():
                    return
                sent = time.monotonic()
                try:
                    answer = client(text)
                    check_same(answer, self.expected[text], where=text)
                    outcome = ("ok", "")
                except AssertionError as error:
                    outcome = ("mismatch", str(error)[:200])
                except ServerUnavailableError as error:
                    outcome = ("unavailable", str(error)[:200])
                    time.sleep(0.01)  # a refused client backs off a little, as a real one does
                except Exception as error:  # noqa: BLE001 - counted, then asserted on
                    outcome = ("error", f"{type(error).__name__}: {error}"[:200])
                with self.lock:
                    self.outcomes.append((sent, *outcome))

    def count(self, kind: str, since: float = 0.0, until: float = float("inf")) -> int:
        with self.lock:
            return sum(1 for sent, got, _ in self.outcomes if got == kind and since <= sent < until)


def test_a_container_stopped_under_load_loses_no_request(docker_client, text_embedding_image):
    container = ServingContainer(docker_client, text_embedding_image,
                                 environment={"TRITON_BUILDER_DRAIN_S": f"{DRAIN_S:g}"})
    grace = DRAIN_S + FINISH_S + 5
    try:
        endpoint = container.start()
        with Looping(endpoint) as load:
            deadline = time.monotonic() + 60
            while load.count("ok") < 500 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert load.count("ok") >= 500, "the load did not get going"
            stopping = time.monotonic()
            container.container.stop(timeout=int(grace))  # SIGTERM; SIGKILL after the grace
            stopped = time.monotonic()
            time.sleep(1.0)  # requests that find the port closed
        container.container.reload()
        state = container.container.attrs["State"]
        logs = container.logs()
    finally:
        container.remove()
    with load.lock:
        outcomes = list(load.outcomes)
    errors = [detail for _, kind, detail in outcomes if kind in ("error", "mismatch")]
    print(f"stopped in {stopped - stopping:.1f}s: "
          f"{sum(k == 'ok' for _, k, _ in outcomes)} answered, "
          f"{sum(k == 'unavailable' for _, k, _ in outcomes)} refused as unavailable "
          f"({sum(k == 'unavailable' and 'server is stopping' in d for _, k, d in outcomes)} "
          f"by the closing pipeline model), {len(errors)} other failures")
    assert not errors, f"failures that are not UNAVAILABLE/503, or wrong answers: {errors[:5]}"
    assert load.count("unavailable", until=stopping + DRAIN_S - 0.5) == 0, \
        "refused while draining: the replica must serve until it closes"
    assert load.count("ok", since=stopping, until=stopping + DRAIN_S - 0.5) > 0, \
        "nothing answered during the drain"
    assert state["ExitCode"] == 0 and not state["OOMKilled"], state
    assert stopped - stopping < grace, "the stop ran into its grace period"
    assert "every request in flight answered" in logs, logs[-3000:]
    assert "no available versions" not in logs


# -- overload -----------------------------------------------------------------------------------
BUDGET_MS = 50.0
OVERLOAD_S = 20.0
def _memory_mb(pid: int) -> float:
    """The resident memory of a process and its children (the server and its stubs)."""
    total = 0
    for candidate in [pid, *_children(pid)]:
        try:
            status = Path(f"/proc/{candidate}/status").read_text()
        except OSError:
            continue
        total += int(next(line.split()[1] for line in status.splitlines()
                          if line.startswith("VmRSS:")))
    return total / 1024


def _children(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in children.read_text().split()] if children.exists() else []


def _overload(server, requests, rate: float, seconds: float) -> dict:
    from tests.support.open_loop import closed_loop, open_loop

    before = _memory_mb(server.pid)
    overload = open_loop(server.grpc_url, requests, rate=rate, seconds=seconds)
    during = _memory_mb(server.pid)
    after = closed_loop(server.grpc_url, requests, concurrency=1, seconds=2)
    return {"overload": overload.summary(), "memory_mb": [round(before), round(during)],
            "after": after.summary()}


@pytest.mark.light  # the model sleeps (tests/support/model_bound.py)
def test_an_open_loop_overload_keeps_the_budget_and_refuses_the_excess(triton_server,
                                                                       tmp_path):
    """Twice the measured capacity, sent at a fixed rate for 20 s, to a model-bound pipeline:
    with a 50 ms budget the requests accepted stay within twice the budget and the rest are
    refused UNAVAILABLE at once; memory stays flat and the server serves normally right after.
    The same load without a budget is reported beside it: its queue, and every latency, grows.
    (Why a model-bound pipeline: :mod:`tests.support.model_bound`.)"""
    from tests.support.open_loop import TextRequests, closed_loop

    requests = TextRequests(TEXTS, MODEL_BOUND, "pipeline")
    reports = {}
    for name, budget in (("budget", BUDGET_MS), ("no budget", None)):
        root = tmp_path / name.replace(" ", "-")
        build_pipeline_model(MODEL_BOUND, root, parallelism=2, max_batch_size=MAX_BATCH,
                             latency_budget_ms=budget)  # two instances either way: a budget
        # gives them two (builder.repository.queue_policy), and like is compared with like
        server = triton_server(root)
        capacity = closed_loop(server.grpc_url, requests, concurrency=4 * MAX_BATCH, seconds=5)
        reports[name] = {"capacity_per_s": round(capacity.answered_per_s, 1), **_overload(
            server, requests, 2 * capacity.answered_per_s,
            OVERLOAD_S if budget else OVERLOAD_S / 2)}
        server.close()
    print(json.dumps(reports, indent=1))
    budget = reports["budget"]
    overload = budget["overload"]
    assert set(overload["failures"]) == {"StatusCode.UNAVAILABLE"}, overload["failures"]
    assert overload["p99_ms"] <= 2 * BUDGET_MS, overload
    assert overload["sent_per_s"] >= 1.8 * budget["capacity_per_s"], "not an overload"
    assert budget["memory_mb"][1] - budget["memory_mb"][0] < 50, budget["memory_mb"]
    after = budget["after"]  # one request at a time, as before the overload
    assert not after["failures"] and after["p50_ms"] < 3 * BATCH_S * 1000, after
