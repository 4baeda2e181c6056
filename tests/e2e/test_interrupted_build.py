"""An interrupted ``triton-builder image`` leaves nothing of its own behind (issue 35): no
verification container, no tag, no half-built image — whatever the instant of the interrupt,
SIGINT or SIGTERM, and however many interrupts follow while it cleans up.

The CLI runs as users run it, in a process of its own, with SIGINT at its default action (a test
run started in the background inherits SIGINT ignored, and the CLI would then never see it). The
image is the text-embedding example's under a name of its own: the session's
``text_embedding_image`` already made its payload and environment, so each build reaches
verification within seconds.

The sweep sends one signal per build, from the line "building <name>" (the serving image's
layers, its rewritten config) and then from "verifying <name>" (the container created and
started, Triton starting, the checks) until a build finishes before its signal comes; SIGINT and
SIGTERM take turns. The first 50 ms of each phase are swept 10 ms apart; after them, time is
cut into slots of :data:`SWEEP_STEP_S` (:data:`COARSE_STEP_S` past :data:`COARSE_AFTER_S`) and each
build's signal falls at a random instant of the next slot (a seed printed with the summary;
``TRITON_BUILDER_INTERRUPT_SEED`` replays it): as many builds as a grid of that step, and no
instant of a phase that no run can reach, as a grid's points between them are. After every
build: no container, image or layer of that name, no tag.

Everything checked is of the test's own names, so the module runs beside other ``alongside``
tests: a loaded machine moves the instants swept, and found a defect a quiet one hid (a layer
left by an interrupt as a ``COPY`` step ran, ``tests/unit/engine/test_interrupted_copy.py``).
The doctor's test, which removes the leftovers of every killed build on the engine, runs alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker.errors
import pytest

from builder.engine.image_build import remove_images
from builder.engine.image_listing import listed_images
from builder.image.labels import OCI, PAYLOAD_HASH
from builder.image.sbom import SBOM_PATH
from tests.support.paths import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.alongside]
PIPELINE = "pipelines/text_embedding.py:pipeline"
SWEEP_STEP_S = float(os.environ.get("TRITON_BUILDER_INTERRUPT_STEP_MS", "200")) / 1000
"""The slot of time each build's interrupt falls in, past the first 50 ms of a phase
(``TRITON_BUILDER_INTERRUPT_STEP_MS``). 200 ms since a fresh CI run on two cores spent 500 s
on 100 ms steps, the machine's load stretching verification over more of them."""
COARSE_AFTER_S = 2.0
"""Past the first 2 s of a phase, slots of :data:`COARSE_STEP_S`. Those 2 s hold every step
of the serving image's build (0.7 s here, quiet) and, in verification, the container made and
started and Triton beginning; what follows is Triton loading the models and the checks, the
container running throughout until it is removed and the image tagged. That part is most of
the sweep's builds (quiet here, verification swept over 3.4 s and building over 1.0 s; longer
loaded): the sweep took 432 s of a fresh run on 200 ms slots throughout, 339 and 414 s on
400 ms slots past 2 s (as the load stretched verification). The state these slots sample is
one throughout (the container running, Triton busy in it), and each run draws its instants
anew, so over runs every instant of it is reached."""
COARSE_STEP_S = 3 * SWEEP_STEP_S
FINE_STEP_S, FINE_SPAN_S = 0.01, 0.05
"""Over the first 50 ms of a phase, 10 ms apart: the verification container is created and
started within some 20 ms of "verifying" here, the window this issue was about."""
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
MAX_ATTEMPTS = 400


