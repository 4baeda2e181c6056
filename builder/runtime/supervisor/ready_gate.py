"""Ready means warm: the server's readiness held closed until the pipeline has answered its
examples through Triton's own HTTP front end.

Why: with every model warm (each model's ``model_warmup``, the pipeline's examples in its
``initialize``), the first request after ready still paid 2-3x the next ones on small pipelines
(issue 66): the front end's first inference and the first calls over BLS, which nothing inside a
model can make before ready — Triton refuses inference until its startup models have loaded
(``InferenceServer::InferAsync``, core r24.10), and ready follows right after.

How, with Triton's own rules (core r24.10, ``InferenceServer::IsReady``): under strict
readiness (the default) the server is ready only while every model it knows of has a version
ready, or unloaded. The image carries one more model repository, :data:`READY_GATE_DIR`, holding
:data:`GATE_MODEL`: an ensemble over the pipeline model whose version policy names a version
that does not exist, so its load fails at once, without a process, and the server starts not
ready (``--exit-on-error=false``; every other model that failed is still fatal: see
:meth:`ReadyGate.open`). Inference is open meanwhile. The supervisor sends each pipeline
model's ``model_warmup`` samples (its examples, as a client encodes them) as HTTP requests,
:data:`ROUNDS` times, marked (``warm_up.REQUEST_PARAMETER``) so that the pipeline model
leaves them out of its metrics and traces; then it loads the gate with its open configuration
(:data:`OPEN_CONFIG`, the same ensemble over version 1) and unloads it again: ``/v2/health/ready``
answers 200 from then on, and the model index shows the gate as unloaded.

Written by :mod:`builder.image.ready_gate_model` for images whose server runs with explicit model
control (the gate's load needs the repository API, locked behind the supervisor's key). A
streaming pipeline (decoupled) has no samples and no gate. ``TRITON_BUILDER_WARM_UP=0`` opens
the gate without sending anything.

Where the model repository is writable by the server (an image run as root), the python
backend's stub writes ``__pycache__`` into the pipeline's directory while it loads, and the
gate's load, which polls the pipeline as its composing model, finds it changed and loads it
again: the front end stays warm, the new stub only as its ``initialize`` and samples warmed it.
Images run as uid 1000 over files of root, where nothing is written. On a CPU server the
ensemble's load logs "unable to create stream ... CUDA driver version is insufficient": Triton's
ensemble scheduler asks for a CUDA stream and serves without one.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .admin_api import http_request, server_option

try:  # builder.runtime.supervisor
    from .. import warm_up
except ImportError:  # in the image: warm_up.py beside the package
    import warm_up  # type: ignore[no-redef]

GATE_MODEL = "triton_builder_ready_gate"
READY_GATE_DIR = "/opt/triton-builder/ready_gate"
READY_GATE_VARIABLE = "TRITON_BUILDER_READY_GATE"
"""Where the gate's repository is, when not at :data:`READY_GATE_DIR` (tests)."""
OPEN_CONFIG = "open_config.json"
"""The gate's configuration that loads (JSON, as Triton's load API takes it)."""
WARM_MODELS = "warm_models.json"
"""``{"models": [...]}``: the models whose samples go through the front end."""
CLOSED_VERSION = 2
"""The version the gate's configuration on disk asks for; only ``1/`` exists."""
ROUNDS = 2
"""How many times each sample is sent: the first pays the cold paths, the second finds them
warm (measured: a third changes nothing)."""
LIVE_POLL_S = 0.05
ITEM_SIZES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
              "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}


class GateError(Exception):
    """The server cannot be opened: a model failed to load, or a sample failed."""


def gate_directory(environ: Mapping[str, str]) -> str | None:
    """The gate's repository, where the image carries one."""
    directory = environ.get(READY_GATE_VARIABLE, READY_GATE_DIR)
    return directory if os.path.isfile(os.path.join(directory, OPEN_CONFIG)) else None


def why_not_gated(command: list[str]) -> str | None:
    """Why ``command`` cannot run behind the gate (None: it can): the gate's load needs explicit
    model control, strict readiness is what holds, and the server must not exit on the gate's
    failed load."""
    if server_option(command, "--model-control-mode") != "explicit":
        return "the server runs without --model-control-mode=explicit"
    if (server_option(command, "--strict-readiness") or "true").lower() in ("false", "0"):
        return "the server runs with --strict-readiness=false"
    if server_option(command, "--exit-on-error") is not None:
        return "the server's flags set --exit-on-error"
    return None


def gated_command(command: list[str], directory: str) -> list[str]:
    """``command`` with the gate's repository beside the image's, and a failed load left to
    the supervisor (:meth:`ReadyGate.open` stops the server for any model but the gate)."""
    return [*command, f"--model-repository={directory}", "--exit-on-error=false"]


