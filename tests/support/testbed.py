"""Real services for the tests that need more than a Python process."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from builder.engine.emulation import BINFMT_MISC, binfmt_problem
from builder.engine.platforms import Platform
from builder.host_packages import HostError, ensure_program


class LocalService:
    """A Debian program serving on a free 127.0.0.1 port, its log and data under ``storage``:
    started until ``ready_path`` answers, stopped with it (``with``)."""

    program = package = ""
    ready_path = "/"

    def __init__(self, storage: Path) -> None:
        self.storage = Path(storage)
        self.port = 0
        self._process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self, program: str) -> list[str]:
        """The program's command line, its configuration written (:attr:`port` chosen)."""
        raise NotImplementedError

    def start(self, timeout: float = 60.0):
        program = ensure_program(self.program, self.package)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        log_path = self.storage / f"{self.program}.log"
        self._log = open(log_path, "wb")
        self._process = subprocess.Popen(self.command(program), stdout=self._log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}{self.ready_path}", timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError):
                if self._process.poll() is not None:
                    break
                time.sleep(0.2)
        log = log_path.read_text(errors="replace")
        self.stop()
        raise RuntimeError(f"{self.program} did not start on {self.host}:\n{log[-3000:]}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)
        self._process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class LocalRegistry(LocalService):
    """Debian's ``docker-registry`` (distribution v2.8) on a free 127.0.0.1 port.

    Pushing to ``127.0.0.1:PORT/name`` needs no TLS set-up: the engine trusts loopback.
    ``bind`` ``0.0.0.0`` lets containers reach it too (at the engine's bridge gateway).
    """

    program = package = "docker-registry"
    ready_path = "/v2/"

    def __init__(self, storage: Path, bind: str = "127.0.0.1") -> None:
        super().__init__(storage)
        self.bind = bind

    def command(self, program: str) -> list[str]:
        config = self.storage / "config.yml"
        config.write_text(
            "version: 0.1\n"
            f"storage: {{filesystem: {{rootdirectory: {self.storage / 'data'}}}}}\n"
            f"http: {{addr: '{self.bind}:{self.port}'}}\n"
            "log: {level: warn}\n"
        )
        return [program, "serve", str(config)]


class LocalPrometheus(LocalService):
    """Debian's ``prometheus`` (2.42) scraping ``targets`` (``host:port``, path ``/metrics``)
    every ``interval_s`` seconds."""

    program = package = "prometheus"
    ready_path = "/-/ready"

    def __init__(self, storage: Path, targets: list[str], interval_s: int = 1) -> None:
        super().__init__(storage)
        self.targets, self.interval_s = targets, interval_s

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def command(self, program: str) -> list[str]:
        config = self.storage / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": f"{self.interval_s}s",
                       "evaluation_interval": f"{self.interval_s}s"},
            "scrape_configs": [{"job_name": "triton", "metrics_path": "/metrics",
                                "static_configs": [{"targets": self.targets}]}]}))
        return [program, f"--config.file={config}", f"--storage.tsdb.path={self.storage / 'data'}",
                f"--web.listen-address={self.host}"]

    def query(self, promql: str) -> list[dict]:
        """The instant vector ``promql`` evaluates to now (the HTTP API's ``result``)."""
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(address, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]["result"]


def enable_emulation(target: Platform) -> None:
    """Make this host run ``target``'s programs in containers, as root on Debian: Debian's
    ``qemu-user-static`` and ``binfmt-support`` (and ``arch-test``, which ``mmdebstrap`` asks
    for another architecture), ``binfmt_misc`` mounted where it is not, the handler enabled.

    Raises :class:`~builder.host_packages.HostError` saying what is missing where it cannot.
    """
    if binfmt_problem(target) is None:
        return
    ensure_program("qemu-aarch64-static" if target.machine == "aarch64"
                   else f"qemu-{target.machine}-static", "qemu-user-static")
    ensure_program("update-binfmts", "binfmt-support")
    ensure_program("arch-test", "arch-test")
    if not (BINFMT_MISC / "status").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_MISC)],
                       capture_output=True, text=True)
    subprocess.run(["update-binfmts", "--enable", target.binfmt], capture_output=True,
                   text=True)
    problem = binfmt_problem(target)
    if problem is not None:
        raise HostError(f"could not enable emulation of {target} here: {problem}")
