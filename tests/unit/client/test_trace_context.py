"""The client sends its caller's trace (issue 67, item 1): OpenTelemetry's current span as
W3C ``traceparent``, per thread and per coroutine, nothing without a span."""

from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from builder.client.trace_context import trace_headers


@pytest.fixture(scope="module")
def tracer():
    return TracerProvider().get_tracer("test")


def _traceparent(span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def test_the_current_span_is_sent_and_nothing_without_one(tracer):
    assert trace_headers() is None
    with tracer.start_as_current_span("caller") as span:
        assert trace_headers()["traceparent"] == _traceparent(span)
    assert trace_headers() is None


def test_each_thread_and_coroutine_sends_its_own(tracer):
    seen = {}

    def in_thread(name):
        with tracer.start_as_current_span(name) as span:
            seen[name] = (trace_headers()["traceparent"], _traceparent(span))

    threads = [threading.Thread(target=in_thread, args=(f"t{k}",)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    async def in_task(name):
        with tracer.start_as_current_span(name) as span:
            await asyncio.sleep(0.01)  # the others run meanwhile
            seen[name] = (trace_headers()["traceparent"], _traceparent(span))

    async def together():
        await asyncio.gather(*(in_task(f"c{k}") for k in range(4)))

    asyncio.run(together())
    assert len(seen) == 8 and all(sent == own for sent, own in seen.values())
    assert len({sent for sent, _ in seen.values()}) == 8
    assert trace.get_current_span().get_span_context().is_valid is False
