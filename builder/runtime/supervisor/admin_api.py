"""Talking to Triton's administrative APIs: the repository API that reloads a model, the
readiness the supervisor answers for, and the key that locks those APIs from every other client.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

READY_PATH = "/v2/health/ready"
RELOAD_PARAMETER = "triton_builder_reloaded"
"""The model parameter a heal sets (when it reloaded the model): see :func:`load_model`."""
ADMIN_APIS = ("model-repository", "shared-memory", "trace", "logging")
"""What only the key opens, over HTTP and gRPC: loading (with uploaded files: code), unloading and
reconfiguring models; registering shared memory regions the server then reads and writes;
trace and log settings, which name files the server writes. Left public, read-only and needed by
clients: inference, health, metadata, ``model-config`` (a model's batching and shapes: our
clients and NVIDIA's perf_analyzer read it) and ``statistics`` (the counts the public metrics
port already serves; perf_analyzer reads them)."""
ADMIN_KEY_HEADER = "triton-builder-admin-key"
"""The header that carries the key. Over gRPC Triton prefixes restricted protocols' headers: the
metadata key is :data:`GRPC_ADMIN_KEY_HEADER`."""
GRPC_ADMIN_KEY_HEADER = f"triton-grpc-protocol-{ADMIN_KEY_HEADER}"
ADMIN_KEY_VARIABLE = "TRITON_BUILDER_ADMIN_KEY"
ADMIN_KEY = re.compile(r"[A-Za-z0-9._~+/-]{16,256}")
"""What an operator's key may be: 16 characters or more that travel unchanged in an HTTP header
and a gRPC metadata value, and that Triton's ``<apis>:<header>=<value>`` option parses."""


class LoadTimeout(Exception):
    """Triton did not answer a load within the policy's ``load_timeout_s``."""


def load_model(http_port: int, model: str, timeout: float,
               admin_key: str | None = None) -> str | None:
    """Reload ``model`` with the configuration it runs with: None once loaded, else Triton's
    reason (its first line). Raises :class:`LoadTimeout` when Triton does not answer within
    ``timeout``.

    Why the configuration goes along, stamped: Triton turns a ``load`` of a loaded model into a
    reload only when something changed — its files (the python backend's ``__pycache__`` made
    the pipeline model look changed once; an ONNX model never does, and its load returned at
    once with the dead stub in place) or the configuration the load carries, compared with the
    previous load's. So the supervisor sends the model's own configuration with one parameter
    added, :data:`RELOAD_PARAMETER`, whose value differs on every reload. Until the new
    instances are ready the old version keeps its place, so the model never becomes unknown to
    its BLS callers. ``admin_key`` opens the repository API where it is locked."""
    base = f"http://127.0.0.1:{http_port}/v2"
    try:
        config = json.loads(http_request(f"{base}/models/{model}/config", None, timeout, admin_key))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + f" {time.monotonic_ns()}"
        config.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": stamp}
        body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        http_request(f"{base}/repository/models/{model}/load", body, timeout, admin_key)
    except urllib.error.HTTPError as error:
        try:
            detail = json.loads(error.read() or b"{}").get("error", "")
        except ValueError:
            detail = ""
        first = detail.splitlines()[0] if detail else ""
        return f"{error.url.split('/v2/', 1)[-1]} answered {error.code}: {first}".rstrip(": ")
    except TimeoutError:
        raise LoadTimeout(f"no answer to the load within {timeout:g}s") from None
    except (urllib.error.URLError, OSError) as error:
        if isinstance(getattr(error, "reason", None), TimeoutError):
            raise LoadTimeout(f"no answer to the load within {timeout:g}s") from None
        return f"load failed: {getattr(error, 'reason', error)}"
    return None


def http_request(url: str, body: bytes | None, timeout: float, admin_key: str | None) -> bytes:
    headers = {"Content-Type": "application/json"}
    if admin_key:
        headers[ADMIN_KEY_HEADER] = admin_key
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET",
                                     headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def locked_command(command: list[str], key: str) -> list[str]:
    """``command`` with :data:`ADMIN_APIS` restricted to the header :data:`ADMIN_KEY_HEADER`
    carrying ``key``, over HTTP and gRPC. Raises ValueError, naming them, where the command
    restricts one of those APIs already (Triton refuses an API in two groups)."""
    taken = sorted({api for arg in command
                    for option in ("--http-restricted-api", "--grpc-restricted-protocol")
                    if arg.startswith(f"{option}=")
                    for api in arg.split("=", 1)[1].split(":", 1)[0].split(",")
                    if api in ADMIN_APIS})
    if taken:
        raise ValueError(f"the server's flags restrict {', '.join(taken)} already, which the "
                         f"image locks itself: drop those from the flags and set "
                         f"{ADMIN_KEY_VARIABLE} to choose the key")
    apis = ",".join(ADMIN_APIS)
    return [*command, f"--http-restricted-api={apis}:{ADMIN_KEY_HEADER}={key}",
            f"--grpc-restricted-protocol={apis}:{ADMIN_KEY_HEADER}={key}"]


def admin_key(environ: Mapping[str, str]) -> tuple[str, str]:
    """The key of the locked APIs and where it came from: the operator's
    :data:`ADMIN_KEY_VARIABLE`, else a new random one."""
    chosen = environ.get(ADMIN_KEY_VARIABLE, "")
    if not chosen:
        return secrets.token_urlsafe(32), "a key made at start"
    if not ADMIN_KEY.fullmatch(chosen):
        raise ValueError(f"{ADMIN_KEY_VARIABLE} must be 16 to 256 characters of letters, digits "
                         f"and ._~+/- (it travels in a header)")
    return chosen, f"the operator's key ({ADMIN_KEY_VARIABLE})"


def server_option(command: list[str], name: str) -> str | None:
    """The value of ``--name=value`` (or ``--name value``) in the server's command."""
    for index, arg in enumerate(command):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and index + 1 < len(command):
            return command[index + 1]
    return None


def triton_readiness(http_port: int) -> tuple[int, str]:
    """Triton's ``/v2/health/ready``, as the supervisor's endpoint answers it: status, text."""
    try:
        http_request(f"http://127.0.0.1:{http_port}{READY_PATH}", None, 2.0, None)
    except urllib.error.HTTPError as error:
        return 503, f"not ready: Triton answered {error.code}\n"
    except OSError as error:
        return 503, f"not ready: {error}\n"
    return 200, "ready\n"
