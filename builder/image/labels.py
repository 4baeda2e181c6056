"""The labels of a serving image: what it is, what it serves, and what it was built from.

Two families: the OCI annotation keys every registry UI and scanner reads
(``org.opencontainers.image.*``), and ours (``ai.triton-builder.*``) — the served signature, the
Triton/CUDA/Python it needs, the environment's hash, where its bill of materials lies
(``ai.triton-builder.sbom``) and the content hash of the build inputs.

Labels reach the engine through the build API, never through the Dockerfile: a label value can
hold anything (JSON, newlines) without any way to inject a build step, and the legacy builder
applies them as one last metadata step, so changing a label does not invalidate a layer.

``created`` is the build's epoch (:mod:`builder.build_epoch`: ``SOURCE_DATE_EPOCH``, else
2000-01-01), never the clock, so two builds of the same inputs carry the same labels. It is kept
out of the content hash: an image found for the same content is reused whatever its date.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.base.releases import Release
from builder.build_epoch import build_epoch, rfc3339
from builder.engine.image_build import CONTENT_HASH_LABEL
from builder.engine.reference import ImageReference
from builder.errors import TritonBuilderError
from builder.image.sbom import SBOM_PATH
from builder.pipeline.signature_document import SIGNATURE_PARAMETER

PREFIX = "ai.triton-builder."
OCI = "org.opencontainers.image."
CREATED = OCI + "created"
SIGNATURE = PREFIX + "signature"
TRITON_VERSION = PREFIX + "triton-version"
ENVIRONMENT_HASH = PREFIX + "environment-hash"
PAYLOAD_HASH = PREFIX + "payload-hash"
WEIGHTS_LABEL = PREFIX + "weights"
"""An image whose weights travel beside it: the digests its lock names, comma-separated (what
``doctor`` holds the node's cache against)."""
STAGE = PREFIX + "stage"
SBOM = PREFIX + "sbom"
"""Where the image's CycloneDX bill of materials lies in it (:mod:`builder.image.sbom`)."""
PLATFORM = PREFIX + "platform"
"""The platform the image is for (``linux/arm64``): the engine's ``Architecture`` says the
same, the label keeps it beside ours when the image is copied or exported."""
PLATFORMS = PREFIX + "platforms"
"""Every platform of a multi-platform build (``linux/amd64,linux/arm64``): the images tagged
``TAG-<architecture>`` beside this one, pushed under one index (``inspect`` reads it)."""
UNHASHED = frozenset({CREATED})
"""Labels that do not take part in the content hash."""
INPUTS = {
    OCI + "base.digest": "the base image: the Triton release's, or base_image=",
    PREFIX + "environment-hash": "the packed environment: its lock (every package, its version "
                                 "and wheel sha256) and the interpreter a bridge carries",
    PAYLOAD_HASH: "base, environment and model weights, with the Dockerfile steps over them",
    CONTENT_HASH_LABEL: "all of it: the payload, the model repository (pipeline code, pickles, "
                        "configs), the runtime scripts, the SBOM, the Dockerfile, the labels",
    CREATED: "the build's epoch: SOURCE_DATE_EPOCH, else 2000-01-01",
}
"""What an image is made from, by the label that records it: the same values, the same image ID
(tests/e2e/test_reproducible_image.py). Not recorded, because they do not reach the image: the
clock, the working directory, the umask, the cache directory, the machine."""


def image_inputs(labels: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The inputs an image's labels record, each with what it stands for (``inspect --inputs``)."""
    return {label: {"value": labels[label], "stands for": meaning}
            for label, meaning in INPUTS.items() if label in labels}

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


class LabelError(TritonBuilderError, ValueError):
    """A label key is not a plain dotted name, or one of ours is overridden."""


def created_timestamp() -> str:
    """RFC 3339 time of the build's epoch (``SOURCE_DATE_EPOCH``, else 2000-01-01)."""
    return rfc3339(build_epoch())


def serving_labels(
    *,
    release: Release,
    image_name: str,
    base_digest: str,
    environment_hash: str,
    signature: Mapping[str, Any] | str,
    version: str | None = None,
    revision: str | None = None,
    extra: Mapping[str, str] | None = None,
    platforms: tuple[str, ...] = (),
) -> dict[str, str]:
    """Every label of a serving image except the content hash and ``created`` (added last);
    ``platforms``: every platform of a multi-platform build this image is one of."""
    reference = ImageReference.parse(image_name)
    labels = {
        OCI + "title": reference.path.rsplit("/", 1)[-1],
        OCI + "version": version or reference.tag,
        OCI + "base.name": release.image,
        OCI + "base.digest": base_digest,
        PREFIX + "release": release.release,
        TRITON_VERSION: release.triton_version,
        PREFIX + "cuda": release.cuda or "cpu",
        PREFIX + "python-version": release.python_version,
        ENVIRONMENT_HASH: environment_hash,
        SIGNATURE: signature if isinstance(signature, str) else _compact_json(signature),
        STAGE: "serving",
        SBOM: SBOM_PATH,
        PLATFORM: release.platform.name,
    }
    if len(platforms) > 1:
        labels[PLATFORMS] = ",".join(platforms)
    if revision:
        labels[OCI + "revision"] = revision
    if release.gpu and release.safe_driver:
        labels[PREFIX + "min-driver"] = str(release.safe_driver)
    for key, value in (extra or {}).items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise LabelError(f"not a label key (letters, digits, '.', '_', '/', '-'): {key!r}")
        if key.startswith(PREFIX) or key == CONTENT_HASH_LABEL:
            raise LabelError(f"{key} is set by triton-builder and cannot be overridden")
        labels[key] = str(value)
    return labels


def hashed(labels: Mapping[str, str]) -> str:
    """The labels that identify the build, as stable text for the content hash."""
    return _compact_json({k: v for k, v in labels.items() if k not in UNHASHED})


def repository_signature(repository: str | os.PathLike) -> dict[str, Any]:
    """What the repository serves, read from its ``config.pbtxt`` files.

    ``models``: inputs and outputs (name, Triton dtype, dims) of every model. ``pipelines``: the
    signature a pipeline model carries in its ``pipeline_signature`` parameter (column names,
    dtypes, dims and Python kinds), for every model that has one.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    models: dict[str, Any] = {}
    pipelines: dict[str, Any] = {}
    for config_path in sorted(Path(repository).glob("*/config.pbtxt")):
        config = text_format.Parse(config_path.read_text(), mc.ModelConfig())
        name = config.name or config_path.parent.name

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "dtype": mc.DataType.Name(t.data_type),
                     "shape": list(t.dims)} for t in items]

        models[name] = {"max_batch_size": config.max_batch_size,
                        "inputs": tensors(config.input), "outputs": tensors(config.output)}
        carried = config.parameters.get(SIGNATURE_PARAMETER)
        if carried is not None and carried.string_value:
            try:
                pipelines[name] = json.loads(carried.string_value)
            except ValueError:
                pipelines[name] = carried.string_value
    summary: dict[str, Any] = {"models": models}
    if pipelines:
        summary["pipelines"] = pipelines
    return summary


def _compact_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
