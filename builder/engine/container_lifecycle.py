"""Creating and removing the builder's own containers whole, whatever the instant of an interrupt.

Why: a container exists in the engine from the moment its create request is read, and an
interrupt that lands while the SDK waits for the answer would leave one that no cleanup knows.
So creation (and the start that follows) runs to its end and the interrupt is raised after it,
when the caller holds the container; removal does the same, and retries while the engine says
the container is busy (being started, being removed). Containers made for the builder's own use
carry their owner's labels (:mod:`builder.engine.ownership`), so that ``triton-builder doctor``
finds them after a build that was killed outright.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from builder.engine.ownership import BuildOwner
from builder.interrupts import deferred_interrupts

REMOVE_WAIT_S = 30.0


def create_container(client: docker.DockerClient, image: str, *, owner: BuildOwner | None,
                     start: bool = False, **options: Any) -> Container:
    """``client.containers.create(image, **options)`` (and ``start``) as one step an interrupt
    does not split; ``owner``'s labels are added to ``options["labels"]``."""
    if owner is not None:
        options["labels"] = {**(options.get("labels") or {}), **owner.labels()}
    with deferred_interrupts():
        container = client.containers.create(image, **options)
        if start:
            try:
                container.start()
            except BaseException:
                remove_container(client, container.id)
                raise
    return container


def remove_container(client: docker.DockerClient, container_id: str,
                     wait: float = REMOVE_WAIT_S) -> bool:
    """Remove a container (killed first if it runs, its anonymous volumes with it); True once
    the engine no longer has it. A second interrupt waits for the removal."""
    deadline = time.monotonic() + wait
    with deferred_interrupts():
        while True:
            try:
                client.api.remove_container(container_id, force=True, v=True)
                return True
            except docker.errors.NotFound:
                return True
            except docker.errors.APIError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)


@contextmanager
def throwaway_container(client: docker.DockerClient, image: str, *, start: bool = False,
                        **options: Any) -> Iterator[Container]:
    """A container for one job (read files, run a probe), removed when the block ends."""
    container = create_container(client, image, owner=BuildOwner.here(), start=start, **options)
    try:
        yield container
    finally:
        remove_container(client, container.id)