@contextlib.contextmanager
def _interruptible_children() -> Iterator[None]:
    """Children started here take SIGINT as Ctrl-C at a terminal delivers it.

    A job started in the background (``cmd &``, nohup, some CI runners) inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler: the CLI under test would
    never see the interrupt. A handler set here is reset to the default on exec, an ignored
    signal is not.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class _Build:
    """``triton-builder image`` running, its standard error read line by line, timed."""

    reference: str
    process: subprocess.Popen = field(init=False)
    lines: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        program = Path(sys.executable).parent / "triton-builder"
        with _interruptible_children():
            self.process = subprocess.Popen(
                [str(program), "image", PIPELINE, "-t", self.reference], cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def seen(self, prefix: str, before: float = float("inf")) -> float | None:
        return next((at for at, line in list(self.lines)
                     if line.startswith(prefix) and at < before), None)

    def wait_for(self, prefix: str, timeout: float = 600) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = self.seen(prefix)
            if at is not None:
                return at
            if self.process.poll() is not None:
                self._reader.join(5)
                at = self.seen(prefix)
                if at is not None:
                    return at
                break
            time.sleep(0.005)
        self.stop()
        raise AssertionError(f"no line {prefix!r} (exit {self.process.returncode}):\n"
                             f"{self.log()}")

    def log(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(5)


@dataclass
class _Attempt:
    marker: str
    offset: float
    signum: signal.Signals
    exit_code: int | None = None
    finished_first: bool = False
    """The build had ended before the signal was due: nothing was interrupted."""
    signals: int = 0
    sent: float = 0.0
    container: str = "none"
    """The state of the build's verification container as the signal went."""
    exit_s: float = 0.0
    last_line: str = ""
    """The last line the build printed before the signal."""
    committed: bool = False
    """The build had verified and tagged its image as the signal came: the signal may end the
    process (exiting, or killed by it as the interpreter shut down), the build stands."""
    left: list[str] = field(default_factory=list)

    def wrong(self) -> bool:
        if self.finished_first:
            return False
        if self.committed:
            return bool(self.left) or self.exit_code not in (0, EXIT_CODES[self.signum],
                                                             -self.signum)
        return bool(self.left) or self.exit_code != EXIT_CODES[self.signum] or self.exit_s > 30

    def describe(self) -> str:
        return (f"{self.signum.name} (x{self.signals}) {self.offset:.1f}s after "
                f"{self.marker!r}, container {self.container}, last line "
                f"{self.last_line[:70]!r}: exit {self.exit_code} "
                f"after {self.exit_s:.1f}s" + (f", left {', '.join(self.left)}" if self.left
                                               else ""))


def _interrupt(client, reference: str, marker: str, offset: float, signum: signal.Signals,
               repeat_every: float | None = None) -> tuple[_Attempt, _Build]:
    """Build ``reference``; ``offset`` seconds after the line starting with ``marker``, send
    ``signum`` (then SIGINT and SIGTERM in turn every ``repeat_every`` seconds until the CLI
    exits, if given)."""
    attempt = _Attempt(marker, offset, signum)
    title = reference.rsplit("/", 1)[-1].split(":")[0]
    build = _Build(reference)
    try:
        due = build.wait_for(marker) + offset
        while time.monotonic() < due and build.process.poll() is None:
            time.sleep(min(0.005, max(due - time.monotonic(), 0)))
        attempt.container = ",".join(c["State"] for c in _containers(client, title)) or "none"
        attempt.finished_first = build.process.poll() is not None
        sent = time.monotonic()
        if not attempt.finished_first:
            build.process.send_signal(signum)
            attempt.signals = 1
            attempt.last_line = next((line for at, line in reversed(list(build.lines))
                                      if at < sent), "")
            while repeat_every is not None and build.process.poll() is None \
                    and time.monotonic() < sent + 120:
                time.sleep(repeat_every)
                with contextlib.suppress(ProcessLookupError):
                    build.process.send_signal((signal.SIGINT, signal.SIGTERM)[attempt.signals % 2])
                    attempt.signals += 1
        try:
            attempt.exit_code = build.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            attempt.exit_code = None
        attempt.exit_s = time.monotonic() - sent
        attempt.sent = sent
    finally:
        build.stop()
    return attempt, build


