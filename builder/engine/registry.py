"""Asking a registry which manifest a tag names: the check that a push really landed, and which
manifest of a multi-platform tag is one platform's (the engine pulls that one by its digest).

``GET /v2/<name>/manifests/<tag>`` with the manifest media types in ``Accept`` answers with a
``Docker-Content-Digest`` header. Registries that want credentials answer 401 with a
``WWW-Authenticate`` challenge (a bearer-token realm, or Basic); the credentials come from the
Docker configuration (``~/.docker/config.json``, credential helpers included) through the
Docker SDK's own reader — never from arguments, so no secret passes through our code paths or
reaches an image.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
from docker import auth as docker_auth

from builder.engine.platforms import Platform
from builder.engine.reference import ImageReference
from builder.errors import TritonBuilderError
from builder.runtime.supervisor import weights_registry

MANIFEST_TYPES = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
))


class RegistryError(TritonBuilderError, RuntimeError):
    """The registry could not be asked, or refused to say (``status``: its HTTP answer)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def manifest_digest(reference: str, *, insecure: bool | None = None,
                    timeout: float = 15.0) -> str:
    """The digest the registry holds for ``reference`` (``sha256:…``).

    ``insecure`` allows plain HTTP (the engine's "insecure registries"; loopback hosts are
    insecure by default, as they are for the engine).
    """
    ref = ImageReference.parse(reference)
    answer = registry_request(ref, f"manifests/{urllib.parse.quote(ref.tag)}",
                              insecure=insecure, timeout=timeout)
    return _digest_of(answer, ref)


def platform_variant_digest(reference: str, platform: Platform, *,
                            insecure: bool | None = None, timeout: float = 15.0) -> str:
    """The digest of ``platform``'s manifest in the image index (manifest list) ``reference``
    names: what ``docker pull --platform`` would take, pinned so that pulling it leaves the
    tag's local image (another platform's) alone. A single-platform tag is refused where it
    is not that platform's (its config says which)."""
    ref = ImageReference.parse(reference)
    answer = registry_request(ref, f"manifests/{urllib.parse.quote(ref.tag)}",
                              insecure=insecure, timeout=timeout)
    document = json.loads(answer.body)
    entries = document.get("manifests")
    if entries is None:
        raise RegistryError(f"{reference} is a single-platform image, not an index of "
                            f"platforms: pass that platform's own image (base_image=)")
    wanted = platform.index_entry()
    for entry in entries:
        found = entry.get("platform") or {}
        if (found.get("os"), found.get("architecture")) == (wanted["os"],
                                                            wanted["architecture"]):
            if "variant" in found and found["variant"] != wanted.get("variant", found["variant"]):
                continue
            return entry["digest"]
    listed = ", ".join(f"{(e.get('platform') or {}).get('os')}/"
                       f"{(e.get('platform') or {}).get('architecture')}" for e in entries)
    raise RegistryError(f"{reference} has no {platform} image (it holds {listed})")


