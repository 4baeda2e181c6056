"""Tuning a built image: its own repository, edited per setting, served by the image itself.

Why serve the image and not the host server: an image carries what the host may not — its
release's Triton, a GPU build of ONNX Runtime, its packed environment — and those decide where
the time goes. Each setting runs the image as users do, with the image's repository (copied out
once, its configs edited by :func:`~builder.tune.settings.apply_setting`) mounted read-only over
``/models``; the pipeline's examples (which an image does not carry) come from the pipeline the
caller names, and the image must serve that pipeline's signature.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker

from builder.engine.image_files import copy_image_directory
from builder.errors import TuneError
from builder.image.labels import TRITON_VERSION
from builder.image.serving_dockerfile import DEFAULT_MODEL_REPOSITORY
from builder.pipeline.signature_document import SIGNATURE_PARAMETER
from builder.repository.model_config import read_config
from builder.repository.writer import IN_PROCESS_PARAMETER
from builder.verify.container import ContainerEndpoint, ServingContainer


@dataclass(frozen=True)
class ServedRepository:
    """What a built repository serves: its pipeline model, the models the pipeline model calls
    through Triton, and whether its configs carry a latency budget's queue policy."""

    root: Path
    pipeline_model: str
    served: tuple[str, ...]
    queue_policy: bool
    signature: dict


def served_repository(root: Path) -> ServedRepository:
    """Read a built repository: the model carrying a pipeline signature is the pipeline model;
    the models it runs in process (its ``in_process_models`` parameter) are not served."""
    pipelines = {}
    for path in sorted(root.glob("*/config.pbtxt")):
        config = read_config(path.parent)
        carried = config.parameters.get(SIGNATURE_PARAMETER)
        if carried is not None and carried.string_value:
            pipelines[path.parent.name] = config
    if len(pipelines) != 1:
        raise TuneError(f"{root} holds {len(pipelines)} pipeline models; tune needs one")
    ((name, config),) = pipelines.items()
    own = config.parameters.get(IN_PROCESS_PARAMETER)
    in_process = set(json.loads(own.string_value)) if own is not None and own.string_value else ()
    served = tuple(path.parent.name for path in sorted(root.glob("*/config.pbtxt"))
                   if path.parent.name not in (name, *in_process))
    return ServedRepository(root, name, served,
                            config.dynamic_batching.HasField("default_queue_policy"),
                            json.loads(config.parameters[SIGNATURE_PARAMETER].string_value))


def image_triton_version(client: docker.DockerClient, image: str) -> str:
    """The Triton release the image serves with, from its label."""
    return client.images.get(image).labels.get(TRITON_VERSION, "")


@dataclass(frozen=True)
class ImageServing:
    """Serves a built repository with ``image``: a :data:`~.serving_trial.Serve`."""

    client: docker.DockerClient
    image: str

    def repository(self, dest: Path) -> ServedRepository:
        """The image's repository, copied to ``dest``."""
        return served_repository(copy_image_directory(self.client, self.image,
                                                      DEFAULT_MODEL_REPOSITORY, dest))

    @contextmanager
    def __call__(self, model_root: Path) -> Iterator[ContainerEndpoint]:
        volumes = {str(model_root): {"bind": DEFAULT_MODEL_REPOSITORY, "mode": "ro"}}
        with ServingContainer(self.client, self.image, volumes=volumes) as endpoint:
            yield endpoint