@dataclass(frozen=True)
class ReadyGate:
    """Opens the server's readiness once its pipeline has answered through the front end."""

    directory: str
    model_repository: str
    http_port: int
    admin_key: str | None
    send: bool
    timeout_s: float

    @classmethod
    def prepare(cls, directory: str, command: list[str], http_port: int,
                admin_key: str | None, environ: Mapping[str, str],
                timeout_s: float) -> ReadyGate:
        return cls(directory=directory,
                   model_repository=server_option(command, "--model-repository") or "/models",
                   http_port=http_port, admin_key=admin_key,
                   send=warm_up.wanted(environ), timeout_s=timeout_s)

    def open(self, running: Callable[[], bool]) -> str | None:
        """Wait for the server to listen, refuse a model that failed to load, send the samples,
        then open: what it sent, for the log; None when the server stopped first. Raises
        :class:`GateError`."""
        if not self._wait_live(running):
            return None
        failed = self.failed_models()
        if failed:
            raise GateError("; ".join(f"model {name!r} failed to load: {reason}"
                                      for name, reason in failed))
        started = time.monotonic()
        sent = self.warm() if self.send else 0
        warming = time.monotonic() - started
        self._admin("repository/models", GATE_MODEL, "load", {"parameters": {
            "config": (Path(self.directory) / OPEN_CONFIG).read_text()}})
        self._admin("repository/models", GATE_MODEL, "unload", {})
        return (f"{sent} warm-up requests through the HTTP front end in {warming * 1000:.0f} ms"
                if self.send else f"no warm-up requests ({warm_up.SWITCH}=0)")

    def failed_models(self) -> list[tuple[str, str]]:
        """Every model but the gate that is not ready, with Triton's reason."""
        index = json.loads(self._admin("repository", "index", None, {}) or b"[]")
        return [(entry.get("name", "?"), entry.get("reason") or entry.get("state", "?"))
                for entry in index
                if entry.get("name") != GATE_MODEL and entry.get("state") != "READY"]

    def warm(self) -> int:
        """Send every warm model's samples :data:`ROUNDS` times; the number sent."""
        models = json.loads((Path(self.directory) / WARM_MODELS).read_text())["models"]
        sent = 0
        for model in models:
            config = json.loads(self._get(f"models/{model}/config"))
            bodies = [request_body(config, sample, Path(self.model_repository) / model)
                      for sample in config.get("model_warmup", [])]
            for _ in range(ROUNDS):
                for name, (body, header_size) in bodies:
                    self._infer(model, name, body, header_size)
                    sent += 1
        return sent

    def _wait_live(self, running: Callable[[], bool]) -> bool:
        """Until the server listens (it does once its startup models have loaded, however long
        that takes), or stops."""
        while running():
            try:
                self._get("health/live")
                return True
            except OSError:
                time.sleep(LIVE_POLL_S)
        return False

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}/v2/{path}"

    def _get(self, path: str) -> bytes:
        return http_request(self._url(path), None, self.timeout_s, None)

    def _admin(self, where: str, name: str, action: str | None, body: dict) -> bytes:
        path = f"{where}/{name}" + (f"/{action}" if action else "")
        try:
            return http_request(self._url(path), json.dumps(body).encode(), self.timeout_s,
                                self.admin_key)
        except urllib.error.HTTPError as error:
            raise GateError(f"{path} answered {error.code}: {_reason(error)}") from None

    def _infer(self, model: str, sample: str, body: bytes, header_size: int) -> None:
        request = urllib.request.Request(
            self._url(f"models/{model}/infer"), data=body, method="POST",
            headers={"Content-Type": "application/octet-stream",
                     "Inference-Header-Content-Length": str(header_size)})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as error:
            raise GateError(f"model {model!r} failed its warm-up sample {sample!r}: "
                            f"{error.code}: {_reason(error)}") from None


def request_body(config: Mapping, sample: Mapping, model_directory: Path
                 ) -> tuple[str, tuple[bytes, int]]:
    """A ``model_warmup`` sample (Triton's JSON of it) as an HTTP inference request with
    binary tensors: its name, and the body with the size of its JSON header. The sample's files
    hold each row as the binary tensor extension carries it (a ``TYPE_STRING`` element as its
    4-byte length and bytes), so a batch of *n* is the row *n* times."""
    batch = int(sample.get("batch_size", 1)) or 1
    batched = int(config.get("max_batch_size", 0)) > 0
    inputs, blobs = [], []
    for name, spec in sorted(sample.get("inputs", {}).items()):
        dims = [int(dim) for dim in spec.get("dims", [])]
        datatype = spec["data_type"].split("TYPE_", 1)[-1]
        datatype = "BYTES" if datatype == "STRING" else datatype
        if spec.get("input_data_file"):
            row = (model_directory / "warmup" / spec["input_data_file"]).read_bytes()
        else:  # zero_data or random_data: zeros
            count = 1
            for dim in dims:
                count *= dim
            row = bytes(count * ITEM_SIZES.get(datatype, 4))
        data = row * batch if batched else row
        inputs.append({"name": name, "datatype": datatype,
                       "shape": [batch, *dims] if batched else dims,
                       "parameters": {"binary_data_size": len(data)}})
        blobs.append(data)
    header = json.dumps({"inputs": inputs, "parameters": {warm_up.REQUEST_PARAMETER: True,
                                                          "binary_data_output": True}}).encode()
    return str(sample.get("name", "")), (header + b"".join(blobs), len(header))


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(error.read() or b"{}").get("error", "")
    except ValueError:
        detail = ""
    return detail.splitlines()[0] if detail else "no reason given"