def _containers(client, title: str) -> list[dict]:
    """The engine's summaries of the containers of ``title`` (read in one call: the SDK's list
    inspects each one after, and a container removed meanwhile fails it)."""
    return client.api.containers(all=True, filters={"label": f"{OCI}title={title}"})


def _containers_left(client, title: str) -> list[str]:
    return [f"container {c['Names'][0].lstrip('/')} ({c['State']})"
            for c in _containers(client, title)]


def _tagged(client, reference: str) -> bool:
    try:
        client.images.get(reference)
        return True
    except docker.errors.ImageNotFound:
        return False


def _offsets(instants: random.Random) -> Iterator[float]:
    """Seconds after a phase's line: 10 ms apart over its first 50 ms, then one random instant
    in each :data:`SWEEP_STEP_S` slot up to :data:`COARSE_AFTER_S`, and in each
    :data:`COARSE_STEP_S` slot after it."""
    yield from (step * FINE_STEP_S for step in range(round(FINE_SPAN_S / FINE_STEP_S)))
    slot = FINE_SPAN_S
    while True:
        step = SWEEP_STEP_S if slot < COARSE_AFTER_S else COARSE_STEP_S
        yield slot + instants.uniform(0, step)
        slot += step


def _left_behind(client, title: str, reference: str, layers: list[str]) -> list[str]:
    """What of the build named ``title`` is on the engine: containers, the tag, images with its
    title, and ``layers`` (:func:`_new_layers`)."""
    left = _containers_left(client, title)
    if _tagged(client, reference):
        left.append(f"the tag {reference}")
    titled = {image.id for image in
              listed_images(client, all=True, filters={"label": f"{OCI}title={title}"})}
    left += [f"image {image_id[7:19]} (titled {title})" for image_id in sorted(titled)]
    left += [f"layer {layer[7:19]} (holding its SBOM)" for layer in layers if layer not in titled]
    return left


def _new_layers(client, title: str, payload_hash: str,
                before: set[str] = frozenset()) -> list[str]:
    """Untagged images on the payload, not there ``before``, holding the SBOM of ``title``
    (without ``before``: also the layer cache a finished build of ``title`` leaves)."""
    return [image.id for image in _payload_layers(client, payload_hash)
            if image.id not in before and not image.tags
            and _holds_sbom_of(client, image.id, title)]


def _holds_sbom_of(client, image_id: str, title: str) -> bool:
    """Whether a layer holds the bill of materials of ``title``: a layer of that build, not of
    another build on the same payload (CI, another worktree) made meanwhile."""
    try:
        container = client.containers.create(image_id, command=["/never-started"])
    except docker.errors.APIError:
        return False
    try:
        chunks, _ = container.get_archive(SBOM_PATH)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
            member = archive.next()
            return member is not None and f'"{title}"'.encode() in \
                archive.extractfile(member).read()
    except docker.errors.NotFound:
        return False
    finally:
        container.remove(force=True)


def _payload_layers(client, payload_hash: str) -> list:
    return listed_images(client, all=True,
                         filters={"label": f"{PAYLOAD_HASH}={payload_hash}"})


