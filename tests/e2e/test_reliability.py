"""What goes wrong in production, on the real engine, registry and Triton: a build interrupted
mid-step, a registry that goes away during a push, bad requests among good ones, a load test
(interrupted ``triton-builder image`` runs: ``test_interrupted_build.py``).

Lean on purpose (CI runs it whole): one image of the text-embedding pipeline, shared by the
serving tests; the load test's size is :data:`LOAD_REQUESTS` at :data:`LOAD_CONCURRENCY`
(10,000 at 32 in flight, as issue 14 asks; ``TRITON_BUILDER_LOAD_REQUESTS`` changes it).
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from tests.support.client_threads import ClientThreads
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow
ROOT = REPO_ROOT


# -- a served image under stress --------------------------------------------------------------
HEALTH_INTERVAL_S, HEALTH_RETRIES = 2, 3


def _fast_healthcheck(client, image: str) -> dict:
    """The image's own health check command, run every HEALTH_INTERVAL_S instead of 15 s."""
    test = client.images.get(image).attrs["Config"]["Healthcheck"]["Test"]
    return {"test": test, "interval": HEALTH_INTERVAL_S * 10**9, "timeout": 5 * 10**9,
            "retries": HEALTH_RETRIES, "start_period": 60 * 10**9}


def _health(container) -> str:
    container.reload()
    return container.attrs["State"]["Health"]["Status"]


KILL_STUBS = (
    "import os, signal, sys\n"
    "models = sys.argv[1:]\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
    "        parent = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1]\n"
    "        server = open(f'/proc/{parent}/comm').read().strip() == 'tritonserver'\n"
    "    except OSError:\n"
    "        continue\n"
    "    if cmd[0].endswith(b'triton_python_backend_stub') and len(cmd) > 8 and server \\\n"
    "            and any(cmd[1].startswith(f'/models/{m}/'.encode()) for m in models) \\\n"
    "            and cmd[8].decode() not in models:\n"
    "        os.kill(int(pid), signal.SIGKILL); print(pid)\n"
)
"""Kill the model instance stubs of the models named as arguments (run inside the container):
those of the running server only. After the upstream crash that makes the supervisor start the
server again, a stub of the crashed one may live on for a moment, an orphan (its parent now the
supervisor), until it sees its server gone: seen once in CI, it was killed too and counted."""
KILL_PIPELINE_STUB = KILL_STUBS.replace("sys.argv[1:]", "['pipeline']")
"""The same, for the pipeline model alone, without arguments (tests/e2e/test_swarm.py)."""
CANNOT_HEAL_PIPELINE = ["sh", "-c", "echo 'raise RuntimeError(\"cannot start\")' "
                        "> /models/pipeline/1/model.py"]
"""Run inside a container before killing the stub: every reload of the pipeline model fails.
(A missing model.py would not do: Triton 2.51's load then hangs, see RestartPolicy.)"""
ABORT_SERVER = (
    "import os, signal\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        name = open(f'/proc/{pid}/comm').read().strip()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if name == 'tritonserver':\n"
    "        os.kill(int(pid), signal.SIGABRT); print(pid)\n"
)
"""Abort ``tritonserver`` as the python backend does on a ``lock_exception`` (in the container)."""
HEAL_KILLS = 20
HEAL_BOUND_S = 60.0
"""The acceptance bound of each heal; the goal (5 s at the median) is reported, not asserted."""
HEAL_GOAL_P50_S = 5.0
HEAL_LOAD_THREADS = 4
RESULTS = ROOT / "build" / "results"


def _kill(container, *models: str) -> list[str]:
    killed = container.exec_run(["python3", "-c", KILL_STUBS, *models]).output.split()
    assert len(killed) == len(models), (models, killed, _supervisor_log(container))
    return killed


def _log_tail(container, lines: int = 40) -> str:
    return "\n".join(container.logs().decode(errors="replace").splitlines()[-lines:])


def _supervisor_log(container) -> str:
    return "\n".join(line for line in container.logs().decode(errors="replace").splitlines()
                     if "triton-builder supervisor" in line)


