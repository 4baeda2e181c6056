"""An interrupt while the engine runs a ``COPY`` step, on the real engine: the build's layers
all go, the one that step was committing too.

A ``COPY`` step runs in no container, so nothing the client removes stops it: the engine
finishes it and commits its layer on the newest layer the build had made. Removing that newest
layer meanwhile made the engine's commit fail half-way, after the layer was stored and before
it was linked to its parent ("failed to set parent"): an image with no parent that no stream
names, left for good (the interrupt sweep's leftover at stop 54, 1 build in about 20 here with
the two cores busy). The instant is the one users meet: a Ctrl-C as the step begins. The step
copies a file large enough that the engine is still at it while the build is discarded.
"""

from __future__ import annotations

import os
import uuid

import pytest

from builder.engine.image_build import build_image
from builder.engine.image_listing import listed_images

RUN_LABEL = "ai.triton-builder.test-interrupted-copy"
LARGE_BYTES = 256 * 1024 * 1024


def test_an_interrupt_as_a_copy_step_begins_leaves_no_layer(docker_client, os_image,
                                                              tmp_path):
    run = uuid.uuid4().hex
    (tmp_path / "small").write_text(run)  # a layer no cache holds
    with open(tmp_path / "large", "wb") as large:
        large.write(os.urandom(1024 * 1024) * (LARGE_BYTES // (1024 * 1024)))
    (tmp_path / "Dockerfile").write_text(
        f'FROM {os_image}\nLABEL {RUN_LABEL}="{run}"\nCOPY small /small\nCOPY large /large\n')
    seen: list[str] = []

    def interrupt_as_the_large_copy_begins(line: str) -> None:
        seen.append(line)
        if line.startswith("Step 4/4"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_image(docker_client, tmp_path, [], on_log=interrupt_as_the_large_copy_begins)
    left = listed_images(docker_client, all=True, filters={"label": f"{RUN_LABEL}={run}"})
    assert any(line.startswith("Step 4/4") for line in seen)
    assert not left, (f"left on the engine: {[image.id[7:19] for image in left]} "
                      f"(parents {[image.attrs.get('Parent', '')[7:19] for image in left]})")
