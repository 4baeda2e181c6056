"""Where a verified image whose weights travel beside it takes them from: a registry of the
build's own, over the same API and with the same code as from any registry.

Verification runs the image as a user runs it — its supervisor fills the weights cache, then
starts the server — but before anything is pushed (a failed build must leave nothing at the
user's registry). So the build serves the weights it just wrote: the read side of the
distribution API (``GET``/``HEAD /v2/`` and ``/v2/<name>/blobs/<digest>``, ``Range``
requests answered ``206``) for exactly the lock's digests, on the engine's bridge gateway, which
the container reaches, for as long as the verification runs. The container is pointed there by
``TRITON_BUILDER_WEIGHTS_REGISTRY`` and mounts the node's cache volume
(:data:`~builder.runtime.supervisor.weights_lock.CACHE_VOLUME`), so what verification fetched is
what the next ``docker run -v triton-builder-weights:…`` on this node finds.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

import docker

from builder.errors import TritonBuilderError
from builder.runtime.supervisor.weights_lock import CACHE_DIR, CACHE_VOLUME, WeightFile
from builder.runtime.supervisor.weights_registry import INSECURE_VARIABLE, REGISTRY_VARIABLE

_BLOB = re.compile(r"^/v2/.+/blobs/(sha256:[0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d+)-$")


class WeightsSourceError(TritonBuilderError, RuntimeError):
    """The build cannot serve the weights to the container it verifies."""


class WeightsSource:
    """``with WeightsSource(client, files) as source:`` — ``source.environment`` and
    ``source.volumes`` for the container."""

    def __init__(self, client: docker.DockerClient, files: Mapping[WeightFile, Path]) -> None:
        self.client = client
        self.blobs = {file.digest: Path(path) for file, path in files.items()}
        self.server: ThreadingHTTPServer | None = None

    def __enter__(self) -> WeightsSource:
        host = bridge_gateway(self.client)
        blobs = self.blobs

        class Handler(_BlobHandler):
            served = blobs

        try:
            self.server = ThreadingHTTPServer((host, 0), Handler)
        except OSError as error:
            raise WeightsSourceError(f"cannot serve the weights on the engine's bridge "
                                     f"gateway {host}: {error.strerror}") from None
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def environment(self) -> dict[str, str]:
        return {REGISTRY_VARIABLE: self.address, INSECURE_VARIABLE: "1"}

    @property
    def volumes(self) -> dict[str, dict[str, str]]:
        return node_cache_volumes()


def node_cache_volumes() -> dict[str, dict[str, str]]:
    """The Docker SDK's ``volumes`` that mount this node's weights cache: what verification,
    ``serve`` and every container of an image whose weights travel beside it share."""
    return {CACHE_VOLUME: {"bind": CACHE_DIR, "mode": "rw"}}


def bridge_gateway(client: docker.DockerClient) -> str:
    """The host's address on the engine's default bridge: what its containers reach it by.

    The bridge's IPAM configuration names its gateway where it was configured or the daemon
    wrote it back; a fresh Docker 20.10 engine lists the subnet alone, and its gateway is then
    the subnet's first address, the one Docker's default IPAM gives the bridge."""
    try:
        configs = client.networks.get("bridge").attrs.get("IPAM", {}).get("Config") or []
    except docker.errors.NotFound:
        configs = []
    for config in configs:
        if config.get("Gateway"):
            return str(config["Gateway"])
    for config in configs:
        subnet = ipaddress.ip_network(config.get("Subnet") or "::/128", strict=False)
        if subnet.version == 4 and subnet.num_addresses > 2:
            return str(subnet[1])
    raise WeightsSourceError("the engine has no default bridge network with a gateway: "
                             "verifying an image whose weights travel beside it needs one")


class _BlobHandler(BaseHTTPRequestHandler):
    served: Mapping[str, Path] = {}

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        if self.path.rstrip("/") == "/v2":
            return self._status(200)
        found = _BLOB.match(self.path)
        path = self.served.get(found.group(1)) if found else None
        if path is None:
            return self._status(404)
        size = path.stat().st_size
        wanted = _RANGE.match(self.headers.get("Range", ""))
        start = int(wanted.group(1)) if wanted else 0
        if start > size:
            return self._status(416)
        self.send_response(206 if wanted else 200)
        self.send_header("Content-Length", str(size - start))
        self.send_header("Docker-Content-Digest", found.group(1) if found else "")
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        if body:
            with open(path, "rb") as stream:
                stream.seek(start)
                shutil.copyfileobj(stream, self.wfile, 1 << 20)
        return None

    def _status(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
