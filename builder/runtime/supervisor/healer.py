"""The supervisor proper: watches one server's stubs and heals them, by reloading a model or by
starting the server again (see the package's docstring)."""

from __future__ import annotations

import signal
import threading
import time
from collections import deque
from pathlib import Path

from .admin_api import LoadTimeout, load_model, triton_readiness
from .log import log
from .metrics import metrics_text
from .policy import ModelRecord, RestartPolicy
from .reaper import forward_signal
from .watch import (
    SHARED_MEMORY,
    Death,
    StubWatch,
    remove_regions,
    shared_memory_short,
    write_healed,
)

try:  # builder.runtime.supervisor
    from .. import health
except ImportError:  # in the image: health.py beside the package
    import health  # type: ignore[no-redef]

GAVE_UP = 75
"""The exit status after giving up (EX_TEMPFAIL: a fresh container may well do better)."""
SCAN_INTERVAL_S = 0.25
"""How often ``/proc`` is read. At 0.1 s the supervisor took 0.7 % of a core in the example's
container (measured from ``/proc/1/stat`` over 30 s idle); a death is seen at most this late,
against 2–4 s for the reload itself."""
HEAL_STOP_GRACE_S = 5.0
"""How long a server stopped to heal a stub (the repository API closed) may take to exit before
SIGKILL: the requests in flight on its healthy models finish meanwhile."""
STOP_GRACE_S = 10.0
"""After giving up, how long the server may take to stop before SIGKILL (Triton waits up to its
``--exit-timeout-secs``, 30 s, for models that will not unload)."""


