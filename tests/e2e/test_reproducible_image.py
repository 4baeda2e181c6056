"""Same inputs, same image: two clean builds of one pipeline give one image ID.

"Clean" as on two machines: each build is its own ``triton-builder image --no-cache`` process
(another ``PYTHONHASHSEED``), with an empty ``TRITON_BUILDER_CACHE``, another working directory
and another ``umask``, a second apart on the clock, and every image the first build made removed
before the second. ``--no-cache`` is what makes them clean on an engine that already holds the
same layers: the example is built first as a user would build it (the ``text_embedding_image``
fixture, with the builder's own caches), and neither clean build may be handed a layer of it.
What stays is what counts as an input: the pipeline's source, the base image (by digest), the
package index's wheels and ``SOURCE_DATE_EPOCH`` (unset here: the date is 2000-01-01).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.image.labels import INPUTS
from tests.support.engine_images import image_ids, remove_images_made
from tests.support.paths import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

PIPELINE = f"{REPO_ROOT / 'pipelines' / 'text_embedding.py'}:pipeline"
REFERENCE = "triton-builder-test/reproducible:1"


def _build(workdir: Path, umask: int, hash_seed: str) -> str:
    """One build as on a fresh machine; its log."""
    (workdir / "cache").mkdir(parents=True)
    environment = {key: value for key, value in os.environ.items()
                   if key != "SOURCE_DATE_EPOCH"}
    environment.update(TRITON_BUILDER_CACHE=str(workdir / "cache"), PYTHONHASHSEED=hash_seed)
    program = Path(sys.executable).parent / "triton-builder"
    result = subprocess.run([str(program), "image", PIPELINE, "-t", REFERENCE, "--no-verify",
                             "--no-cache"],
                            cwd=workdir, env=environment, capture_output=True, text=True,
                            preexec_fn=lambda: os.umask(umask), timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _layers(client, image_id: str) -> list[str]:
    return client.images.get(image_id).attrs["RootFS"]["Layers"]


def test_two_clean_builds_give_one_image_id(docker_client, text_embedding_image, tmp_path):
    """After a user's own build of the same example (``text_embedding_image``)."""
    import time

    before = image_ids(docker_client)
    ids, layers = [], []
    for machine, (umask, seed) in enumerate(((0o022, "1"), (0o077, "2"))):
        if machine:
            time.sleep(1.5)  # another second on the clock
        log = _build(tmp_path / f"machine-{machine}", umask, seed)
        assert "Using cache" not in log, f"build {machine + 1} was handed cached layers"
        assert f"built {REFERENCE}" in log, f"build {machine + 1} built nothing:\n{log}"
        image = docker_client.images.get(REFERENCE)
        if not machine:
            shown = json.loads(subprocess.run(
                [str(Path(sys.executable).parent / "triton-builder"), "inspect", REFERENCE,
                 "--inputs"], capture_output=True, text=True, check=True).stdout)
            assert {label: entry["value"] for label, entry in shown.items()} == {
                label: image.labels[label] for label in INPUTS}
        ids.append(image.id)
        layers.append(_layers(docker_client, image.id))
        remove_images_made(docker_client, before, (REFERENCE,))
    differing = [index for index, (first, second) in enumerate(zip(*layers)) if first != second]
    assert ids[0] == ids[1], (f"two image IDs {ids}; layers that differ (from the base up): "
                              f"{differing} of {len(layers[0])}")
    if ids[0] in before:  # rebuilt layer by layer, and the same as an image already there
        print(f"the clean builds gave the ID of an earlier build of the same inputs: {ids[0]}")
