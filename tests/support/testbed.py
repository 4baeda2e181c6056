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


class LocalRegistry:
    """Debian's ``docker-registry`` (distribution v2.8) on a free 127.0.0.1 port.

    Pushing to ``127.0.0.1:PORT/name`` needs no TLS set-up: the engine trusts loopback.
    ``bind`` ``0.0.0.0`` lets containers reach it too (at the engine's bridge gateway).
    """

    def __init__(self, storage: Path, bind: str = "127.0.0.1") -> None:
        self.storage = Path(storage)
        self.bind = bind
        self.port = 0
        self._process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> LocalRegistry:
        program = ensure_program("docker-registry", "docker-registry")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        config = self.storage / "config.yml"
        config.write_text(
            "version: 0.1\n"
            f"storage: {{filesystem: {{rootdirectory: {self.storage / 'data'}}}}}\n"
            f"http: {{addr: '{self.bind}:{self.port}'}}\n"
            "log: {level: warn}\n"
        )
        self._log = open(self.storage / "registry.log", "wb")
        self._process = subprocess.Popen([program, "serve", str(config)], stdout=self._log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError):
                if self._process.poll() is not None:
                    break
                time.sleep(0.2)
        log = (self.storage / "registry.log").read_text(errors="replace")
        self.stop()
        raise RuntimeError(f"docker-registry did not start on {self.host}:\n{log[-3000:]}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)
        self._process = None

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class LocalPrometheus:
    """Debian's ``prometheus`` (2.42) scraping ``targets`` (``host:port``, path ``/metrics``)
    every second, on a free 127.0.0.1 port, its data under ``storage``."""

    def __init__(self, storage: Path, targets: list[str], interval_s: int = 1) -> None:
        self.storage, self.targets, self.interval_s = Path(storage), targets, interval_s
        self.port = 0
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> LocalPrometheus:
        program = ensure_program("prometheus", "prometheus")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        config = self.storage / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": f"{self.interval_s}s",
                       "evaluation_interval": f"{self.interval_s}s"},
            "scrape_configs": [{"job_name": "triton", "metrics_path": "/metrics",
                                "static_configs": [{"targets": self.targets}]}]}))
        self._log = open(self.storage / "prometheus.log", "wb")
        self._process = subprocess.Popen(
            [program, f"--config.file={config}", f"--storage.tsdb.path={self.storage / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError):
                if self._process.poll() is not None:
                    break
                time.sleep(0.2)
        log = (self.storage / "prometheus.log").read_text(errors="replace")
        self.stop()
        raise RuntimeError(f"prometheus did not start on {self.url}:\n{log[-3000:]}")

    def query(self, promql: str) -> list[dict]:
        """The instant vector ``promql`` evaluates to now (the HTTP API's ``result``)."""
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(address, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)
        self._process = None

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


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
