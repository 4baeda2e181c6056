"""perf_analyzer fetched for real and run against a host ``tritonserver`` serving two example
pipelines (text in, PNG bytes in) with their own examples as input data.

What it reports must be what the server served: Triton's own statistics count at least the
requests perf_analyzer counted, all of them successful (random bytes would fail to decode).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from builder import build_pipeline_model
from builder.tritonserver.host_process import TritonServer
from builder.tune.perf_analyzer import (
    PerfAnalyzerError,
    measure_load,
    perf_analyzer,
    write_input_data,
)

pytestmark = [pytest.mark.tritonserver, pytest.mark.alone]
"""The module starts its own server (one for every test: two cores), so it marks itself as the
``triton_server`` fixture would; alone, since it measures latency."""

PIPELINES = ("text_embedding", "image_classification")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with each example pipeline served under its module's name, and its input data."""
    import importlib

    work = tmp_path_factory.mktemp("perf-analyzer")
    data = {}
    for name in PIPELINES:  # a repository each: a build replaces its whole model root
        pipeline = importlib.import_module(f"pipelines.{name}").pipeline
        build_pipeline_model(pipeline, work / name, name=name)
        data[name] = write_input_data(pipeline.signature(), pipeline.examples,
                                      work / f"{name}.json")
    first, *others = (work / name for name in PIPELINES)
    with TritonServer(first, extra_args=tuple(f"--model-repository={r}" for r in others)) \
            as server:
        yield server, data


@pytest.fixture(scope="module")
def analyzer():
    return perf_analyzer()


def success_and_failures(server: TritonServer, model: str) -> tuple[int, int]:
    url = f"http://{server.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        (stats,) = json.load(response)["model_stats"]
    return stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"]


@pytest.mark.parametrize("model", PIPELINES)
def test_a_measurement_is_what_the_server_served(served, analyzer, model):
    server, data = served
    success, failures = success_and_failures(server, model)
    point = measure_load(analyzer, server.grpc_url, model, data[model], 2,
                         stability_percent=50, max_trials=10)  # the first after a start is slow
    print(point)
    assert point.concurrency == 2
    assert point.rate > 0 and point.requests > 0
    assert 0 < point.p50_ms <= point.p99_ms
    after, failures_after = success_and_failures(server, model)
    assert after - success >= point.requests
    assert failures_after == failures


def test_an_unknown_model_is_named_in_the_error(served, analyzer):
    server, data = served
    with pytest.raises(PerfAnalyzerError) as raised:
        measure_load(analyzer, server.grpc_url, "no_such_pipeline", data["text_embedding"], 2)
    _, output = str(raised.value).split("\n", 1)  # perf_analyzer's own words, after ours
    assert "no_such_pipeline" in output


def test_a_binary_whose_libraries_do_not_load_is_refused_naming_them(analyzer, monkeypatch):
    """``$TRITON_BUILDER_PERF_ANALYZER`` names the binary alone: without the cache's library
    directory on ``LD_LIBRARY_PATH`` the loader misses what the system lacks."""
    from builder.tune.perf_analyzer import _system_has

    lacking = [name for name in ("libb64.so.0d", "libcudart.so.12") if not _system_has(name)]
    if not lacking:
        pytest.skip("this system has every library perf_analyzer needs")
    monkeypatch.setenv("TRITON_BUILDER_PERF_ANALYZER", str(analyzer.path))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    with pytest.raises(PerfAnalyzerError, match="does not run: missing ") as raised:
        perf_analyzer()
    assert all(name in str(raised.value) for name in lacking), raised.value


def spelled(count: int):
    """``count`` letters, 20 ms apart: a stream whose first item comes long before its end."""
    import time

    for i in range(int(count)):
        time.sleep(0.02)
        yield chr(ord("a") + i)


@pytest.mark.light  # its stream sleeps between items
def test_a_stream_is_measured_to_its_first_response(tmp_path, analyzer):
    """A streaming pipeline is decoupled: perf_analyzer loads it with streams, and the latency
    a stream's budget bounds is that of its first item (20 ms here), not of its end (200 ms)."""
    from builder import pipe

    spelling = pipe.input("count").stream("count", "letter", spelled).output("letter")
    spelling = spelling.with_example(10)
    build_pipeline_model(spelling, tmp_path / "models", name="spelling")
    data = write_input_data(spelling.signature(), spelling.examples, tmp_path / "input.json")
    with TritonServer(tmp_path / "models") as server:
        success, _ = success_and_failures(server, "spelling")
        point = measure_load(analyzer, server.grpc_url, "spelling", data, 2, streaming=True,
                             stability_percent=50, max_trials=10)
        after, failures = success_and_failures(server, "spelling")
    print(point)
    assert 20 <= point.p50_ms <= point.p99_ms < 150
    assert 0 < point.rate < 2 / 0.2 * 1.1  # two streams in flight, 200 ms each
    assert after - success >= point.requests and failures == 0


def test_fetching_perf_analyzer_is_not_the_searchs_time(analyzer, monkeypatch):
    """On a fresh machine perf_analyzer is fetched on tune's first call (PyPI, Debian's libb64):
    tens of seconds that once ate a one-minute search, which then kept the defaults untried
    (the suite on an empty machine). The search's deadline starts once the tool is ready."""
    import time

    from builder.tune import tuner
    from pipelines import text_embedding

    fetch_s = 3.0

    def slow_fetch():
        time.sleep(fetch_s)
        return analyzer

    class Stop(Exception):
        pass

    def search(trial, deadline, log):
        raise Stop(deadline - time.monotonic())

    monkeypatch.setattr(tuner, "perf_analyzer", slow_fetch)
    monkeypatch.setattr(tuner, "Search", search)
    with pytest.raises(Stop) as stopped:
        tuner.tune(text_embedding.pipeline, 50, minutes=0.1)
    left = stopped.value.args[0]
    assert left > 0.1 * 60 - fetch_s / 2, f"{left:.1f} s of a 6 s search left once it began"
