"""Each model operator's weights as an OCI artifact in the image's repository.

What is pushed, per model (distribution spec, "Pushing Blobs" and "Pushing Manifests"): each file
as a blob (``HEAD`` first: a digest the repository holds is not uploaded again, so a new image
with unchanged weights uploads none), a small config blob (the model and its files, JSON), and a
manifest of media type ``application/vnd.oci.image.manifest.v1+json`` whose config media type
(:data:`CONFIG_MEDIA_TYPE`) says it is no image — registries of the OCI 1.0 era (distribution
2.8) take it, and clients that pull images ignore it. Each layer is one file, of media type
:data:`FILE_MEDIA_TYPE`, annotated with its path in the model repository
(``org.opencontainers.image.title``); the manifest with the model's name
(:data:`MODEL_ANNOTATION`). The manifest is put by digest, under no tag: the tag's image index
names it beside the image (:func:`artifact_entries`), so one tag holds image and weights, and
its bytes are canonical JSON, so the same files give the same artifact digest.

The image itself carries the lock (:mod:`builder.runtime.supervisor.weights_lock`) that names
the same digests; the container fetches the blobs by them, not through the manifest.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.engine.reference import ImageReference
from builder.engine.registry import RegistryError, registry_request
from builder.progress import Log
from builder.push.docker_push import PushError
from builder.runtime.supervisor.weights_lock import WeightFile, WeightsLock

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.triton-builder.weights.config.v1+json"
FILE_MEDIA_TYPE = "application/vnd.triton-builder.weights.file.v1"
MODEL_ANNOTATION = "ai.triton-builder.model"
TITLE_ANNOTATION = "org.opencontainers.image.title"
UNKNOWN_PLATFORM = {"architecture": "unknown", "os": "unknown"}
"""An index entry that is no platform's image (as buildx marks its attestations)."""


@dataclass(frozen=True)
class WeightsArtifact:
    """One model's pushed artifact: its manifest's digest and size, and what it uploaded."""

    model: str
    digest: str
    size: int
    uploaded: tuple[str, ...]
    """The digests of the files this push sent (the others the repository already held)."""
    uploaded_bytes: int


def push_weights(repository: str, model: str, files: Mapping[WeightFile, Path], *,
                 insecure: bool | None = None, on_log: Log | None = None) -> WeightsArtifact:
    """Push ``files`` (each lock entry → its file here) of ``model`` to ``repository``
    (``host/name``) as one artifact; return its manifest's descriptor."""
    ref = ImageReference.parse(f"{repository}:weights")
    uploaded: list[str] = []
    sent = 0
    try:
        for file, source in files.items():
            if _upload(ref, file.digest, source, insecure):
                uploaded.append(file.digest)
                sent += file.size
        config = canonical({"model": model, "files": [
            {"path": file.path, "digest": file.digest, "size": file.size} for file in files]})
        config_digest = digest_of(config)
        _upload(ref, config_digest, config, insecure)
        manifest = artifact_manifest(model, files, config_digest, len(config))
        digest = digest_of(manifest)
        answer = registry_request(ref, f"manifests/{digest}", method="PUT", body=manifest,
                                  headers={"Content-Type": MANIFEST_MEDIA_TYPE},
                                  actions="pull,push", insecure=insecure)
    except RegistryError as error:
        raise PushError(f"pushing the weights of model operator {model!r} to {repository} "
                        f"failed: {error}", reference=repository, attempts=1,
                        transient=False) from None
    said = answer.headers.get("Docker-Content-Digest")
    if said and said != digest:
        raise PushError(f"{repository} stored the weights of {model!r} as {said}, not {digest}",
                        reference=repository, attempts=1, transient=False)
    if on_log:
        on_log(f"weights of {model!r}: artifact {digest} ({len(uploaded)} of {len(files)} "
               f"files uploaded, {sent / 1e6:.1f} MB)")
    return WeightsArtifact(model, digest, len(manifest), tuple(uploaded), sent)


def push_lock_weights(repository: str, lock: WeightsLock, sources: Mapping[WeightFile, Path],
                      *, insecure: bool | None = None,
                      on_log: Log | None = None) -> list[WeightsArtifact]:
    """Every model of ``lock`` pushed to ``repository`` as its artifact, in the lock's order."""
    return [push_weights(repository, model,
                         {file: sources[file] for file in lock.files if file.model == model},
                         insecure=insecure, on_log=on_log)
            for model in lock.models]


def artifact_manifest(model: str, files: Iterable[WeightFile], config_digest: str,
                      config_size: int) -> bytes:
    """The canonical bytes of ``model``'s artifact manifest."""
    return canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest,
                   "size": config_size},
        "layers": [{"mediaType": FILE_MEDIA_TYPE, "digest": file.digest, "size": file.size,
                    "annotations": {TITLE_ANNOTATION: file.path}} for file in files],
        "annotations": {MODEL_ANNOTATION: model},
    })


def artifact_entries(artifacts: Iterable[WeightsArtifact]) -> list[dict[str, Any]]:
    """The image index's entries for ``artifacts``: no platform's, named by model."""
    return [{"mediaType": MANIFEST_MEDIA_TYPE, "digest": artifact.digest,
             "size": artifact.size, "platform": dict(UNKNOWN_PLATFORM),
             "annotations": {MODEL_ANNOTATION: artifact.model}} for artifact in artifacts]


def canonical(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _upload(ref: ImageReference, digest: str, body: bytes | Path,
            insecure: bool | None) -> bool:
    """Upload one blob unless the repository holds it; whether it was sent."""
    try:
        registry_request(ref, f"blobs/{digest}", method="HEAD", insecure=insecure)
        return False
    except RegistryError as error:
        if error.status != 404:
            raise
    started = registry_request(ref, "blobs/uploads/", method="POST", body=b"",
                               actions="pull,push", insecure=insecure)
    location = urllib.parse.urlsplit(started.headers.get("Location", ""))
    prefix = f"/v2/{ref.registry_path}/"
    if not location.path.startswith(prefix):
        raise RegistryError(f"{ref.registry} answered an upload with the location "
                            f"{started.headers.get('Location')!r}")
    query = urllib.parse.parse_qsl(location.query) + [("digest", digest)]
    path = f"{location.path[len(prefix):]}?{urllib.parse.urlencode(query)}"
    done = registry_request(ref, path, method="PUT", body=body,
                            headers={"Content-Type": "application/octet-stream"},
                            actions="pull,push", insecure=insecure, timeout=600.0)
    if done.headers.get("Docker-Content-Digest", digest) != digest:
        raise RegistryError(f"{ref.registry} stored a blob as "
                            f"{done.headers.get('Docker-Content-Digest')}, not {digest}")
    return True