class _Load(ClientThreads):
    """Requests sent back to back from HEAL_LOAD_THREADS threads per model — the pipeline model
    (answers compared with the in-process pipeline) and ``text_encoder``, called directly as
    clients may (answers compared with its answer before any kill) — each kept with the time
    it was sent, the time it came back, and why it was wrong if it was."""

    def __init__(self, grpc_url: str) -> None:

        import numpy as np
        import tritonclient.grpc as grpcclient

        from pipelines.text_embedding import Tokenizer, pipeline
        from tests.support.example_inputs import TEXTS

        self.grpc_url = grpc_url
        self.texts = TEXTS
        self.expected = [pipeline(text) for text in TEXTS]
        ids, mask = Tokenizer()(TEXTS[0])
        inputs = [grpcclient.InferInput("ids", [1, ids.size], "INT64"),
                  grpcclient.InferInput("mask", [1, mask.size], "FP32")]
        inputs[0].set_data_from_numpy(ids[None])
        inputs[1].set_data_from_numpy(mask[None])
        self.encoder_inputs = inputs
        with grpcclient.InferenceServerClient(grpc_url) as client:
            self.encoder_expected = client.infer("text_encoder", inputs).as_numpy("output_0")
        self.np = np
        self.answers: dict[str, list[tuple[float, float, str | None]]] = {
            "pipeline": [], "text_encoder": []}
        super().__init__((target, (n,)) for target in (self._pipeline, self._text_encoder)
                         for n in range(HEAL_LOAD_THREADS))

    def _record(self, model: str, sent: float, call) -> None:
        try:
            call()
            why = None
        except Exception as error:  # noqa: BLE001 - every failure is data here
            why = f"{type(error).__name__}: {error}"
        with self.lock:
            self.answers[model].append((sent, time.monotonic(), why))

    def _pipeline(self, offset: int) -> None:
        from builder.client.pipeline import Client
        from builder.verify.equality import check_same

        with Client(f"grpc://{self.grpc_url}/pipeline") as client:
            n = offset
            while not self.stop.is_set():
                index = n % len(self.texts)
                self._record("pipeline", time.monotonic(), lambda i=index: check_same(
                    client(self.texts[i]), self.expected[i]))
                n += HEAL_LOAD_THREADS

    def _text_encoder(self, offset: int) -> None:
        import tritonclient.grpc as grpcclient

        def call() -> None:
            answer = client.infer("text_encoder", self.encoder_inputs).as_numpy("output_0")
            assert self.np.allclose(answer, self.encoder_expected, atol=1e-5), "other answer"

        with grpcclient.InferenceServerClient(self.grpc_url) as client:
            while not self.stop.is_set():
                self._record("text_encoder", time.monotonic(), call)

    def first_correct_after(self, moment: float, model: str) -> float | None:
        with self.lock:
            times = [answered for sent, answered, why in self.answers[model]
                     if sent >= moment and why is None]
        return min(times) if times else None

    def first_failure_after(self, moment: float, model: str) -> float | None:
        with self.lock:
            times = [answered for sent, answered, why in self.answers[model]
                     if answered >= moment and why is not None]
        return min(times) if times else None

    def since(self, moment: float, model: str) -> str:
        """What came back for ``model`` after ``moment``: for a failure message."""
        with self.lock:
            after = [(answered - moment, why) for sent, answered, why in self.answers[model]
                     if answered >= moment]
        correct = [at for at, why in after if why is None]
        return (f"{model} since then: {len(correct)} correct, {len(after) - len(correct)} failed"
                + (f", the last answer at +{after[-1][0]:.2f}s" if after else ", no answer"))

    def failures_between(self, start: float, end: float, model: str) -> list[str]:
        with self.lock:
            return [why for sent, answered, why in self.answers[model]
                    if why is not None and start <= answered <= end]


def _metric(container, name: str) -> dict[str, float]:
    """A counter of the supervisor's metrics endpoint, read from inside the container."""
    text = container.exec_run(["python3", "-c", (
        "import urllib.request\n"
        "print(urllib.request.urlopen('http://127.0.0.1:8003/metrics').read().decode())")]
    ).output.decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            values[labels.split('"')[1]] = float(value)
        elif line.startswith(name + " "):  # a counter without labels
            values[""] = float(line.split()[1])
    return values


