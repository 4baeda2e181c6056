"""One tag for every platform: an OCI image index over the platforms' pushed manifests.

The engine (Debian's docker.io 20.10, no containerd image store, no buildx) holds and pushes one
platform per tag, so a multi-platform build pushes each platform's image under its own tag
(``name:1-amd64``, ``name:1-arm64``) and then writes the index itself, through the registry's
HTTP API (distribution spec, "Pushing Manifests"): ``PUT /v2/<name>/manifests/<tag>`` with the
index as body. ``docker run name:1`` (and Kubernetes, and ``docker pull``) then takes the entry
of its own platform.

The index is canonical JSON (keys sorted, no spaces) with its entries in the build's platform
order, so the same platform manifests give the same bytes and the same index digest. Each entry
is the platform manifest as the registry holds it: its digest, size and media type are read
back from the registry (``GET …/manifests/<digest>``, the body hashed again), never assumed. After
the ``PUT`` the registry must answer the index's digest for the tag, and serve the index back
naming every platform's digest: the push is confirmed entry by entry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import docker

from builder.engine.platforms import Platform
from builder.engine.reference import ImageReference
from builder.engine.registry import (
    RegistryError,
    manifest_digest,
    registry_insecure,
    registry_request,
)
from builder.progress import Log
from builder.push.docker_push import PushError, PushResult
from builder.push.weights_artifact import UNKNOWN_PLATFORM, WeightsArtifact, artifact_entries

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class IndexPushResult(PushResult):
    """A pushed image index: its digest, and each platform's manifest digest in it, as the
    registry serves them."""

    platforms: Mapping[str, str] = field(default_factory=dict)
    """``linux/arm64`` → ``sha256:…`` of that platform's manifest."""


@dataclass(frozen=True)
class ManifestDescriptor:
    """A manifest as the registry holds it: what an index entry names."""

    media_type: str
    digest: str
    size: int


def index_document(entries: Mapping[Platform, ManifestDescriptor],
                   artifacts: Sequence[WeightsArtifact] = ()) -> bytes:
    """The canonical bytes of the OCI image index over ``entries`` (in their order), then the
    weights' ``artifacts`` (no platform's entries: :mod:`builder.push.weights_artifact`)."""
    document = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{"mediaType": entry.media_type, "digest": entry.digest,
                       "size": entry.size, "platform": target.index_entry()}
                      for target, entry in entries.items()] + artifact_entries(artifacts),
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def manifest_descriptor(repository: ImageReference, digest: str, *,
                        insecure: bool | None = None) -> ManifestDescriptor:
    """The manifest ``digest`` of ``repository``, read from the registry and hashed again."""
    answer = registry_request(repository, f"manifests/{digest}", insecure=insecure)
    held = "sha256:" + hashlib.sha256(answer.body).hexdigest()
    if held != digest:
        raise RegistryError(f"{repository.registry} served {held} when asked for {digest}")
    media_type = answer.headers.get("Content-Type", "").split(";")[0].strip()
    if not media_type:
        media_type = json.loads(answer.body).get("mediaType", "")
    return ManifestDescriptor(media_type, digest, len(answer.body))


def push_index(client: docker.DockerClient, reference: str,
               manifests: Mapping[Platform, PushResult], *,
               artifacts: Sequence[WeightsArtifact] = (),
               on_log: Log | None = None) -> IndexPushResult:
    """Write the index of ``manifests`` (each platform's push, in this repository) and the
    weights' ``artifacts`` (pushed to it) under ``reference``'s tag and confirm it with the
    registry (see the module's text)."""
    ref = ImageReference.parse(reference)
    insecure = registry_insecure(client, ref.registry)
    try:
        entries = {}
        for target, pushed in manifests.items():
            if ImageReference.parse(pushed.reference).repository != ref.repository:
                raise PushError(f"{pushed.reference} is not in {ref.repository}: an index names "
                                f"manifests of its own repository", reference=reference,
                                attempts=1, transient=False)
            entries[target] = manifest_descriptor(ref, pushed.digest, insecure=insecure)
        body = index_document(entries, artifacts)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        answer = registry_request(ref, f"manifests/{ref.tag}", method="PUT", body=body,
                                  headers={"Content-Type": INDEX_MEDIA_TYPE},
                                  actions="pull,push", insecure=insecure)
        said = answer.headers.get("Docker-Content-Digest")
        if said and said != digest:
            raise RegistryError(f"the registry stored the index as {said}, not {digest}")
        held = manifest_digest(reference, insecure=insecure)
        if held != digest:
            raise RegistryError(f"the registry holds {held} for {reference}, not the index "
                                f"{digest} just written: another push raced this one?")
        platforms = _served_platforms(ref, digest, insecure)
    except RegistryError as error:
        raise PushError(f"pushing the image index {reference} failed: {error}",
                        reference=reference, attempts=1, transient=False) from None
    wanted = {target.name: pushed.digest for target, pushed in manifests.items()}
    if platforms != wanted:
        raise PushError(f"the registry serves the index {reference} with {platforms}, not "
                        f"{wanted}", reference=reference, attempts=1, transient=False)
    if on_log:
        on_log(f"{reference}: image index {digest} over "
               + ", ".join(f"{name} {found}" for name, found in platforms.items()))
    return IndexPushResult(reference=reference, digest=digest, attempts=1, platforms=platforms)


def _served_platforms(ref: ImageReference, digest: str,
                      insecure: bool | None) -> dict[str, str]:
    """``platform → manifest digest`` of the index the registry serves as ``digest``."""
    answer = registry_request(ref, f"manifests/{digest}", insecure=insecure)
    document: dict[str, Any] = json.loads(answer.body)
    served = {}
    for entry in document.get("manifests", []):
        platform = entry.get("platform", {})
        if platform == UNKNOWN_PLATFORM:
            continue
        served[f"{platform.get('os')}/{platform.get('architecture')}"] = entry.get("digest")
    return served
