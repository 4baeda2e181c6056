"""A layer per model, measured where it counts: what a push uploads to a registry (issue 65,
item 2).

One pipeline of two model operators — ``encoder`` (256 x 4,096 float32, 4 MB) and ``head``
(4,096 x 16) — and a Python step after them, built into CPU images and pushed three times to a
registry started for the test: as it is, after a code-only change (the Python step), and after
a new version of ``head``. What each push uploaded is read off the registry's storage (every
blob it holds, before and after), and each new blob is named by the image's own history
(``inspect --layers``): the code-only change must upload the code layer alone (and the
image's config and manifest), under 1 MB in all; the new head its weights' layer and the code
layer, and nothing of ``encoder``. The last image then serves distinct requests concurrently,
equal to its pipeline.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from builder import ModelOp, build_docker_image, pipe
from builder.engine.image_config import image_layers
from builder.verify.concurrent import concurrent_check
from builder.verify.container import ServingContainer
from builder.verify.equality import TOLERANCE
from tests.support.testbed import LocalRegistry

pytestmark = [pytest.mark.slow]
WIDTH, HIDDEN, CLASSES = 256, 4096, 16
MANIFESTS = ("application/vnd.oci.image.manifest.v1+json, "
             "application/vnd.docker.distribution.manifest.v2+json")


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden)


def doubled(scores: np.ndarray) -> np.ndarray:
    return scores * 2


def tripled(scores: np.ndarray) -> np.ndarray:
    return scores * 3


def _row(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(WIDTH).astype(np.float32)


def _pipeline(head_seed: int, scale):
    torch.manual_seed(0)
    encoder = ModelOp(Encoder().eval(), torch.from_numpy(_row(0))[None], name="encoder",
                      pre=lambda x: x[None], post=lambda h: h[0])
    torch.manual_seed(head_seed)
    head = ModelOp(Head().eval(), torch.zeros(1, HIDDEN), name="head",
                   pre=lambda h: h[None], post=lambda s: s[0])
    return (pipe.input("x").map("x", "hidden", encoder).map("hidden", "scores", head)
            .map("scores", "scaled", scale).output("scaled").with_example(_row(1)))


def _blobs(registry) -> dict[str, int]:
    """Every blob the registry stores: digest → bytes."""
    root = Path(registry.storage) / "data/docker/registry/v2/blobs/sha256"
    return {f"sha256:{path.parent.name}": path.stat().st_size for path in root.glob("*/*/data")}


def _manifest_layers(registry, reference: str) -> tuple[list[str], set[str]]:
    """The pushed manifest's layer digests (oldest first), and the digests of its config and of
    itself (a registry stores a manifest as a blob too)."""
    name, tag = reference.split("/", 1)[1].rsplit(":", 1)
    request = urllib.request.Request(f"http://{registry.host}/v2/{name}/manifests/{tag}",
                                     headers={"Accept": MANIFESTS})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    manifest = json.loads(body)
    return ([layer["digest"] for layer in manifest["layers"]],
            {manifest["config"]["digest"], f"sha256:{hashlib.sha256(body).hexdigest()}"})


def _push(pipeline, reference: str, registry, docker_client, **keywords):
    """Build and push ``pipeline`` as ``reference``; which of its layers the push uploaded
    (by the names inspect --layers gives them), and all it uploaded in bytes."""
    before = _blobs(registry)
    build_docker_image(pipeline, reference, push=True, client=docker_client, **keywords)
    after = _blobs(registry)
    layers, described = _manifest_layers(registry, reference)
    parts = [layer.part for layer in image_layers(docker_client, reference)]
    assert len(parts) == len(layers), (parts, layers)
    new = {digest for digest in after if digest not in before}
    uploaded = [part for part, digest in zip(parts, layers, strict=True) if digest in new]
    assert new <= set(layers) | described, "a blob the manifest does not name"
    return uploaded, sum(after[digest] for digest in new), parts


@pytest.fixture
def registry(tmp_path):
    """A registry of the test's own: the session's holds the base's layers once another test
    pushed them, and a first push there uploads only what is new to it (CI at 397e2c3)."""
    (tmp_path / "registry").mkdir()
    with LocalRegistry(tmp_path / "registry") as running:
        yield running


def test_a_push_uploads_the_layers_of_what_changed(docker_client, cpu_base_image, registry):
    name = f"{registry.host}/triton-builder-test/weight-layers"
    references = [f"{name}:{version}" for version in (1, 2, 3)]
    try:
        first = _pipeline(1, doubled)
        uploaded, total, parts = _push(first, references[0], registry, docker_client,
                                       verify_calls=[(_row(2),), (_row(3),)])
        named = [part for part in parts if part != "base"]
        assert named[:2] == ["environment", "weights of encoder"], parts
        assert "weights of head" in named and named[-2:] == ["runtime", "code"], parts
        assert set(uploaded) == set(parts), "the first push uploads every layer"

        inspected = json.loads(subprocess.run(
            [str(Path(sys.executable).parent / "triton-builder"), "inspect", references[0],
             "--layers"],
            capture_output=True, text=True, check=True).stdout)
        print("inspect --layers:", json.dumps(inspected["layers"]))
        sizes = {layer["part"]: layer["size"] for layer in inspected["layers"]}
        assert sizes["weights of encoder"] > WIDTH * HIDDEN * 4 > sizes["weights of head"] > 0
        assert [layer["part"] for layer in inspected["layers"]] == parts

        uploaded, total, _ = _push(_pipeline(1, tripled), references[1], registry,
                                   docker_client, verify=False)
        print(f"code-only change: uploaded {uploaded}, {total} bytes")
        assert uploaded == ["code"] and total < 1_000_000, (uploaded, total)

        changed = _pipeline(2, tripled)
        uploaded, total, _ = _push(changed, references[2], registry, docker_client,
                                   verify=False)
        print(f"new head: uploaded {uploaded}, {total} bytes")
        assert uploaded == ["weights of head", "code"], uploaded

        calls = [_row(100 + k) for k in range(32)]
        expected = [changed(call) for call in calls]
        assert not np.allclose(expected[0], first(calls[0])), "the head did change"
        with ServingContainer(docker_client, references[2]) as endpoint:
            concurrent_check("pipeline", [((c,), e) for c, e in zip(calls, expected, strict=True)],
                             TOLERANCE, timeout=120)(endpoint)
    finally:
        for reference in references:
            try:
                docker_client.images.remove(reference, force=True)
            except Exception:  # noqa: BLE001 - a build may have failed before tagging
                pass