def _risen(container, name: str, label: str, before: float) -> float | None:
    """Now, if the supervisor's counter ``name{label}`` is above ``before`` (polled: an upper
    bound on when it rose); else None, as :func:`_wait_for` probes return."""
    return time.monotonic() if _metric(container, name).get(label, 0) > before else None


def test_killed_stubs_heal_in_place_under_load(docker_client, text_embedding_image):
    """Kill python backend stubs HEAL_KILLS times under load — the pipeline model's, the model
    operator's (``text_encoder``) and both at once — in the built example image: the server
    never exits, every kill heals within HEAL_BOUND_S, a model is reloaded only when its own
    stub died, and the healed container is healthy. Reports the time from kill to the first
    correct answer of each killed model and the requests that failed meanwhile (printed, and
    written to build/results/healing.json).

    Now and then Triton 2.51's python backend aborts the server when a stub is killed while it
    holds a lock in its shared memory (``boost::interprocess::lock_exception``); the supervisor
    then starts the server again in place. Such a kill must heal all the same (it is counted
    and reported as a server restart, not hidden): the container never exits. So must the
    kills after which the supervisor restarts the server on purpose: the container runs with
    Docker's default 64 MB /dev/shm, which the regions Triton keeps of stubs killed under load
    fill after about a dozen kills (``Supervisor._shared_memory_short``).

    On the CPU base the pipeline model runs ``text_encoder`` in its own process (not over BLS),
    so that model's heal is measured on requests to ``text_encoder`` itself, as clients may
    call it. The supervisor's give-up window is shortened to 1 s so that 20 kills within about
    a minute and a half each measure one heal, as for a stub that dies once in a while; the
    backoff and the give-up are tested in tests/unit/runtime/test_supervisor.py and below."""
    import json
    import statistics

    from builder.verify.container import ServingContainer

    targets = [("pipeline",), ("text_encoder",), ("pipeline", "text_encoder")]
    environment = {"TRITON_BUILDER_HEAL_WINDOW_S": "1"}
    runs = []
    with ServingContainer(docker_client, text_embedding_image,
                          environment=environment) as endpoint:
        container = docker_client.containers.get(endpoint.container_id)
        with _Load(endpoint.grpc_url) as load:
            for model in ("pipeline", "text_encoder"):
                assert _wait_for(lambda m=model: load.first_correct_after(0.0, m), 30)
            for kill in range(HEAL_KILLS):
                models = targets[kill % len(targets)]
                time.sleep(1.5)  # beyond the window: each kill is a first failure
                reloads = _metric(container, "triton_builder_stub_restarts_total")
                servers = _metric(container, "triton_builder_server_restarts_total").get("", 0)
                killed_at = time.monotonic()  # the kill lands within the exec: an upper bound
                _kill(container, *models)

                def seen_dead(model: str, since: float = killed_at,
                              reloads: dict[str, float] = reloads,
                              servers: float = servers) -> float | None:
                    """The first failed request of ``model``; where the dead stub held none (it
                    happens, about one kill in 20 here), the reload the supervisor counted, or
                    the server's restart where the kill aborted it before the reload was done
                    (the pipeline client retries UNAVAILABLE: such an outage may fail no
                    request), seen by polling its metrics (an upper bound)."""
                    failed = load.first_failure_after(since, model)
                    return failed if failed is not None else (_risen(
                        container, "triton_builder_stub_restarts_total", model,
                        reloads.get(model, 0)) or _risen(
                        container, "triton_builder_server_restarts_total", "", servers))

                down = [_wait_for(lambda m=model: seen_dead(m), 30) for model in models]
                assert None not in down, (
                    f"kill {kill + 1}: {models} neither failed nor reloaded: {down}\n"
                    + "; ".join(load.since(killed_at, m) for m in models) + "\n"
                    + _supervisor_log(container))
                healed = [_wait_for(lambda since=since, m=model:  # sent once it was seen dead
                                    load.first_correct_after(since, m), HEAL_BOUND_S)
                          for model, since in zip(models, down)]
                assert None not in healed, (
                    f"kill {kill + 1} ({'+'.join(models)}) not healed within {HEAL_BOUND_S}s:\n"
                    + _supervisor_log(container))
                healed_at = max(healed)
                failed = [why for model in models
                          for why in load.failures_between(killed_at, healed_at, model)]
                server_restarts = _metric(container, "triton_builder_server_restarts_total")
                crashed = server_restarts.get("", 0) > sum(r["server_restarted"] for r in runs)
                runs.append({"kill": kill + 1, "models": list(models),
                             "kill_to_correct_s": round(healed_at - killed_at, 3),
                             "failed_requests": len(failed), "server_restarted": crashed,
                             "failures": sorted(set(why.split("\n")[0][:160] for why in failed))})
                print(f"kill {kill + 1:2d} {'+'.join(models):22s} correct again after "
                      f"{healed_at - killed_at:5.2f}s, {len(failed)} requests failed"
                      + (" (the server crashed and was started again)" if crashed else ""))
            time.sleep(2.0)
            restarts = _metric(container, "triton_builder_stub_restarts_total")
            health = container.exec_run(["python3", "/opt/triton-builder/health.py"])
            zombies = container.exec_run(
                ["sh", "-c", "grep -l '^State:.Z' /proc/[0-9]*/status | wc -l"])
            # the server itself aborting, as the backend does on a lock_exception: on demand
            servers = _metric(container, "triton_builder_server_restarts_total").get("", 0)
            crashed_at = time.monotonic()
            aborted = container.exec_run(["python3", "-c", ABORT_SERVER])
            assert len(aborted.output.split()) == 1, aborted.output

            def server_down() -> float | None:
                """A failed direct request, or the restart the supervisor counted. The pipeline
                client retries UNAVAILABLE, so a short outage may cost it no request at all."""
                failed = load.first_failure_after(crashed_at, "text_encoder")
                return failed if failed is not None else _risen(
                    container, "triton_builder_server_restarts_total", "", servers)

            down = _wait_for(server_down, 30)
            assert down, f"the server did not go down:\n{_supervisor_log(container)}"
            back = [_wait_for(lambda m=model: load.first_correct_after(down, m),
                              HEAL_BOUND_S) for model in ("pipeline", "text_encoder")]
            assert None not in back, f"not back after a server crash:\n{_supervisor_log(container)}"
            crash_to_correct = max(back) - crashed_at
            print(f"server aborted: both models correct again after {crash_to_correct:.2f}s")
        container.reload()
        assert container.status == "running", "the container exited"
        server_restarts = _metric(container, "triton_builder_server_restarts_total")
        health_after_crash = container.exec_run(["python3", "/opt/triton-builder/health.py"])
        log = container.logs().decode(errors="replace")
    crashes = [r for r in runs if r["server_restarted"]]
    after_crash = runs[runs.index(crashes[-1]) + 1:] if crashes else runs
    per_model = {model: sum(model in r["models"] for r in runs) for model in ("pipeline",
                                                                          "text_encoder")}
    by_crash = {model: sum(model in r["models"] for r in crashes) for model in per_model}
    times = [r["kill_to_correct_s"] for r in runs]
    # a down server refuses at once, so its clients fail by the ten thousand: counted apart
    failed = [r["failed_requests"] for r in runs if not r["server_restarted"]] or [0]
    summary = {
        "kills": len(runs), "load_threads": HEAL_LOAD_THREADS,
        "kill_to_correct_s": {"p50": round(statistics.median(times), 3), "max": max(times),
                              "min": min(times)},
        "failed_requests_per_kill": {"median": statistics.median(failed), "max": max(failed),
                                     "total": sum(failed), "kills_with_a_server_restart_apart":
                                     [r["failed_requests"] for r in crashes]},
        "requests": {model: len(answers) for model, answers in load.answers.items()},
        "restarts": restarts, "server_restarts": len(crashes),
        "server_abort_to_correct_s": round(crash_to_correct, 3), "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "healing.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{len(runs)} kills healed: kill to first correct answer p50 "
          f"{summary['kill_to_correct_s']['p50']:.2f}s (goal {HEAL_GOAL_P50_S:g}s), worst "
          f"{max(times):.2f}s; failed requests per kill median {statistics.median(failed)}, "
          f"max {max(failed)} (kills that crashed the server apart); {summary['requests']} "
          f"requests; {zombies.output.decode().strip()} zombie stubs left; the server crashed "
          f"and was started again {len(crashes)} times")
    assert log.count("triton-builder supervisor: started tritonserver (pid") == 1
    freed = log.count("nearly full of the dead stubs' regions")
    assert log.count("lock_exception") + freed >= len(crashes), \
        f"a server restart of another cause:\n{log}"
    assert all(per_model[m] - by_crash[m] <= restarts.get(m, 0) <= per_model[m]
               for m in per_model), f"a model was reloaded that did not die: {restarts}"
    assert health.exit_code == 0, health.output
    assert int(zombies.output) >= len(after_crash), "dead stubs stay zombies: the check skips them"
    assert server_restarts == {"": len(crashes) + 1}, server_restarts
    assert health_after_crash.exit_code == 0, health_after_crash.output


