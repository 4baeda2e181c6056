"""Pushing an image through the Docker SDK without trusting silence.

``images.push`` returns normally when the push failed: the failure is an ``errorDetail`` entry
in the progress stream (docker-py 3161, 3277). We read the stream ourselves, raise
:class:`PushError` on the first error, retry the failures that are worth retrying (connection
refused or reset, timeouts, 5xx, 429) with exponential backoff, and at the end ask the registry
which digest the tag names — it must be the one the engine reported.

Credentials: the engine pushes with what the Docker SDK reads from the Docker configuration
(``docker login``, credential helpers). Nothing here takes a password.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import docker
import docker.errors

from builder.engine.reference import ImageReference
from builder.engine.registry import RegistryError, manifest_digest, registry_insecure
from builder.errors import TritonBuilderError
from builder.progress import Log

TRANSIENT = (
    "connection refused", "connection reset", "broken pipe", "i/o timeout", "timeout",
    "tls handshake", "eof", "500 internal server error", "502 bad gateway",
    "503 service unavailable", "504 gateway", "429", "too many requests",
    "received unexpected http status: 5",
)
PERMANENT = (
    "no such host", "unauthorized", "denied", "authentication required", "does not exist locally",
    "name unknown", "name invalid", "manifest invalid", "blob unknown", "x509",
)


class PushError(TritonBuilderError, RuntimeError):
    """The push failed (after retries, when the failure looked transient)."""

    def __init__(self, message: str, *, reference: str, attempts: int, transient: bool) -> None:
        super().__init__(message)
        self.reference = reference
        self.attempts = attempts
        self.transient = transient


@dataclass(frozen=True)
class PushResult:
    reference: str
    digest: str
    """``sha256:…`` of the manifest, as the registry reports it."""
    attempts: int

    @property
    def pinned(self) -> str:
        """``name@sha256:…``: the reference that cannot move."""
        return f"{ImageReference.parse(self.reference).repository}@{self.digest}"


def push_image(
    client: docker.DockerClient,
    reference: str,
    *,
    retries: int = 3,
    backoff: float = 1.0,
    confirm: bool = True,
    on_log: Log | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> PushResult:
    """Push ``reference`` and return the digest the registry confirmed.

    ``retries`` is the number of attempts after the first for transient failures; the waits are
    ``backoff``, ``2 * backoff``, ``4 * backoff``…
    """
    parsed = ImageReference.parse(reference)
    repository, tag = parsed.repository, parsed.tag
    attempt = 0
    while True:
        attempt += 1
        try:
            digest = _push_once(client, repository, tag, on_log)
            break
        except PushError as error:
            if not error.transient or attempt > retries:
                raise PushError(
                    _explain(reference, str(error), attempt), reference=reference,
                    attempts=attempt, transient=error.transient) from None
            wait = backoff * 2 ** (attempt - 1)
            if on_log:
                on_log(f"push of {reference} failed ({error}); retrying in {wait:.1f}s")
            sleep(wait)
    if confirm:
        digest = _confirm(client, reference, digest, attempt)
    return PushResult(reference=reference, digest=digest, attempts=attempt)


def _push_once(client: docker.DockerClient, repository: str, tag: str,
               on_log: Log | None) -> str:
    digest = ""
    try:
        stream = client.api.push(repository, tag=tag, stream=True, decode=True)
        for chunk in stream:
            if "errorDetail" in chunk or "error" in chunk:
                message = (chunk.get("errorDetail") or {}).get("message") or chunk.get("error")
                raise PushError(str(message).strip(), reference=f"{repository}:{tag}",
                                attempts=1, transient=_is_transient(str(message)))
            aux = chunk.get("aux") or {}
            if aux.get("Digest"):
                digest = aux["Digest"]
            status = chunk.get("status")
            if on_log and status and "progressDetail" not in chunk:
                on_log(f"{chunk.get('id', '')} {status}".strip())
    except docker.errors.APIError as error:
        message = str(error.explanation or error)
        raise PushError(message, reference=f"{repository}:{tag}", attempts=1,
                        transient=_is_transient(message)) from None
    except (ConnectionError, TimeoutError) as error:
        raise PushError(f"lost the Docker engine during the push: {error}",
                        reference=f"{repository}:{tag}", attempts=1, transient=True) from None
    if not digest:
        raise PushError("the engine reported no digest for the push",
                        reference=f"{repository}:{tag}", attempts=1, transient=False)
    return digest


def _confirm(client: docker.DockerClient, reference: str, pushed: str, attempts: int) -> str:
    host = ImageReference.parse(reference).registry
    try:
        held = manifest_digest(reference, insecure=registry_insecure(client, host))
    except RegistryError as error:
        raise PushError(f"pushed {reference} ({pushed}), but could not confirm it with the "
                        f"registry: {error}", reference=reference, attempts=attempts,
                        transient=False) from None
    if held != pushed:
        raise PushError(f"the registry holds {held} for {reference}, but the engine pushed "
                        f"{pushed}: another push raced this one?", reference=reference,
                        attempts=attempts, transient=False)
    return held


def _is_transient(message: str) -> bool:
    text = message.lower()
    if any(mark in text for mark in PERMANENT):
        return False
    return any(mark in text for mark in TRANSIENT)


def _explain(reference: str, message: str, attempts: int) -> str:
    host = ImageReference.parse(reference).registry
    text = message.lower()
    hint = ""
    if "no such host" in text:
        hint = f" — the registry host {host} does not resolve: is the name right?"
    elif "connection refused" in text:
        hint = f" — nothing listens at {host}: is the registry running?"
    elif any(word in text for word in ("unauthorized", "denied", "authentication required")):
        hint = f" — run `docker login {host}` (credentials come from the Docker config)"
    elif "does not exist locally" in text:
        hint = " — build or tag the image first"
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    return f"push of {reference} failed{tries}: {message}{hint}"