class Supervisor:
    """Watches one server's stubs and heals them; :meth:`run` is the watching thread.

    The one owner of the healing's state. Five threads touch it — the watching thread, a thread
    per reload, the metrics server's, the drain's and the main thread that follows the server
    process — and every one of them reads and writes it under :attr:`lock`, through the methods
    below (:meth:`step`, :meth:`follow`, :meth:`server_crashed`, :meth:`start_draining`,
    :meth:`restart_pending`, :meth:`given_up`, :meth:`server_pid`, :meth:`forget_regions`,
    :meth:`readiness`, :meth:`metrics`); only the constructor's arguments are read without it.
    """

    def __init__(self, server_pid: int, http_port: int, policy: RestartPolicy, *,
                 heal: bool = True, reload: bool = True, admin_key: str | None = None,
                 proc: Path = Path("/proc"), healed_path: Path = health.HEALED_STUBS,
                 shared_memory: Path = SHARED_MEMORY) -> None:
        self.watch = StubWatch(server_pid, proc)
        self.http_port = http_port
        self.policy = policy
        self.heal = heal
        self.reload = reload
        """Heal by reloading the model (explicit model control), else by restarting the server."""
        self.shared_memory = shared_memory
        self.admin_key = admin_key
        self.restart_requested = False
        """A server stopped to heal its stubs (``reload`` off): start it again when it exits."""
        self.draining = False
        """The replica is stopping: no more heals."""
        self.kill_timer: threading.Timer | None = None
        """SIGKILL for a server stopped to heal that does not exit in time; cancelled by
        :meth:`follow` (its pid may be another process's by then)."""
        self.healed_path = healed_path
        self.records: dict[str, ModelRecord] = {}
        self.restarts: dict[str, int] = {}
        self.deaths: dict[str, int] = {}
        self.healed: set[tuple[int, int]] = set()
        self.server_crashes: deque = deque()
        self.server_restarts = 0
        self.generation = 0
        """Counts the servers followed: a reload started for an earlier one is dropped."""
        self.gave_up: str | None = None
        """Why the supervisor gave up, once it has."""
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def follow(self, server_pid: int) -> None:
        """Watch a server started again: its stubs start afresh. After a crash its models do
        too; after a restart that healed stubs, each model keeps its failures in the window
        (a model that kills its stub again and again still makes the supervisor give up)."""
        with self.lock:
            if self.kill_timer is not None:
                self.kill_timer.cancel()
                self.kill_timer = None
            healing = self.restart_requested
            self.watch = StubWatch(server_pid, self.watch.proc)
            if healing:
                for model, record in self.records.items():
                    if record.dead:
                        self.restarts[model] = self.restarts.get(model, 0) + 1
                    record.dead, record.due, record.loading, record.died_at = [], None, False, None
            else:
                self.records.clear()
            self.restart_requested = False
            self.healed.clear()
            self.generation += 1
            self._write_healed()

    def server_crashed(self, why: str, now: float) -> bool:
        """Count a crash of the server at ``now``: True to start it again, False to give up."""
        with self.lock:
            self.server_crashes.append(now)
            while self.server_crashes and self.server_crashes[0] < now - self.policy.window_s:
                self.server_crashes.popleft()
            if not self.heal or len(self.server_crashes) > self.policy.max_failures:
                return False
            self.server_restarts += 1
            removed = remove_regions(self.watch.regions)
            said = (f"the server {why}; starting it again (server restart "
                    f"{self.server_restarts}, crash {len(self.server_crashes)} of "
                    f"{self.policy.max_failures} allowed within {self.policy.window_s:g}s; "
                    f"{removed} shared memory regions of its stubs removed)")
        log(said)
        return True

    def run(self) -> None:
        while not self.stopped.is_set() and self.given_up() is None:
            self.step(time.monotonic())
            self.stopped.wait(SCAN_INTERVAL_S)

    def stop(self) -> None:
        """End :meth:`run` (the server is gone)."""
        self.stopped.set()

    def start_draining(self) -> None:
        """The replica is stopping: no more heals, and readiness answers 503."""
        with self.lock:
            self.draining = True

    def restart_pending(self) -> bool:
        """Whether the server was stopped to heal its stubs, to be started again."""
        with self.lock:
            return self.restart_requested

    def given_up(self) -> str | None:
        """Why the supervisor gave up, once it has."""
        with self.lock:
            return self.gave_up

    def server_pid(self) -> int:
        with self.lock:
            return self.watch.server_pid

    def forget_regions(self) -> int:
        """Remove the shared memory regions of the stopped server's stubs; how many."""
        with self.lock:
            return remove_regions(self.watch.regions)

    def step(self, now: float) -> None:
        """One scan: record deaths, start the reloads (or the server restart) that are due."""
        with self.lock:
            if self.restart_requested or self.draining:  # its stubs end with it
                return
            deaths = self.watch.scan()
            for model in self.watch.models():
                self.restarts.setdefault(model, 0)
                self.deaths.setdefault(model, 0)
            for death in deaths:
                self._died(death, now)
            if not self.heal:
                return
            due = [model for model, record in self.records.items()
                   if record.due is not None and record.due <= now and not record.loading]
            if due and self.gave_up is None and (not self.reload or shared_memory_short(
                    self.shared_memory, self.watch.region_bytes)):
                self._restart_server(due)
                return
            for model in due:
                record = self.records[model]
                record.loading, record.due = True, None
                threading.Thread(target=self._reload,
                                 args=(model, list(record.dead), self.generation),
                                 daemon=True).start()

    def _restart_server(self, models: list[str]) -> None:
        """Heal where the repository API is closed: stop the server (SIGTERM, then SIGKILL after
        :data:`HEAL_STOP_GRACE_S`) so that :func:`main` starts it again and calls
        :meth:`follow`."""
        self.restart_requested = True
        self.server_restarts += 1
        why = ("the repository API is closed" if not self.reload else
               f"{self.shared_memory} is nearly full of the dead stubs' regions, which only a "
               f"new server frees")
        log(f"model{'s' if len(models) > 1 else ''} {', '.join(map(repr, sorted(models)))}: "
            f"restarting the server to heal {'them' if len(models) > 1 else 'it'} ({why}; "
            f"server restart {self.server_restarts})")
        pid = self.watch.server_pid
        forward_signal(pid, signal.SIGTERM)
        self.kill_timer = threading.Timer(HEAL_STOP_GRACE_S, forward_signal, (pid, signal.SIGKILL))
        self.kill_timer.daemon = True
        self.kill_timer.start()

    def _died(self, death: Death, now: float) -> None:
        self.deaths[death.model] = self.deaths.get(death.model, 0) + 1
        record = self.records.setdefault(death.model, ModelRecord())
        record.dead.append(death.stub.identity)
        record.died_at = record.died_at or now
        if not self.heal:
            log(f"model {death.model!r}: stub pid {death.stub.pid} ({death.instance}) "
                f"{death.why}; healing is off")
            return
        due = record.fail(now, self.policy)
        if due is None:
            self._give_up(death.model, f"its stub died again ({death.why})")
            return
        if not record.loading:
            record.due = due if record.due is None else min(record.due, due)
        else:  # the reload in flight may have started before this death: reload once more
            record.due = due
        log(f"model {death.model!r}: stub pid {death.stub.pid} ({death.instance}) {death.why}; "
            f"{'reloading' if self.reload else 'restarting the server'} {self._when(due, now)} "
            f"(failure {len(record.failures)} of {self.policy.max_failures} allowed within "
            f"{self.policy.window_s:g}s)")

    def _reload(self, model: str, dead: list[tuple[int, int]], generation: int) -> None:
        """Reload ``model``; on success its stubs in ``dead`` (dead before the load) are healed."""
        started = time.monotonic()
        try:
            problem = load_model(self.http_port, model, self.policy.load_timeout_s,
                                 self.admin_key)
        except LoadTimeout as stuck:
            with self.lock:
                if generation == self.generation:
                    self._give_up(model, f"the server is stuck loading it ({stuck})",
                                  at_once=True)
            return
        now = time.monotonic()
        with self.lock:
            if generation != self.generation:  # the server crashed meanwhile
                return
            record = self.records[model]
            record.loading = False
            if problem is None:
                self.restarts[model] = self.restarts.get(model, 0) + 1
                record.dead = [identity for identity in record.dead if identity not in dead]
                self.healed.update(dead)
                self._write_healed()
                since = now - (record.died_at or started)
                record.died_at = None if not record.dead else record.died_at
                log(f"model {model!r}: reloaded in {now - started:.1f}s, serving again "
                    f"{since:.1f}s after its stub was seen dead "
                    f"(restart {self.restarts[model]})")
                return
            due = record.fail(now, self.policy)
            if due is None:
                self._give_up(model, f"reloading it failed ({problem})")
                return
            record.due = due if record.due is None else min(record.due, due)
            log(f"model {model!r}: reload failed ({problem}); next try {self._when(due, now)} "
                f"(failure {len(record.failures)} of {self.policy.max_failures} allowed within "
                f"{self.policy.window_s:g}s)")

    def _give_up(self, model: str, why: str, at_once: bool = False) -> None:
        self.gave_up = (f"model {model!r}: {why}" if at_once else
                        f"model {model!r} failed more than {self.policy.max_failures} times "
                        f"within {self.policy.window_s:g}s, last: {why}")
        log(f"giving up: {self.gave_up}; stopping the server so that a restart policy starts "
            f"a fresh container (exit status {GAVE_UP})")
        pid = self.watch.server_pid
        forward_signal(pid, signal.SIGTERM)
        timer = threading.Timer(STOP_GRACE_S, forward_signal, (pid, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def _write_healed(self) -> None:
        """Keep only the healed stubs that are still zombies (a reaped pid may come back)."""
        self.healed = write_healed(self.healed, self.healed_path, self.watch.proc)

    @staticmethod
    def _when(due: float, now: float) -> str:
        return "now" if due <= now else f"in {due - now:.1f}s"

    def readiness(self) -> tuple[int, str]:
        """What ``/v2/health/ready`` answers: 503 while draining, else Triton's answer."""
        with self.lock:
            draining = self.draining
        if draining:
            return 503, "draining: this replica is stopping\n"
        return triton_readiness(self.http_port)

    def metrics(self) -> str:
        """Prometheus text exposition of the restart and death counters."""
        with self.lock:
            return metrics_text(dict(self.restarts), dict(self.deaths), self.server_restarts)
