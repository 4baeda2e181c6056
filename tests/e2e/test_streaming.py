"""Streaming pipelines served (issue 41): the text recognizer's characters as they are decoded.

The image of ``pipelines.text_recognizer.streaming_pipeline`` is built (its verification reads
every example's stream over gRPC and HTTP, then several in flight) and served: 16 concurrent
streams over gRPC and over HTTP (Triton's generate_stream, server-sent events), blocking and
asyncio, each equal to ``pipe.stream`` in process; the CLI prints each item as it comes; a
stopped container and a killed pipeline stub cut no stream silently. Errors
mid-stream and cancellation run on a host
tritonserver with a loop slow enough (0.2 s a step) that a cancel cannot arrive after the end:
the steps a stream made are counted server-side (the per-operator metrics of the map after the
streaming operator: one row per item made).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from builder import InputError, build_docker_image, build_pipeline_model, pipe
from builder.client import (
    AsyncClient,
    Client,
    RemoteInputError,
    RemoteModelError,
    ServerUnavailableError,
)
from builder.tritonserver.host_process import TritonServer
from builder.verify.container import ServingContainer
from pipelines.text_recognizer import streaming_pipeline
from tests.support.client_threads import ClientThreads
from tests.support.engine_images import remove_images_made
from tests.support.example_inputs import text_lines
from tests.unit.cli.test_commands import cli

pytestmark = pytest.mark.slow

REFERENCE = "triton-builder-test/text-stream:1"
STEP_S = 0.2
STEPS = 12


@pytest.fixture(scope="module")
def image(docker_client, cpu_base_image):
    before = {each["Id"] for each in docker_client.api.images(all=True)}
    lines = text_lines()
    build_docker_image(streaming_pipeline, REFERENCE, client=docker_client,
                       verify_calls=[(line,) for line in lines[:4]])
    yield REFERENCE
    remove_images_made(docker_client, before, [REFERENCE])


@pytest.fixture(scope="module")
def endpoint(docker_client, image):
    with ServingContainer(docker_client, image) as served:
        yield served


def test_the_served_config_is_decoupled_and_its_signature_says_what_streams(endpoint):
    with urllib.request.urlopen(f"http://{endpoint.http_url}/v2/models/pipeline/config") as r:
        config = json.load(r)
    assert config["model_transaction_policy"]["decoupled"] is True
    document = json.loads(config["parameters"]["pipeline_signature"]["string_value"])
    assert document["streamed"] == ["char"]


def _url(server, protocol: str, model: str = "pipeline") -> str:
    address = server.grpc_url if protocol == "grpc" else server.http_url
    return f"{protocol}://{address}/{model}"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sixteen_concurrent_streams_each_equal_the_in_process_stream(endpoint, protocol):
    lines = text_lines()[:16]
    expected = [list(streaming_pipeline.stream(line)) for line in lines]
    assert len({len(e) for e in expected}) > 2  # sequences of different lengths share steps
    got: list = [None] * len(lines)
    arrivals: list = [None] * len(lines)
    ready = threading.Barrier(len(lines))

    def read(index: int) -> None:
        with Client(_url(endpoint, protocol)) as client:
            client.codec  # noqa: B018 - the signature read before the clock: all start together
            ready.wait(60)
            items, times = [], []
            for item in client.stream(lines[index]):
                items.append(item)
                times.append(time.monotonic())
            got[index], arrivals[index] = items, times

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(lines))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert got == expected
    assert all(times == sorted(times) for times in arrivals if times)
    with Client(_url(endpoint, protocol)) as client:
        # answered whole: each call's items, joined (whole="join"), as the pipeline answers
        assert client(lines[0]) == streaming_pipeline(lines[0]) == "".join(expected[0])
        assert client.batch(lines[:6]) == ["".join(items) for items in expected[:6]]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_asyncio_client_streams_the_same_items(endpoint, protocol):
    lines = text_lines()[:8]

    async def read_all() -> list:
        async with AsyncClient(_url(endpoint, protocol)) as client:
            async def one(line):
                return [item async for item in client.stream(line)]

            streamed = await asyncio.gather(*(one(line) for line in lines))
            whole = await client(lines[0])
            return [*streamed, whole]

    *streamed, whole = asyncio.run(read_all())
    assert streamed == [list(streaming_pipeline.stream(line)) for line in lines]
    assert whole == streaming_pipeline(lines[0])


def test_a_generic_http_client_reads_one_event_per_item(endpoint):
    """What curl sees: each item a server-sent event of its own, the input sent flattened."""
    line = text_lines()[2]
    request = urllib.request.Request(
        f"http://{endpoint.http_url}/v2/models/pipeline/generate_stream",
        data=json.dumps({"image": line.reshape(-1).tolist()}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [json.loads(raw[len(b"data: "):]) for raw in response
                  if raw.startswith(b"data: ")]
    assert [event["char"] for event in events] == list(streaming_pipeline.stream(line))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_infer_stream_prints_each_item_as_one_json_line(endpoint, protocol):
    line = text_lines()[1]
    program = Path(sys.executable).parent / "triton-builder"
    done = subprocess.run(
        [str(program), "infer", _url(endpoint, protocol), "--stream",
         "-i", f"image={json.dumps(line.tolist())}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(out) for out in done.stdout.splitlines()] == list(
        streaming_pipeline.stream(line))


class LoopingStreams(ClientThreads):
    """Clients streaming the text lines back to back, from a thread each, until closed: each
    stream's outcome recorded with its time, ``ok`` where its items equal ``pipe.stream``'s,
    else what ``judge(items, error)`` calls it (``error`` None: the stream ended without one)."""

    def __init__(self, url: str, clients: int, timeout: float, judge) -> None:
        self.lines = text_lines()
        self.expected = [list(streaming_pipeline.stream(line)) for line in self.lines]
        self.outcomes: list[tuple[float, str, str]] = []
        self._url, self._timeout, self._judge = url, timeout, judge
        super().__init__((self._loop, (i,)) for i in range(clients))

    def ok_since(self, moment: float) -> int:
        with self.lock:
            return sum(kind == "ok" for at, kind, _ in self.outcomes if at > moment)

    def kinds(self) -> dict[str, int]:
        with self.lock:
            kinds = [kind for _, kind, _ in self.outcomes]
        return {kind: kinds.count(kind) for kind in sorted(set(kinds))}

    def _loop(self, offset: int) -> None:
        with Client(self._url, retries=0, timeout=self._timeout) as client:
            for index in itertools.cycle(range(offset, offset + len(self.lines))):
                if self.stop.is_set():
                    return
                index %= len(self.lines)
                items: list = []
                try:
                    items.extend(client.stream(self.lines[index]))
                    kind, detail = ("ok", "") if items == self.expected[index] else self._judge(
                        items, None)
                except Exception as error:  # noqa: BLE001 - judged, then asserted on
                    kind, detail = self._judge(items, error)
                    time.sleep(0.02)
                with self.lock:
                    self.outcomes.append((time.monotonic(), kind, detail[:200]))


def test_a_container_stopped_during_16_streams_cuts_none(docker_client, image):
    """``docker stop`` while 16 clients stream back to back: each stream either completes,
    equal to ``pipe.stream``, or is refused ``UNAVAILABLE`` before its first item."""
    def judge(items: list, error: Exception | None) -> tuple[str, str]:
        if error is None:
            return "mismatch", f"{items}"
        what = f"{type(error).__name__}: {error}"
        if items:
            return "cut", what
        return ("unavailable" if isinstance(error, ServerUnavailableError) else "error"), what

    container = ServingContainer(docker_client, image,
                                 environment={"TRITON_BUILDER_DRAIN_S": "2"})
    try:
        endpoint = container.start()
        with LoopingStreams(f"grpc://{endpoint.grpc_url}/pipeline", 16, 30, judge) as load:
            deadline = time.monotonic() + 60
            while load.ok_since(0.0) < 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            container.container.stop(timeout=15)
            time.sleep(1.0)
        container.container.reload()
        state = container.container.attrs["State"]
    finally:
        container.remove()
    kinds = load.kinds()
    bad = [(kind, why) for _, kind, why in load.outcomes if kind not in ("ok", "unavailable")]
    print(f"streams during the stop: {kinds}")
    assert kinds.get("ok", 0) >= 200, kinds
    assert not bad, f"{kinds}: {bad[:5]}"
    assert state["ExitCode"] == 0, state


def test_the_deployment_manifests_of_a_streaming_image_validate_without_sticky_sessions(
        image, tmp_path):
    """A stream is one request on one connection: the Service and the stack balance streams
    as any request, with no session affinity, over the gRPC and HTTP ports."""
    import yaml

    manifest = tmp_path / "triton.yaml"
    cli("deploy", "k8s", image, "-o", str(manifest))  # validated with kubernetes-validate
    documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    (service,) = [d for d in documents if d["kind"] == "Service"]
    assert service["spec"].get("sessionAffinity", "None") == "None"
    assert {"http", "grpc"} <= {port["name"] for port in service["spec"]["ports"]}
    stack = yaml.safe_load(cli("deploy", "swarm", image, "--dry-run").stdout)
    (service,) = stack["services"].values()
    assert {8000, 8001} <= {port["target"] for port in service["ports"]}


def test_a_killed_pipeline_stub_heals_in_place_and_no_stream_ends_silently(docker_client,
                                                                           image):
    """The pipeline model's stub killed twice while 8 clients stream back to back: every stream
    either completes, equal to ``pipe.stream``, or raises an error to its client — none ends
    early as if it were whole —, the supervisor heals it in place (the container keeps running,
    never restarted) and streams are correct again after each kill."""
    def judge(items: list, error: Exception | None) -> tuple[str, str]:
        if error is None:  # fewer items, or others, and no error: what must not happen
            return "silent", f"{items}"
        return "error", f"{type(error).__name__}: {error}"  # an error raised: what must

    serving = ServingContainer(docker_client, image)
    try:
        endpoint = serving.start()
        container = serving.container
        with LoopingStreams(f"grpc://{endpoint.grpc_url}/pipeline", 8, 20, judge) as load:
            for _ in range(2):
                started = time.monotonic()
                while load.ok_since(started) < 50 and time.monotonic() < started + 60:
                    time.sleep(0.1)
                killed_at = time.monotonic()
                _kill_pipeline_stub(container)
                while load.ok_since(killed_at + 0.5) < 50 and time.monotonic() < killed_at + 90:
                    time.sleep(0.2)
                assert load.ok_since(killed_at + 0.5) >= 50, _tail(container)
        container.reload()
        assert container.status == "running" and container.attrs["RestartCount"] == 0
    finally:
        serving.remove()
    errors = sorted({why[:80] for _, kind, why in load.outcomes if kind == "error"})
    print(f"streams around two kills of the pipeline stub: {load.kinds()}; errors: {errors[:4]}")
    assert not [why for _, kind, why in load.outcomes if kind == "silent"], load.kinds()


def _kill_pipeline_stub(container) -> None:
    from tests.e2e.test_reliability import KILL_PIPELINE_STUB

    killed = container.exec_run(["python3", "-c", KILL_PIPELINE_STUB]).output.split()
    assert len(killed) == 1, killed


def _tail(container) -> str:
    return "\n".join(container.logs().decode(errors="replace").splitlines()[-30:])


# -- cancellation, on a host server ---------------------------------------------------------
class SlowSteps:
    """``STEPS`` items per stream, one step of every running stream each ``STEP_S``."""

    def call_batch(self, rows):
        running = list(range(len(rows)))
        for step in range(STEPS):
            time.sleep(STEP_S)
            stopped = yield {i: float(rows[i][0]) * 100 + step for i in running}
            running = [i for i in running if i not in (stopped or ())]
            if not running:
                return


def as_item(value: float) -> float:
    return value


SLOW = (pipe.input("seed").stream("seed", "raw", SlowSteps(), name="slow_steps")
        .map("raw", "item", as_item, name="count_items").output("item")
        .with_example(1.0))


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("slow-stream") / "models"
    build_pipeline_model(SLOW, root, name="slow",
                         dynamic_batching={"max_queue_delay_microseconds": 100_000})
    with TritonServer(root) as server:
        yield server


def _items_made(server) -> float:
    """Items the served pipeline has made (rows of the map after the streaming operator),
    once the once-a-second metrics have settled."""
    previous = -1.0
    while True:
        time.sleep(1.5)
        address = f"http://127.0.0.1:{server.metrics_port}/metrics"
        with urllib.request.urlopen(address, timeout=10) as r:
            text = r.read().decode()
        value = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("triton_builder_operator_rows{")
                    and "count_items" in line)
        if value == previous:
            return value
        previous = value


@pytest.mark.light  # a host server stepping every 0.2 s
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_cancelled_stream_stops_within_one_step_and_frees_its_place(slow_server, protocol):
    """gRPC cancels the request; HTTP closes its connection, which Triton takes as a cancel."""
    url = _url(slow_server, protocol, "slow")
    before = _items_made(slow_server)
    finished: list = []

    def read_whole() -> None:
        with Client(url) as client:
            finished.append(list(client.stream(2.0)))

    other = threading.Thread(target=read_whole)
    with Client(url) as client:
        client.codec  # noqa: B018 - connected: both requests reach one dynamic batch
        other.start()
        stream = client.stream(1.0)
        assert next(stream) == 100.0
        stream.close()  # the client cancels after its first item
    other.join(60)
    assert finished == [[200.0 + step for step in range(STEPS)]]
    made = _items_made(slow_server) - before
    # the other stream's 12 items, the cancelled one's first and at most one step in flight
    assert STEPS + 1 <= made <= STEPS + 2, made
    # the same pair without the cancel: 24 items, so the cancel freed 10 or 11 steps
    with Client(url) as client:
        assert list(client.stream(1.0)) == [100.0 + step for step in range(STEPS)]


# -- streams that arrive apart share one loop, on a host server ----------------------------
class SharedSteps:
    """``STEPS`` items per stream, a step each ``STEP_S``; rows join between steps
    (``admits_rows``). How many streams each step advanced is written to ``log``, a line a step
    (the items themselves must not depend on the other rows: the build checks it)."""

    admits_rows = True

    def __init__(self, log: str) -> None:
        self.log = log

    def call_batch(self, rows):
        seeds = [float(row[0]) for row in rows]
        done = [0 for _ in rows]
        running = list(range(len(rows)))
        while running:
            time.sleep(STEP_S)
            with open(self.log, "a") as log:
                log.write(f"{len(running)}\n")
            control = yield {i: seeds[i] * 100 + done[i] for i in running}
            for i in running:
                done[i] += 1
            running = [i for i in running if done[i] < STEPS and i not in control]
            running += range(len(seeds), len(seeds) + len(control.added))
            seeds += [float(row[0]) for row in control.added]
            done += [0] * len(control.added)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("shared-stream")
    log = directory / "steps.log"
    shared = (pipe.input("seed").stream("seed", "item", SharedSteps(str(log)),
                                        name="shared_steps")
              .output("item").with_example(1.0))
    build_pipeline_model(shared, directory / "models", name="shared")
    with TritonServer(directory / "models") as server:
        yield server, shared, log


@pytest.mark.light  # a host server stepping on sleeps
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_stream_that_arrives_while_another_runs_shares_its_steps(shared_server, protocol):
    """The second stream starts after the first has made 3 items: a dynamic batch of its own,
    it joins the running loop between two steps, so the steps both run advance both (counted
    server-side), and each reads what it reads alone."""
    server, shared, log = shared_server
    url = _url(server, protocol, "shared")
    second: list = []
    third_item = threading.Event()

    def read_second() -> None:
        third_item.wait(30)
        with Client(url) as client:
            second.append(list(client.stream(2.0)))

    other = threading.Thread(target=read_second)
    other.start()
    log.write_text("")
    with Client(url) as client:
        first = []
        for item in client.stream(1.0):
            first.append(item)
            if len(first) == 3:
                third_item.set()
    other.join(60)
    steps = [int(line) for line in log.read_text().split()]
    assert first == list(shared.stream(1.0)) == [100.0 + step for step in range(STEPS)]
    assert second == [list(shared.stream(2.0))]
    assert max(steps) == 2 and steps.count(2) >= STEPS - 5, steps  # both streams in one step
    assert len(steps) == 2 * STEPS - steps.count(2), steps


# -- errors mid-stream, on a host server -----------------------------------------------------
def count_up(n: float):
    for i in range(int(n)):
        yield float(i)


def check_item(item: float, n: float) -> float:
    """Items from 2 on fail: as the client's mistake where ``n`` ≥ 100, else the server's."""
    if item >= 2 and n >= 100:
        raise InputError(f"item {item} is more than this caller may ask for")
    if item >= 2 and n >= 50:
        raise ValueError("the server broke")
    return item


FAILING = (pipe.input("n").stream("n", "raw", count_up, name="count_up")
           .map(("raw", "n"), "item", check_item, name="check_item").output("item")
           .with_example(3.0))


@pytest.fixture(scope="module")
def failing_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("failing-stream") / "models"
    build_pipeline_model(FAILING, root, name="failing")
    with TritonServer(root) as server:
        yield server


@pytest.mark.light  # a host server and a few short streams
@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize(("n", "error"), [(150.0, RemoteInputError), (60.0, RemoteModelError)])
def test_an_error_mid_stream_reaches_the_caller_after_the_items_before_it(
        failing_server, protocol, n, error):
    url = _url(failing_server, protocol, "failing")
    got = []
    with Client(url) as client, pytest.raises(error) as raised:
        for item in client.stream(n):
            got.append(item)
    assert got == [0.0, 1.0]
    assert "check_item" in str(raised.value)
    assert isinstance(raised.value, InputError) is (error is RemoteInputError)
    with Client(url) as client:
        assert list(client.stream(4.0)) == list(FAILING.stream(4.0)) == [0.0, 1.0, 2.0, 3.0]
