"""Open-loop load over gRPC: requests sent at a fixed rate whatever the answers, as real traffic
comes — the overload a closed loop (each client waits for its answer) can never make, since
there the server's slowness slows the senders down too.

One asyncio event loop sends on schedule (a batch every millisecond, so a late tick catches up)
and records each request's outcome: the answer checked against the in-process pipeline, or
its gRPC status. Used by ``tests/e2e/test_zero_downtime.py`` and ``benchmarks/bench_overload.py``.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc


@dataclass
class Outcome:
    sent: float
    """Seconds after the run began."""
    latency: float
    status: str
    """``"ok"``, ``"wrong"``, or the gRPC status of a failure (``"StatusCode.UNAVAILABLE"``)."""
    detail: str = ""


@dataclass
class LoadReport:
    """What a run of :func:`open_loop` (or :func:`closed_loop`) saw."""

    seconds: float
    outcomes: list[Outcome] = field(default_factory=list)

    def of(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def sent_per_s(self) -> float:
        return len(self.outcomes) / self.seconds

    @property
    def answered_per_s(self) -> float:
        return len(self.of("ok")) / self.seconds

    @property
    def last_answer_s(self) -> float:
        """When the last answer came, in seconds after the run began: past ``seconds`` by the
        time it took to work off what was queued."""
        return max((o.sent + o.latency for o in self.of("ok")), default=float("nan"))

    def latency_ms(self, quantile: float, status: str = "ok") -> float:
        values = sorted(o.latency for o in self.of(status))
        if not values:
            return float("nan")
        return 1000 * values[min(len(values) - 1, int(quantile * len(values)))]

    def p99_by_second(self) -> list[float]:
        """The answered requests' p99 latency (ms) by the second they were sent in: a queue
        that grows shows as a climb."""
        seconds: dict[int, list[float]] = {}
        for outcome in self.of("ok"):
            seconds.setdefault(int(outcome.sent), []).append(outcome.latency)
        return [round(1000 * sorted(v)[min(len(v) - 1, int(0.99 * len(v)))], 1)
                for _, v in sorted(seconds.items())]

    def failures(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes:
            if outcome.status != "ok":
                counts[outcome.status] = counts.get(outcome.status, 0) + 1
        return counts

    def summary(self) -> dict[str, Any]:
        return {"sent_per_s": round(self.sent_per_s, 1),
                "answered_per_s": round(self.answered_per_s, 1),
                "p50_ms": round(self.latency_ms(0.5), 2), "p99_ms": round(self.latency_ms(0.99), 2),
                "max_ms": round(self.latency_ms(1.0), 2), "failures": self.failures(),
                "p99_ms_by_second": self.p99_by_second()}


class TextRequests:
    """Requests of a pipeline with one string input, each serialised once, and the answer each
    must get. The client calls gRPC's generated stub with the prepared messages: at thousands of
    requests a second on the same two cores as the server, tritonclient's per-call work (tensor
    objects, numpy conversions) made the client itself the bottleneck, and its lag showed up
    as seconds of latency that the server never had."""

    def __init__(self, texts: Sequence[str], pipeline: Callable[[str], Any], model: str,
                 input_name: str = "text", output_name: str = "vec") -> None:
        self.texts = list(texts)
        self.expected = [np.asarray(pipeline(text), dtype=np.float32) for text in self.texts]
        self.messages = []
        for text in self.texts:
            raw = text.encode()
            self.messages.append(service_pb2.ModelInferRequest(
                model_name=model,
                inputs=[service_pb2.ModelInferRequest.InferInputTensor(
                    name=input_name, datatype="BYTES", shape=[1, 1])],
                outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(
                    name=output_name)],
                raw_input_contents=[struct.pack("<I", len(raw)) + raw]))

    def correct(self, index: int, response: Any) -> bool:
        answer = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
        return answer.shape == self.expected[index].shape and np.allclose(
            answer, self.expected[index], rtol=1e-4, atol=1e-5)


async def _one(stub: Any, requests: TextRequests, index: int, began: float, timeout: float,
               outcomes: list[Outcome]) -> None:
    sent = time.monotonic()
    try:
        response = await stub.ModelInfer(requests.messages[index], timeout=timeout)
        status, detail = ("ok", "") if requests.correct(index, response) else ("wrong", "")
    except grpc.aio.AioRpcError as error:
        status, detail = str(error.code()), (error.details() or "")[:120]
    outcomes.append(Outcome(sent - began, time.monotonic() - sent, status, detail))


def _channel(url: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", -1),
                                                   ("grpc.max_send_message_length", -1)])


async def _open_loop(url: str, requests: TextRequests, rate: float, seconds: float,
                     timeout: float) -> LoadReport:
    channel = _channel(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    outcomes: list[Outcome] = []
    tasks = set()
    began = time.monotonic()
    sent = 0
    try:
        while (now := time.monotonic() - began) < seconds:
            due = int(now * rate) + 1
            while sent < due:
                task = asyncio.create_task(_one(stub, requests, sent % len(requests.texts),
                                                began, timeout, outcomes))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
            await asyncio.sleep(0.001)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout + 5)
    finally:
        await channel.close()
    return LoadReport(seconds, outcomes)


async def _closed_loop(url: str, requests: TextRequests, concurrency: int, seconds: float,
                       timeout: float) -> LoadReport:
    channel = _channel(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    outcomes: list[Outcome] = []
    began = time.monotonic()

    async def worker(offset: int) -> None:
        index = offset
        while time.monotonic() - began < seconds:
            await _one(stub, requests, index % len(requests.texts), began, timeout, outcomes)
            index += concurrency

    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        await channel.close()
    return LoadReport(seconds, outcomes)


def open_loop(url: str, requests: TextRequests, rate: float, seconds: float,
              timeout: float = 60.0) -> LoadReport:
    """Send ``rate`` requests a second for ``seconds``, then wait for the last answers."""
    return asyncio.run(_open_loop(url, requests, rate, seconds, timeout))


def closed_loop(url: str, requests: TextRequests, concurrency: int = 32,
                seconds: float = 5.0, timeout: float = 60.0) -> LoadReport:
    """``concurrency`` requests in flight for ``seconds``: the rate the server can answer."""
    return asyncio.run(_closed_loop(url, requests, concurrency, seconds, timeout))
