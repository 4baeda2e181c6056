"""``triton-builder deploy swarm`` on a real swarm (this engine, ``docker swarm init``): three
replicas under load, a replica whose stub dies and cannot heal (the image's supervisor heals a
stub that merely died, see tests/e2e/test_reliability.py) is replaced while the load goes on, a
rolling update to a new image version under load.

This kernel has no IPVS, so the routing mesh refuses connections here: the stacks publish in
host mode (a random host port per replica) and :class:`SpreadLoad` plays the load balancer —
it sends to the replicas Swarm reports healthy, and, as an L7 balancer with passive health
checks does (Envoy's outlier detection, nginx's ``proxy_next_upstream``), takes a replica out
of rotation at its first failed answer and sends that request once more to another replica.
It counts the failed first attempts (with where and why) and the requests that failed for good.
The swarm is initialised here and left when the module ends (if it was not active before).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid

import pytest

from builder.deploy.serving import deployable_image
from builder.deploy.swarm import SwarmOptions, deploy_swarm, remove_stack, replicas
from tests.e2e.test_reliability import KILL_PIPELINE_STUB
from tests.support.client_threads import ClientThreads

pytestmark = pytest.mark.slow
REPLICAS = 3
CONCURRENCY = 8
TEST_OPTIONS = dict(replicas=REPLICAS, publish="host", ports=(None, None, None),
                    health_interval_s=2, health_retries=3, start_period_s=90, update_delay_s=1)
"""Health checked every 2 s, and 1 s between one replica's update and the next: the load on the
stack sees every replica replaced all the same, in less of the time nothing else may run."""


@pytest.fixture(scope="module")
def swarm(docker_client):
    state = (docker_client.info().get("Swarm") or {}).get("LocalNodeState")
    if state != "active":
        docker_client.swarm.init(advertise_addr="127.0.0.1")
    yield docker_client
    if state != "active":
        docker_client.swarm.leave(force=True)


@pytest.fixture(scope="module")
def stack(swarm, text_embedding_image):
    """One stack for the module's tests, in the order they are written: each leaves it with
    three healthy replicas (the replaced one's successor among them), and the rolling update,
    last, ends it. Deploying it once spares two waits for three servers to start (about half a
    minute of a part of the run where nothing else may run)."""
    name = f"tb-i14-{uuid.uuid4().hex[:6]}"
    image = deployable_image(text_embedding_image, client=swarm)
    deploy_swarm(image, name, SwarmOptions(**TEST_OPTIONS), client=swarm, wait=300)
    yield name
    _remove(swarm, name)


def _remove(client, name: str) -> None:
    label = {"label": f"com.docker.stack.namespace={name}"}
    if client.services.list(filters=label):
        remove_stack(name)
    deadline = time.monotonic() + 120
    while (replicas(client, name) or client.networks.list(filters=label)) and (
            time.monotonic() < deadline):
        time.sleep(0.5)
    # nothing of the stack is left: this node drops its network once the tasks have stopped
    assert not client.networks.list(filters=label)


class SpreadLoad(ClientThreads):
    """Good requests over gRPC to the healthy replicas of a stack, from CONCURRENCY threads.

    ``retry`` says which failed first attempts are sent again to another replica: any
    (``"any"``, a balancer with passive health checks), or only those the server refused as
    ``UNAVAILABLE`` (``"unavailable"``, what gRPC retry policies, Envoy and our own client
    retry); any other failure is final."""

    def __init__(self, client, stack: str, retry: str = "any") -> None:
        from pipelines.text_embedding import pipeline
        from tests.support.example_inputs import TEXTS

        self.client, self.stack, self.retry = client, stack, retry
        self.texts = list(TEXTS)
        self.expected = {text: pipeline(text) for text in self.texts}
        self.backends: list[tuple[str, int]] = []
        self.ejected: set[str] = set()
        self.turn = itertools.count()
        self.answers: dict[str, int] = {}
        self.first_failures: list[tuple[str, str]] = []
        self.final_failures: list[str] = []
        self.mismatches: list[str] = []
        super().__init__([(self._refresh, ())] + [(self._work, ())] * CONCURRENCY)

    def _refresh(self) -> None:
        while not self.stop.is_set():
            healthy = [(r.container_id, r.ports[8001]) for r in replicas(self.client, self.stack)
                       if r.health == "healthy" and 8001 in r.ports]
            with self.lock:
                self.backends = [b for b in healthy if b[0] not in self.ejected]
            time.sleep(0.3)

    def _pick(self, avoid: str | None = None) -> tuple[str, int] | None:
        with self.lock:
            choices = [b for b in self.backends if b[0] not in self.ejected and b[0] != avoid]
        return choices[next(self.turn) % len(choices)] if choices else None

    def _work(self) -> None:
        from builder.client.errors import ServerUnavailableError
        from builder.client.pipeline import Client
        from builder.verify.equality import check_same

        clients: dict[int, Client] = {}
        for text in itertools.cycle(self.texts):
            if self.stop.is_set():
                break
            backend, avoid = self._pick(), None
            for attempt in (1, 2):
                if backend is None:
                    time.sleep(0.05)
                    backend = self._pick(avoid)
                    if backend is None:
                        continue
                container, port = backend
                try:
                    if port not in clients:
                        clients[port] = Client(f"grpc://127.0.0.1:{port}/pipeline", retries=0)
                    answer = clients[port](text)
                except Exception as error:  # noqa: BLE001 - counted, then asserted on
                    with self.lock:
                        self.ejected.add(container)
                        self.first_failures.append((container, f"{type(error).__name__}: "
                                                               f"{error}"[:200]))
                    if attempt == 2 or (self.retry == "unavailable" and
                                        not isinstance(error, ServerUnavailableError)):
                        with self.lock:
                            self.final_failures.append(f"{error}"[:200])
                        break
                    avoid, backend = container, self._pick(container)
                    continue
                try:
                    check_same(answer, self.expected[text], where=text)
                except AssertionError as error:
                    self.mismatches.append(str(error)[:200])
                with self.lock:
                    self.answers[container] = self.answers.get(container, 0) + 1
                break
        for client in clients.values():
            client.close()

    @property
    def total(self) -> int:
        return sum(self.answers.values())

    def wait_for(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.total < count and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.total >= count, f"only {self.total} answers in {timeout}s"

    def __enter__(self) -> SpreadLoad:
        super().__enter__()
        deadline = time.monotonic() + 30
        while not self.backends and time.monotonic() < deadline:
            time.sleep(0.1)
        return self

    def report(self) -> str:
        return (f"{self.total} answers ({', '.join(str(n) for n in self.answers.values())} per "
                f"replica), {len(self.first_failures)} failed first attempts, "
                f"{len(self.final_failures)} failed requests, {len(self.mismatches)} mismatches")


class StubKiller(threading.Thread):
    """Kills a container's pipeline stub every half second until the container is gone."""

    def __init__(self, container) -> None:
        super().__init__(daemon=True)
        self.container, self.kills, self.stop = container, 0, threading.Event()

    def run(self) -> None:
        import docker.errors

        while not self.stop.is_set():
            try:
                killed = self.container.exec_run(["python3", "-c", KILL_PIPELINE_STUB])
            except docker.errors.APIError:  # stopped, or removed: the supervisor gave up
                return
            self.kills += len(killed.output.split())
            self.stop.wait(0.5)


def test_three_replicas_answer_like_in_process_under_load(swarm, stack):
    running = replicas(swarm, stack)
    assert len(running) == REPLICAS and {r.health for r in running} == {"healthy"}
    with SpreadLoad(swarm, stack) as load:
        load.wait_for(600)
    print(load.report())
    assert not load.mismatches and not load.first_failures and not load.final_failures
    assert len(load.answers) == REPLICAS and min(load.answers.values()) > 0


def test_a_replica_whose_stub_dies_is_replaced_while_the_load_goes_on(swarm, stack):
    """The victim's pipeline stub is killed again and again (its root file system is read-only,
    so its code cannot be broken instead), faster than the supervisor's policy allows: the
    health check turns it unhealthy, the supervisor gives up and exits, and Swarm replaces it."""
    victim = replicas(swarm, stack)[0].container_id
    with SpreadLoad(swarm, stack) as load:
        load.wait_for(200)
        killed_at = time.monotonic()
        killer = StubKiller(swarm.containers.get(victim))
        killer.start()
        unhealthy_at = replaced_at = None
        deadline = killed_at + 180
        while replaced_at is None and time.monotonic() < deadline:
            current = {r.container_id: r.health for r in replicas(swarm, stack)}
            if unhealthy_at is None and current.get(victim, "gone") != "healthy":
                unhealthy_at = time.monotonic()
            fresh = [c for c, health in current.items() if c != victim and health == "healthy"]
            if victim not in current and len(fresh) == REPLICAS:
                replaced_at = time.monotonic()
            time.sleep(0.2)
        killer.stop.set()
        assert killer.kills > 1, "no stub was killed"
        assert replaced_at is not None, "Swarm did not replace the replica with the dead stub"
        before = load.total
        load.wait_for(before + 200)
    print(f"stub killed: unhealthy after {unhealthy_at - killed_at:.1f}s, replaced after "
          f"{replaced_at - killed_at:.1f}s; {load.report()}")
    where = {container for container, _ in load.first_failures}
    assert where <= {victim}, f"failures on healthy replicas: {load.first_failures}"
    assert all("is not healthy" in why for _, why in load.first_failures), load.first_failures
    assert len(load.first_failures) <= CONCURRENCY, "more failures than requests in flight"
    assert not load.final_failures and not load.mismatches
    survivors_and_replacement = set(load.answers) - {victim}
    assert len(survivors_and_replacement) == REPLICAS, "the replacement served no request"


def test_a_rolling_update_to_a_new_version_completes_under_load(swarm, stack,
                                                              text_embedding_image, tmp_path):
    """Version 2 is the same server with another label: a new image ID, so a new task spec."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {text_embedding_image}\nLABEL org.opencontainers.image.version=2\n")
    version2 = f"{text_embedding_image.rsplit(':', 1)[0]}:2"
    swarm.images.build(path=str(tmp_path), tag=version2, rm=True)
    old = {r.container_id for r in replicas(swarm, stack)}
    try:
        with SpreadLoad(swarm, stack, retry="unavailable") as load:
            load.wait_for(100)
            started = time.monotonic()
            deploy_swarm(deployable_image(version2, client=swarm), stack,
                         SwarmOptions(**TEST_OPTIONS), client=swarm, wait=600)
            seconds = time.monotonic() - started
            load.wait_for(load.total + 100)
        running = replicas(swarm, stack)
        print(f"rolling update in {seconds:.1f}s; {load.report()}")
        assert {r.image for r in running} == {version2} and len(running) == REPLICAS
        assert not old & {r.container_id for r in running}
        assert not load.final_failures and not load.mismatches
        # A stopping replica drains: what it refuses, it refuses as UNAVAILABLE (never NOT_FOUND)
        assert all(why.startswith("ServerUnavailableError") for _, why in load.first_failures), (
            load.first_failures)
    finally:
        _remove(swarm, stack)
        swarm.images.remove(version2, force=True)