BLS_KILLS = 3


def test_a_healed_model_operator_serves_its_bls_caller_again(docker_client, cpu_base_image):
    """The example built with its model operator called over BLS (``in_process=False``, as on
    a GPU release): kill ``text_encoder``'s stub BLS_KILLS times under load; each time the
    supervisor reloads ``text_encoder`` and the pipeline model answers correctly again without
    being reloaded itself (Triton's BLS finds a model by name on every call).

    Whether a pipeline request fails at all depends on whether one of its BLS calls was in the
    batch the dead stub held: on an idle machine often none was (20,490 correct, 0 failed, in one
    run here), so the heal is timed from the kill to the first correct answer sent after the
    reload, and the failures are reported, not required. That the pipeline does call
    ``text_encoder`` is shown by the server's own statistics first: N sequential pipeline
    requests are N more requests of ``text_encoder``."""
    import tritonclient.grpc as grpcclient

    from builder import build_docker_image
    from builder.client.pipeline import Client
    from builder.verify.container import ServingContainer
    from pipelines.text_embedding import pipeline

    reference = "triton-builder-test/text-embedding-bls:1"
    build_docker_image(pipeline, reference, client=docker_client, in_process=False)
    with ServingContainer(docker_client, reference) as endpoint:
        container = docker_client.containers.get(endpoint.container_id)
        with grpcclient.InferenceServerClient(endpoint.grpc_url) as triton, \
                Client(f"grpc://{endpoint.grpc_url}/pipeline") as client:
            def encoder_requests() -> int:
                (stats,) = triton.get_inference_statistics("text_encoder").model_stats
                return stats.inference_stats.success.count + stats.inference_stats.fail.count
            before = encoder_requests()
            for text in ("one", "two", "three", "four", "five"):
                client(text)
            assert encoder_requests() - before == 5, "the pipeline model does not call over BLS"
        with _Load(endpoint.grpc_url) as load:
            assert _wait_for(lambda: load.first_correct_after(0.0, "pipeline"), 30)
            for kill in range(BLS_KILLS):
                time.sleep(1.0)
                reloads = _metric(container, "triton_builder_stub_restarts_total").get(
                    "text_encoder", 0)
                servers = _metric(container, "triton_builder_server_restarts_total").get("", 0)
                killed_at = time.monotonic()  # requests in flight fail at once, within the exec
                _kill(container, "text_encoder")

                def reloaded(reloads: float = reloads, servers: float = servers) -> float | None:
                    """The supervisor's reload of text_encoder or, where the kill made Triton
                    2.51 abort (upstream, about one kill in 40 under load), its server started
                    again: the main heal test counts the same."""
                    return _risen(container, "triton_builder_stub_restarts_total",
                                  "text_encoder", reloads) or _risen(
                        container, "triton_builder_server_restarts_total", "", servers)

                reloaded_at = _wait_for(reloaded, HEAL_BOUND_S)
                assert reloaded_at is not None, _supervisor_log(container)
                healed_at = _wait_for(lambda since=reloaded_at: load.first_correct_after(
                    since, "pipeline"), HEAL_BOUND_S)
                assert healed_at is not None, (
                    f"{load.since(killed_at, 'pipeline')}\n{_supervisor_log(container)}")
                failed = load.failures_between(killed_at, healed_at, "pipeline")
                print(f"BLS kill {kill + 1}: the pipeline model answers correctly again "
                      f"{healed_at - killed_at:.2f}s after text_encoder's stub was killed (at "
                      f"most: the reload is seen by polling the supervisor's metrics); "
                      f"{len(failed)} of its requests failed meanwhile")
        restarts = _metric(container, "triton_builder_stub_restarts_total")
        servers = _metric(container, "triton_builder_server_restarts_total").get("", 0)
    assert restarts.get("pipeline", 0) == 0, restarts  # the BLS caller is never reloaded
    assert restarts.get("text_encoder", 0) + servers == BLS_KILLS, (restarts, servers)


