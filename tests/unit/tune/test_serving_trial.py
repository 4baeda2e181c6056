"""A search's trials served one after another by real host ``tritonserver`` processes and loaded
by real perf_analyzer: each server is stopped while the next one starts, no load begins before the
last server has exited, and leaving the trial stops the last one.

Why it matters: a server takes two to four seconds to exit (it polls its models' unloading once a
second), seven or more times a search; waiting for each before the next start once cost a
two-minute search a fifth of its time.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import pytest

from builder import build_pipeline_model
from builder.tritonserver.host_process import TritonServer
from builder.tune import serving_trial
from builder.tune.perf_analyzer import perf_analyzer, write_input_data
from builder.tune.serving_trial import ServingTrial
from builder.tune.settings import read_setting
from tests.support.model_bound import MAX_BATCH, MODEL_BOUND

pytestmark = [pytest.mark.tritonserver, pytest.mark.light]  # servers starting and stopping
"""Starts its own servers and measures with perf_analyzer: alone, as every latency test."""


NEXT_START_TIMEOUT_S = 120.0
"""How long the first server's stop waits for the next server: far past a start on a loaded
machine (seconds); reached only where the trial does not overlap the two."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    work = tmp_path_factory.mktemp("serving-trial")
    built = build_pipeline_model(MODEL_BOUND, work / "models", max_batch_size=4 * MAX_BATCH)
    data = write_input_data(built.signature, MODEL_BOUND.examples, work / "input.json")
    return built, data


def _trial(repository, serve) -> ServingTrial:
    built, data = repository
    return ServingTrial(built.model_root, built.pipeline_model, perf_analyzer(), data,
                        budget_ms=1000.0, max_concurrency=1, serve=serve)


def test_the_next_server_starts_while_the_last_one_stops(repository, monkeypatch):
    """The first server's stop waits for the next server to be up: a trial that stopped the
    last server before starting the next would leave it waiting (and the next never started),
    so the overlap is shown by the order of events, whatever the machine's speed."""
    built, _ = repository
    events: list[tuple[str, object]] = []
    pids: list[int] = []
    next_up = threading.Event()
    stopped_after_next_up: list[bool] = []
    measure_load = serving_trial.measure_load

    @contextmanager
    def serve(root):
        with TritonServer(root) as server:
            pid = server.pid
            first = not pids
            pids.append(pid)
            events.append(("up", pid))
            if not first:
                next_up.set()
            yield server
            if first:
                stopped_after_next_up.append(next_up.wait(timeout=NEXT_START_TIMEOUT_S))
        events.append(("down", pid))

    def measure(*args, **kwargs):
        events.append(("load", [pid for pid in pids if _alive(pid)]))
        return measure_load(*args, **kwargs)

    monkeypatch.setattr(serving_trial, "measure_load", measure)
    setting = read_setting(built.model_root, built.pipeline_model, ())
    with _trial(repository, serve) as trial:
        first = trial(setting, 1)
        second = trial(setting.with_model(built.pipeline_model, instances=2), 1)
    a, b = pids
    assert stopped_after_next_up == [True], "the first server's stop came before the next start"
    steps = [what for at, (what, _) in enumerate(events)
             if what != "load" or events[at - 1][0] != "load"]  # measured again, unstable: one step
    assert steps == ["up", "load", "up", "down", "load", "down"], events
    second_up = events.index(("up", b))
    assert all(alive == ([a] if at < second_up else [b])
               for at, (what, alive) in enumerate(events) if what == "load"), (
        "a load began while another server was still running")
    assert events.index(("down", a)) > second_up and events[-1] == ("down", b)
    assert not _alive(a) and not _alive(b)
    assert first.within_budget and second.within_budget and first.rate > 0 < second.rate


def test_a_failed_stop_is_raised_by_the_next_trial_which_stops_its_own_server(repository):
    built, _ = repository
    started: list[int] = []

    @contextmanager
    def serve(root):
        first = not started
        with TritonServer(root) as server:
            started.append(server.pid)
            yield server
        if first:
            raise RuntimeError("the first server's stop failed")

    setting = read_setting(built.model_root, built.pipeline_model, ())
    with _trial(repository, serve) as trial:
        trial(setting, 1)
        with pytest.raises(RuntimeError, match="the first server's stop failed"):
            trial(setting, 1)
    assert len(started) == 2 and not any(_alive(pid) for pid in started)
