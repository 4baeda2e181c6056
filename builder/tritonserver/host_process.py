"""A ``tritonserver`` host process: a real Triton serving a model repository without an image.

It is the fast path for end-to-end checks (tests, ``triton-builder serve --local``): the same
server binary and backends as the CPU image, run from the unpacked wheel. The python backend's
stub embeds the ``libpython`` of the interpreter running this module and sees its packages, so
what imports here imports in the served models.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from builder.errors import TritonBuilderError
from builder.tritonserver.wheel import TritonDistribution, triton_distribution


class TritonServerError(TritonBuilderError, RuntimeError):
    """The server did not start, or did not become ready; carries the tail of its log."""


class TritonServer:
    """Run ``tritonserver`` on free local ports; use it as a context manager.

    >>> with TritonServer("models") as server:
    ...     client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
    """

    def __init__(
        self,
        model_repository: str | os.PathLike,
        *,
        distribution: TritonDistribution | None = None,
        log_verbose: int = 0,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        ports: tuple[int, int, int] | None = None,
        exit_timeout: int = 5,
        python_backend: Path | None = None,
    ) -> None:
        """``ports`` pins (http, grpc, metrics) — clients made before the server need them;
        ``exit_timeout`` bounds how long a stop waits for idle keep-alive connections;
        ``python_backend`` is a directory holding another python_backend branch's library,
        stub (built for this interpreter's Python) and ``triton_python_backend_utils.py``, to
        serve with instead of the wheel's (see ``TritonDistribution.backend_directory``)."""
        self.model_repository = Path(model_repository).resolve()
        self._distribution = distribution
        self._log_verbose = log_verbose
        self._extra_args = extra_args
        self._env = env or {}
        self._ports = ports
        self._exit_timeout = exit_timeout
        self._python_backend = python_backend
        self._process: subprocess.Popen | None = None
        self._workdir: tempfile.TemporaryDirectory | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0

    @property
    def pid(self) -> int | None:
        """The ``tritonserver`` process, while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        assert self._workdir is not None, "the server was never started"
        return Path(self._workdir.name) / "tritonserver.log"

    def logs(self) -> str:
        """Everything the server has printed so far."""
        return self.log_path.read_text(errors="replace") if self._workdir else ""

    def start(self, timeout: float = 180.0) -> TritonServer:
        """Start the server and wait until every model is ready (``/v2/health/ready``)."""
        distribution = self._distribution or triton_distribution()
        self._workdir = tempfile.TemporaryDirectory(prefix="tritonserver-")
        workdir = Path(self._workdir.name)
        python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
        backends = distribution.backend_directory(workdir / "backends", python_version,
                                                  self._python_backend)
        self.http_port, self.grpc_port, self.metrics_port = self._ports or free_ports(3)
        command = [
            str(distribution.tritonserver),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--log-verbose={self._log_verbose}",
            f"--exit-timeout-secs={self._exit_timeout}",
            *self._extra_args,
        ]
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT,
                env=_server_environment(distribution, self._env, (backends / "python",)),
                cwd=workdir,
                start_new_session=True,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and keep its log readable until cleanup."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        self.stop()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise TritonServerError(
                    f"tritonserver exited while starting on {self.model_repository}:\n"
                    f"{_tail(self.logs())}"
                )
            if triton_ready(self.http_url):
                return
            time.sleep(0.25)
        raise TritonServerError(
            f"tritonserver was not ready after {timeout:.0f}s on {self.model_repository}:\n"
            f"{_tail(self.logs())}"
        )


def triton_ready(http_url: str) -> bool:
    """Whether the Triton at ``host:port`` answers 200 on ``/v2/health/ready`` (all models up)."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _server_environment(distribution: TritonDistribution, extra: dict[str, str],
                        libraries: tuple[Path, ...] = ()) -> dict:
    """The stub links ``libpython3.X``: point it at this interpreter's, and at its packages.

    The embedded interpreter ignores ``PYTHONPATH`` and finds its prefix from the first
    ``python3`` on ``PATH`` (a virtual environment's ``pyvenv.cfg`` included), so this
    interpreter's directory goes first: a server started from an environment that is not
    activated still sees that environment's packages. ``libraries`` are more directories of
    shared libraries (where a compiled python backend finds ``libtritonserver.so``).
    """
    env = dict(os.environ)
    libdirs = [str(distribution.library_dir), *map(str, libraries),
               sysconfig.get_config_var("LIBDIR") or ""]
    env["LD_LIBRARY_PATH"] = _joined(libdirs, env.get("LD_LIBRARY_PATH", ""))
    env["PATH"] = _joined([os.path.dirname(sys.executable)], env.get("PATH", ""))
    env.update(extra)
    return env


def _joined(first: list[str], rest: str) -> str:
    """``first`` ahead of the ``os.pathsep``-separated ``rest``, each directory once."""
    dirs = [d for d in first if d] + [d for d in rest.split(os.pathsep) if d]
    return os.pathsep.join(dict.fromkeys(dirs))


def free_ports(count: int) -> list[int]:
    """``count`` ports free on 127.0.0.1 right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])