def _wait_for(probe, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(0.05)
    return None


@pytest.mark.light  # waits on the health check's schedule and the supervisor's backoff
def test_a_stub_that_cannot_heal_turns_the_container_unhealthy_then_exits(
        docker_client, text_embedding_image):
    """A replica that cannot heal (its model's code gone, so every reload fails): requests
    fail, Triton still says ready, the health check turns the container unhealthy within
    interval x retries (Docker's schedule: the bound is the acceptance criterion, the measured
    time is printed) while the supervisor retries with backoff; then it gives up and the
    container exits with 75, for a restart policy to start a fresh one. Default settings."""
    import urllib.request

    from builder.client.errors import RemoteModelError
    from builder.client.pipeline import Client
    from builder.verify.container import ServingContainer

    fast = _fast_healthcheck(docker_client, text_embedding_image)
    with ServingContainer(docker_client, text_embedding_image, healthcheck=fast) as endpoint:
        container = docker_client.containers.get(endpoint.container_id)
        deadline = time.monotonic() + 60
        while _health(container) != "healthy" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _health(container) == "healthy"
        with Client(f"grpc://{endpoint.grpc_url}/pipeline") as client:
            client("alive")
            assert container.exec_run(CANNOT_HEAL_PIPELINE, user="root").exit_code == 0, \
                "could not break the pipeline model's code"
            _kill(container, "pipeline")
            started = time.monotonic()
            with pytest.raises(RemoteModelError, match="is not healthy"):
                client("dead")
        with urllib.request.urlopen(f"http://{endpoint.http_url}/v2/health/ready") as response:
            assert response.status == 200, "Triton itself notices nothing: why the check exists"
        bound = HEALTH_INTERVAL_S * HEALTH_RETRIES + 5
        while _health(container) != "unhealthy" and time.monotonic() - started < 4 * bound:
            time.sleep(0.2)
        unhealthy = time.monotonic() - started
        assert _health(container) == "unhealthy"
        check = container.attrs["State"]["Health"]["Log"][-1]["Output"]
        status = container.wait(timeout=120)["StatusCode"]
        exited = time.monotonic() - started
        log = container.logs().decode(errors="replace")
    print(f"cannot heal: unhealthy {unhealthy:.1f}s after the kill (interval "
          f"{HEALTH_INTERVAL_S}s x {HEALTH_RETRIES} retries), exited {status} after "
          f"{exited:.1f}s")
    assert unhealthy <= bound
    assert "python backend stub process(es) died" in check
    assert status == 75, log[-3000:]
    assert "reload failed (repository/models/pipeline/load answered 400" in log
    assert "giving up: model 'pipeline' failed more than 5 times within 60s" in log


def _answers(client) -> bool | None:
    try:
        client("alive")
    except Exception:  # noqa: BLE001 - not healed yet
        return None
    return True


# -- bad requests among good ones ---------------------------------------------------------------
def _bad_requests(module) -> dict[str, tuple[str, list, str, str]]:
    """name → (model, inputs, gRPC status, HTTP status) for the text-embedding pipeline
    (input ``text``: BYTES ``[batch, 1]``, max_batch_size 64)."""
    import numpy as np

    def tensor(name, array, datatype):
        made = module.InferInput(name, list(array.shape), datatype)
        made.set_data_from_numpy(array)
        return made

    def text(*values):
        return np.array([[v] for v in values], dtype=object)

    bad = ("StatusCode.INVALID_ARGUMENT", "400")
    return {
        "wrong dtype": ("pipeline", [tensor("text", np.ones((1, 1), np.float32), "FP32")], *bad),
        "wrong shape": ("pipeline", [tensor("text", np.array([[b"a", b"b"]], dtype=object),
                                            "BYTES")], *bad),
        "missing input": ("pipeline", [], *bad),
        "unknown input": ("pipeline", [tensor("text", text(b"a"), "BYTES"),
                                       tensor("bogus", text(b"a"), "BYTES")], *bad),
        "unknown model": ("no-such-model", [tensor("text", text(b"a"), "BYTES")],
                          "StatusCode.NOT_FOUND", "404"),
        "invalid UTF-8": ("pipeline", [tensor("text", text(b"caf\xe9"), "BYTES")], *bad),
        "oversized batch": ("pipeline", [tensor("text", text(*[b"a"] * 65), "BYTES")], *bad),
        "over the size limit": ("pipeline", [tensor("text", text(b"w" * (17 * 2**20)),
                                                    "BYTES")], *bad),  # 16 MiB by default
    }


class GoodTraffic(ClientThreads):
    """Good requests from ``threads`` threads until stopped; every answer checked."""

    def __init__(self, url: str, texts: list[str], threads: int = 4) -> None:

        from pipelines.text_embedding import pipeline

        self.url, self.texts = url, texts
        self.expected = {text: pipeline(text) for text in texts}
        self.answers = 0
        self.failures: list[str] = []
        super().__init__((self._run, ()) for _ in range(threads))

    def _run(self) -> None:
        from builder.client.pipeline import Client
        from builder.verify.equality import check_same

        with Client(self.url) as client:
            while not self.stop.is_set():
                for text in self.texts:
                    try:
                        check_same(client(text), self.expected[text], where=text)
                        self.answers += 1
                    except Exception as error:  # noqa: BLE001 - counted, then asserted
                        self.failures.append(f"{type(error).__name__}: {error}")


@pytest.mark.alongside  # statuses and answers, nothing timed
@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_each_bad_request_gets_its_status_while_good_ones_succeed(docker_client,
                                                                  text_embedding_image, scheme):
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from builder.verify.container import ServingContainer
    from builder.verify.equality import check_same
    from pipelines.text_embedding import pipeline
    from tests.support.example_inputs import TEXTS

    module = grpcclient if scheme == "grpc" else httpclient
    with ServingContainer(docker_client, text_embedding_image) as endpoint:
        address = endpoint.grpc_url if scheme == "grpc" else endpoint.http_url
        with GoodTraffic(f"{scheme}://{address}/pipeline", list(TEXTS[:8])) as good, \
                module.InferenceServerClient(address) as client:
            for name, (model, inputs, grpc_status, http_status) in _bad_requests(module).items():
                with pytest.raises(Exception) as refused:
                    client.infer(model, inputs)
                expected = grpc_status if scheme == "grpc" else http_status
                assert refused.value.status() == expected, f"{name}: {refused.value}"
            if scheme == "http":  # Triton's own frontend: 500 (README, "Errors")
                _assert_body_that_is_not_json_is_answered_500(address)
            limit = 16 * 2**20 - 4  # the default limit, less the element's length prefix
            huge = ("word " * (limit // 5)).ljust(limit, "w")  # at the limit on Docker's
            # default /dev/shm: valid, answered as in process
            tensor = module.InferInput("text", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[huge.encode()]], dtype=object))
            answer = client.infer("pipeline", [tensor]).as_numpy("vec")[0]
            check_same(answer, pipeline(huge), where="16 MiB text")
            deadline = time.monotonic() + 30
            while good.answers < 50 and time.monotonic() < deadline:
                time.sleep(0.1)
    assert not good.failures, good.failures[:5]
    assert good.answers >= 50
    print(f"{scheme}: {good.answers} good answers alongside the bad requests, none failed")


def _assert_body_that_is_not_json_is_answered_500(address: str) -> None:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://{address}/v2/models/pipeline/infer",
                                     data=b'{"inputs": [', method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(request, timeout=30)
    assert answered.value.code == 500, "a release that answers 400: update README 'Errors'"
    assert "failed to parse the request JSON buffer" in answered.value.read().decode()


# -- load ---------------------------------------------------------------------------------------
LOAD_REQUESTS = int(os.environ.get("TRITON_BUILDER_LOAD_REQUESTS", 10_000))
LOAD_CONCURRENCY = 32


@pytest.mark.alongside  # every answer checked, nothing timed
def test_load_every_answer_equals_the_in_process_one(docker_client, text_embedding_image):
    import asyncio

    from builder.client.aio import AsyncClient
    from builder.verify.container import ServingContainer
    from builder.verify.equality import check_same
    from pipelines.text_embedding import pipeline
    from tests.support.example_inputs import TEXTS

    texts = [TEXTS[i % len(TEXTS)] + f" #{i % 97}" for i in range(LOAD_REQUESTS)]
    expected = {text: pipeline(text) for text in set(texts)}

    async def load(url: str) -> list:
        async with AsyncClient(url, max_in_flight=LOAD_CONCURRENCY) as client:
            return await client.batch(texts, return_exceptions=True)

    with ServingContainer(docker_client, text_embedding_image) as endpoint:
        started = time.monotonic()
        answers = asyncio.run(load(f"grpc://{endpoint.grpc_url}/pipeline"))
        seconds = time.monotonic() - started
    errors = [a for a in answers if isinstance(a, BaseException)]
    assert not errors, f"{len(errors)} of {LOAD_REQUESTS} failed, e.g. {errors[0]!r}"
    for text, answer in zip(texts, answers):
        check_same(answer, expected[text], where=text)
    print(f"{LOAD_REQUESTS} requests at concurrency {LOAD_CONCURRENCY}: 0 errors, all equal "
          f"in-process ({seconds:.1f}s)")


# -- a registry that goes away during a push ---------------------------------------------------
@pytest.mark.alongside  # its own registry, its own tag, nothing timed: it waits on the engine
def test_registry_down_during_push_fails_and_leaves_no_tag(docker_client,
                                                           text_embedding_image, tmp_path):
    import threading
    import urllib.error
    import urllib.request

    from builder.push import push_image
    from builder.push.docker_push import PushError
    from tests.support.testbed import LocalRegistry

    registry = LocalRegistry(tmp_path).start()
    reference = f"{registry.host}/tb-i14/interrupted-push:1"
    docker_client.images.get(text_embedding_image).tag(reference.rsplit(":", 1)[0], "1")
    uploads = tmp_path / "data/docker/registry/v2/repositories/tb-i14/interrupted-push/_uploads"
    stopped = threading.Event()

    def stop_once_layers_upload() -> None:
        deadline = time.monotonic() + 120
        while not (uploads.exists() and any(uploads.iterdir())):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        registry.stop()
        stopped.set()

    watcher = threading.Thread(target=stop_once_layers_upload, daemon=True)
    watcher.start()
    try:
        with pytest.raises(PushError) as failure:
            push_image(docker_client, reference, retries=1, backoff=0.1)
    finally:
        watcher.join(130)
        registry.stop()
        docker_client.images.remove(reference)
    assert stopped.is_set(), "the registry was not stopped during a layer upload"
    assert registry.host in str(failure.value) or "refused" in str(failure.value)
    assert failure.value.attempts == 2 and failure.value.transient
    with LocalRegistry(tmp_path) as again:  # the same storage: no tag was written
        url = f"http://{again.host}/v2/tb-i14/interrupted-push/manifests/1"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"))
        assert missing.value.code == 404


@pytest.mark.alongside  # a layer of its own, checked by its ID
def test_a_build_interrupted_mid_step_removes_the_layers_it_made(docker_client, os_image,
                                                                tmp_path):
    """Ctrl-C while ``docker build`` runs a step: the layers committed before it go too."""
    import docker.errors

    from builder.engine.image_build import build_image

    (tmp_path / "payload").write_text(uuid.uuid4().hex)  # a layer no cache holds
    (tmp_path / "Dockerfile").write_text(
        f"FROM {os_image}\nCOPY payload /payload\nRUN sleep 60\n")
    layers: list[str] = []

    def interrupt_at_the_slow_step(line: str) -> None:
        if line.startswith(" ---> ") and "Running in" not in line:
            layers.append(line.split()[-1])
        if line.startswith("Step 3/3"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_image(docker_client, tmp_path, ["triton-builder-test/tb-i14-interrupted:1"],
                    on_log=interrupt_at_the_slow_step)
    base, copied = layers  # FROM's image, then the COPY layer this build committed
    assert docker_client.images.get(base)  # not ours to remove
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(copied)
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get("triton-builder-test/tb-i14-interrupted:1")