@dataclass(frozen=True)
class RegistryAnswer:
    """What the registry answered a request: status, headers, body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def registry_request(ref: ImageReference, path: str, *, method: str = "GET",
                     body: bytes | Path | None = None, headers: Mapping[str, str] | None = None,
                     actions: str = "pull", insecure: bool | None = None,
                     timeout: float = 15.0) -> RegistryAnswer:
    """``method /v2/<repository>/<path>`` on ``ref``'s registry, with the credentials of the
    Docker configuration where it asks for them (a token for ``actions`` on the repository:
    ``pull``, or ``pull,push`` to write). Manifests are asked for in every type we know.
    A ``body`` that is a file's path is streamed from it (a blob of gigabytes), opened again
    for the request that carries the credentials."""
    if insecure is None:
        insecure = is_loopback(ref.registry)
    sent = {"Accept": MANIFEST_TYPES, **(headers or {})}
    errors = []
    for scheme in ("https", "http") if insecure else ("https",):
        url = f"{scheme}://{ref.registry}/v2/{ref.registry_path}/{path}"
        try:
            return _send(url, method, body, sent, ref, actions, timeout)
        except (urllib.error.URLError, ssl.SSLError, ConnectionError, TimeoutError) as error:
            if isinstance(error, urllib.error.HTTPError):
                raise RegistryError(_http_message(ref, error), status=error.code) from None
            errors.append(f"{url}: {getattr(error, 'reason', error)}")
    raise RegistryError(f"cannot reach the registry {ref.registry}: " + "; ".join(errors))


def registry_insecure(client: docker.DockerClient, host: str) -> bool:
    """Whether the engine talks plain HTTP to ``host`` (its insecure registries)."""
    if is_loopback(host):
        return True
    try:
        config = client.info().get("RegistryConfig") or {}
    except docker.errors.APIError:
        return False
    index = (config.get("IndexConfigs") or {}).get(host)
    return bool(index and index.get("Secure") is False)


def is_loopback(host: str) -> bool:
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _send(url: str, method: str, body: bytes | Path | None, headers: dict[str, str],
          ref: ImageReference, actions: str, timeout: float) -> RegistryAnswer:
    try:
        return _open(url, method, body, headers, timeout)
    except urllib.error.HTTPError as error:
        if error.code != 401:
            raise
        challenge = error.headers.get("WWW-Authenticate", "")
    authorized = {**headers, "Authorization": _authorization(challenge, ref, timeout, actions)}
    return _open(url, method, body, authorized, timeout)


def _open(url: str, method: str, body: bytes | Path | None, headers: dict[str, str],
          timeout: float) -> RegistryAnswer:
    if isinstance(body, Path):
        with open(body, "rb") as stream:
            sized = {**headers, "Content-Length": str(os.fstat(stream.fileno()).st_size)}
            return _open_request(urllib.request.Request(url, data=stream, headers=sized,
                                                        method=method), timeout)
    return _open_request(urllib.request.Request(url, data=body, headers=headers, method=method),
                         timeout)


def _open_request(request: urllib.request.Request, timeout: float) -> RegistryAnswer:
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return RegistryAnswer(response.status, dict(response.headers.items()), response.read())


def _digest_of(answer: RegistryAnswer, ref: ImageReference) -> str:
    digest = answer.headers.get("Docker-Content-Digest")
    if not digest:
        raise RegistryError(f"{ref.registry} did not send Docker-Content-Digest for "
                            f"{ref.registry_path}:{ref.tag}")
    return digest


def _auth_key(ref: ImageReference) -> str:
    """The key the Docker configuration files Docker Hub's credentials under."""
    return "https://index.docker.io/v1/" if ref.host is None else ref.host


def _credentials(ref: ImageReference) -> tuple[str, str] | None:
    config = docker_auth.load_config()
    found = docker_auth.resolve_authconfig(config, _auth_key(ref)) or {}
    username = found.get("username") or found.get("Username")
    password = found.get("password") or found.get("Password")
    if username and password:
        return username, password
    return None


def _authorization(challenge: str, ref: ImageReference, timeout: float,
                   actions: str = "pull") -> str:
    credentials = _credentials(ref)
    basic = (base64.b64encode(":".join(credentials).encode()).decode()
             if credentials is not None else None)
    try:
        return weights_registry.answer_challenge(
            challenge, basic, f"repository:{ref.registry_path}:{actions}", timeout)
    except weights_registry.ChallengeUnanswered as why:  # the container's: told as ours
        raise RegistryError({
            "credentials": f"{ref.registry} wants a login: run `docker login {ref.registry}`",
            "scheme": f"{ref.registry} asks for an unknown authentication: {challenge!r}",
            "realm": f"{ref.registry} sent a bearer challenge without a realm",
            "refused": f"{ref.registry} refused a token for {ref.registry_path} ({why.code}); "
                       f"run `docker login {ref.registry}`",
            "no token": f"{ref.registry}'s token service sent no token",
        }[why.reason]) from None


def _http_message(ref: ImageReference, error: urllib.error.HTTPError) -> str:
    shown = f"{ref.registry_path}:{ref.tag}"
    if error.code == 404:
        return f"{ref.registry} has no manifest {shown} (404)"
    if error.code in (401, 403):
        return f"{ref.registry} refused to show {shown} ({error.code}): docker login?"
    return f"{ref.registry} answered {error.code} for {shown}: {error.reason}"
