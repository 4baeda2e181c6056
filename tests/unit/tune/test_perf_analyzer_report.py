"""What perf_analyzer reports, read: a stream's latency is to its first response."""

from __future__ import annotations

import pytest

from builder.tune.perf_analyzer import PerfAnalyzerError, first_response_latencies


def _request(sent_ns: int, *first_ns: int) -> dict:
    return {"timestamp": sent_ns, "response_timestamps": list(first_ns)}


def test_a_streams_latency_is_to_its_first_response_within_the_reported_windows():
    """perf_analyzer's profile export (``--profile-export-file``): requests before the last three
    windows (the stable ones its report is of) and streams that answered nothing are left out."""
    ms = 1_000_000
    requests = [_request(0, 500 * ms, 900 * ms)]  # before the reported windows
    requests += [_request((100 + i) * ms, (100 + i + 10 + i % 3) * ms, (400 + i) * ms)
                 for i in range(100)]
    requests += [_request(150 * ms)]  # no response yet
    profile = {"experiments": [
        {"experiment": {"mode": "concurrency", "value": 1}, "requests": [],
         "window_boundaries": [0, 1]},
        {"experiment": {"mode": "concurrency", "value": 4}, "requests": requests,
         "window_boundaries": [0, 50 * ms, 100 * ms, 150 * ms, 200 * ms, 250 * ms]}]}
    p50, p99 = first_response_latencies(profile, 4)
    assert (p50, p99) == (11.0, 12.0)
    with pytest.raises(PerfAnalyzerError, match="concurrency 8"):
        first_response_latencies(profile, 8)