def _clear(client, title: str, reference: str, layers: list[str] = ()) -> None:
    """Remove what a build of ``title`` left (this test's own names and ``layers`` only)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        containers = _containers(client, title)
        if not containers:
            break
        for container in containers:  # "removal already in progress": the engine's own, wait
            with contextlib.suppress(docker.errors.APIError):
                client.api.remove_container(container["Id"], force=True)
        time.sleep(0.2)
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(reference)
    titled = listed_images(client, all=True, filters={"label": f"{OCI}title={title}"})
    left = [image.id for image in titled] + list(layers)
    for _ in range(len(left)):  # a parent goes once its children have gone
        kept = remove_images(client, left)
        if not kept or kept == left:
            break
        left = kept


def test_an_interrupt_at_any_instant_leaves_nothing_behind(docker_client, text_embedding_image):
    """Once in every slot (:func:`_offsets`) from "building" to the end of verification,
    SIGINT and SIGTERM in turn: the CLI exits 130 / 143 within seconds and leaves no container,
    tag or image."""
    title = f"tb-i35-sweep-{uuid.uuid4().hex[:8]}"
    reference = f"triton-builder-test/{title}:1"
    payload_hash = docker_client.images.get(text_embedding_image).labels[PAYLOAD_HASH]
    phases = [f"building {reference}", f"verifying {reference}"]
    attempts: list[_Attempt] = []
    seed = int(os.environ.get("TRITON_BUILDER_INTERRUPT_SEED") or random.randrange(2**32))
    instants = random.Random(seed)
    started = time.monotonic()
    try:
        for phase, marker in enumerate(phases):
            last_phase = phase == len(phases) - 1
            for offset in _offsets(instants):
                if len(attempts) >= MAX_ATTEMPTS:
                    break
                before = {image.id for image in _payload_layers(docker_client, payload_hash)}
                signum = (signal.SIGINT, signal.SIGTERM)[len(attempts) % 2]
                attempt, build = _interrupt(docker_client, reference, marker, offset, signum)
                attempts.append(attempt)
                if attempt.finished_first:
                    assert last_phase and attempt.exit_code == 0, build.log()
                    break
                layers = []
                if last_phase and _tagged(docker_client, reference):
                    attempt.committed = True  # verified and tagged before the signal came
                    attempt.left = _containers_left(docker_client, title)
                else:
                    layers = _new_layers(docker_client, title, payload_hash, before)
                    attempt.left = _left_behind(docker_client, title, reference, layers)
                _clear(docker_client, title, reference, layers)
                if attempt.committed or (not last_phase and build.seen(
                        phases[phase + 1], before=attempt.sent) is not None):
                    break  # this phase is over: sweep the next one
    finally:
        _clear(docker_client, title, reference, _new_layers(docker_client, title, payload_hash))
    took = time.monotonic() - started
    interrupted = [a for a in attempts if not a.finished_first]
    kinds = ", ".join(f"{sum(a.signum == kind for a in interrupted)} {kind.name}"
                      for kind in EXIT_CODES)
    spans = " and ".join(
        f"{max(a.offset for a in attempts if a.marker == marker):.1f}s from {marker!r}"
        for marker in phases if any(a.marker == marker for a in attempts))
    states = {state: sum(a.container == state for a in interrupted)
              for state in sorted({a.container for a in interrupted})}
    summary = (f"{len(interrupted)} builds interrupted ({kinds}) in {took:.0f}s, one in each "
               f"{SWEEP_STEP_S * 1000:.0f} ms ({COARSE_STEP_S * 1000:.0f} ms past "
               f"{COARSE_AFTER_S:.0f}s) over {spans} (TRITON_BUILDER_INTERRUPT_SEED="
               f"{seed}); their verification container as the signal went: {states}")
    print(summary)
    assert attempts and attempts[-1].marker == phases[-1], "the sweep never reached verification"
    assert states.get("running"), f"no signal came while the container ran: {summary}"
    wrong = [a for a in attempts if a.wrong()]
    assert not wrong, summary + f"; {len(wrong)} left something or exited wrongly:\n" + \
        "\n".join(a.describe() for a in wrong)


def test_interrupts_during_cleanup_do_not_cut_it_short(docker_client, text_embedding_image):
    """After the first SIGINT, a signal every 30 ms (SIGTERM and SIGINT in turn) until the CLI
    exits, at three instants of verification (the container being made, Triton starting, the
    checks): the cleanup they land in still removes everything, and the CLI says 130."""
    title = f"tb-i35-again-{uuid.uuid4().hex[:8]}"
    reference = f"triton-builder-test/{title}:1"
    payload_hash = docker_client.images.get(text_embedding_image).labels[PAYLOAD_HASH]
    attempts = []
    try:
        for offset in (0.1, 0.8, 2.5):
            before = {image.id for image in _payload_layers(docker_client, payload_hash)}
            attempt, _ = _interrupt(docker_client, reference, f"verifying {reference}", offset,
                                    signal.SIGINT, repeat_every=0.03)
            layers = _new_layers(docker_client, title, payload_hash, before)
            attempt.left = _left_behind(docker_client, title, reference, layers)
            attempts.append(attempt)
            _clear(docker_client, title, reference, layers)
    finally:
        _clear(docker_client, title, reference, _new_layers(docker_client, title, payload_hash))
    print("\n".join(a.describe() for a in attempts))
    assert all(not a.finished_first and a.signals > 1 for a in attempts), \
        [a.describe() for a in attempts]
    assert not [a for a in attempts if a.wrong()], "\n".join(a.describe() for a in attempts)


def _doctor(*options: str) -> str:
    """What ``triton-builder doctor`` says (on standard error)."""
    program = Path(sys.executable).parent / "triton-builder"
    return subprocess.run([str(program), "doctor", *options], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120).stderr


def _running_container(client, title: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [c for c in _containers(client, title) if c["State"] == "running"]
        if running:
            return client.containers.get(running[0]["Id"])
        time.sleep(0.05)
    raise AssertionError(f"no running verification container of {title}")


@pytest.mark.alone
def test_doctor_removes_what_a_killed_build_left_and_spares_a_live_one(docker_client,
                                                                      text_embedding_image):
    """SIGKILL while the verification container runs: nothing can clean up, and the container
    stays with the untagged image it runs. ``triton-builder doctor`` names it as a leftover of a
    killed build, ``--remove-leftovers`` removes both; the container of a build running at the
    same moment is neither named nor removed, and that build goes on to tag its image."""
    from builder.doctor import leftovers_check
    from builder.engine.ownership import BUILD_LABEL

    killed_title = f"tb-i35-killed-{uuid.uuid4().hex[:8]}"
    killed_reference = f"triton-builder-test/{killed_title}:1"
    live_title = f"tb-i35-live-{uuid.uuid4().hex[:8]}"
    live_reference = f"triton-builder-test/{live_title}:1"
    killed, live = _Build(killed_reference), None
    try:
        killed.wait_for(f"verifying {killed_reference}")
        left = _running_container(docker_client, killed_title)
        killed.process.kill()
        killed.stop()
        left.reload()
        assert left.status == "running" and left.name == \
            f"triton-builder-verify-{left.labels[BUILD_LABEL]}"
        image = left.image.id
        assert not docker_client.images.get(image).tags

        listed = _doctor()
        line = next(line for line in listed.splitlines() if "leftovers:" in line)
        assert line.startswith("warn") and left.name in line and \
            f"pid {killed.process.pid}" in line, listed

        live = _Build(live_reference)
        live.wait_for(f"verifying {live_reference}")
        other = _running_container(docker_client, live_title)
        assert other.name not in leftovers_check(docker_client).detail
        removed = _doctor("--remove-leftovers")
        assert docker_client.containers.get(other.id).status == "running", \
            "the live build's container went while the doctor removed leftovers"
        line = next(line for line in removed.splitlines() if "leftovers:" in line)
        assert line.startswith("ok") and "removed" in line and left.name in line, removed
        assert other.name not in line
        assert not docker_client.containers.list(all=True, filters={"id": left.id})
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(image)
        assert live.process.wait(timeout=300) == 0, live.log()
        assert _tagged(docker_client, live_reference)
    finally:
        killed.stop()
        if live is not None:
            live.stop()
        payload_hash = docker_client.images.get(text_embedding_image).labels[PAYLOAD_HASH]
        for title, reference in ((killed_title, killed_reference), (live_title, live_reference)):
            _clear(docker_client, title, reference,
                   _new_layers(docker_client, title, payload_hash))
