"""``build_docker_image`` on the text-embedding pipeline: cold, unchanged, and after a code change.

* first — a machine with Docker and the OS image only: the CPU base built from scratch (no
  layer cache, the Triton wheel and the base's packages downloaded), then the cold build.
  This replaces the CPU base image on the engine (same content, new layers);
* cold — fresh caches (``TRITON_BUILDER_CACHE`` in a temporary directory, payload images of
  earlier runs removed), the CPU base present: export, environment packed in the image, every
  layer built;
* unchanged — the same pipeline again: the content hash matches, nothing is built;
* code-only — the pooling operator's code changes (its epsilon): the repository is written
  again, the environment and the payload layers (base, environment, weights) are reused and only
  the code layer is built; the image's layers are compared with the cold build's.

Each build is timed with and without verification (the image run and compared with the
in-process pipeline over gRPC and HTTP).

    python benchmarks/bench_pipeline_image.py [--runs 3] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import machine, publish  # noqa: E402
from builder import build_docker_image, pipe  # noqa: E402
from builder.base.cpu import build_cpu_base  # noqa: E402
from builder.base.os_image import debian_os_image  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.image.serving_image import PAYLOAD_REPOSITORY  # noqa: E402
from pipelines import text_embedding  # noqa: E402

SECTION = "## Pipeline image: cold build, unchanged, code-only change"
COMMAND = "python benchmarks/bench_pipeline_image.py"
IMAGE = "triton-builder-bench/pipeline"


class Pool:
    """Mean pool + L2 normalise, with the epsilon as the 'code' a user edits."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon

    def __call__(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        weights = mask[:, None]
        pooled = (hidden * weights).sum(axis=0) / max(float(weights.sum()), 1.0)
        return (pooled / max(float(np.linalg.norm(pooled)), self.epsilon)).astype(np.float32)


def pipeline(epsilon: float):
    encoder = text_embedding.make_pipeline().model_ops()[0]
    tokenizer = text_embedding.Tokenizer()
    return (pipe.input("text")
            .map("text", ("ids", "mask"), tokenizer)
            .map(("ids", "mask"), "hidden", encoder)
            .map(("hidden", "mask"), "vec", Pool(epsilon))
            .output("vec")
            .with_example("hello world"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="code-only rebuilds (median shown)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    client = ensure_engine()
    os_image = os.environ.get("TRITON_BUILDER_OS_IMAGE") or debian_os_image(client)
    os.environ["TRITON_BUILDER_OS_IMAGE"] = os_image
    build_cpu_base(client, os_image=os_image)
    quiet = lambda line: None  # noqa: E731
    rows, layers_shared = [], None
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as cache:
        first = _first_build(client, os_image, Path(cache) / "first", quiet)
        for verify in (False, True):
            _remove_images(client)
            os.environ["TRITON_BUILDER_CACHE"] = tempfile.mkdtemp(dir=cache)  # cold caches
            builds = [("cold", 1e-12), ("unchanged", 1e-12)] + [
                ("code-only", 1e-9 * (run + 1)) for run in range(args.runs)]
            timings: dict[str, list[float]] = {}
            layers = {}
            for name, epsilon in builds:
                started = time.monotonic()
                built = build_docker_image(pipeline(epsilon), f"{IMAGE}:1", verify=verify,
                                           client=client, on_log=quiet)
                timings.setdefault(name, []).append(time.monotonic() - started)
                layers[name] = client.images.get(built.id).attrs["RootFS"]["Layers"]
                if name == "unchanged":
                    assert not built.built, "an unchanged pipeline was rebuilt"
            cold, code = layers["cold"], layers["code-only"]
            layers_shared = len(cold) == len(code) and cold[:-1] == code[:-1] and (
                cold[-1] != code[-1])
            rows.append((verify, {name: statistics.median(t) for name, t in timings.items()}))
        _remove_images(client)

    lines = [SECTION, "",
             f"`{COMMAND} --runs {args.runs}` — {machine()}, "
             "CPU base "
             f"`triton-builder/tritonserver-cpu:2.51.0-py3.11` on `{os_image}`; "
             "pipeline: `pipelines/text_embedding.py` with its pooling operator as the code "
             "that changes.", "",
             "| build | without verification (s) | with verification (s) |", "|---|---|---|",
             f"| first build on a machine with only the OS image: CPU base from scratch "
             f"(wheels downloaded, no layer cache), then the cold build | {first:.2f} | — |"]
    by_verify = dict(rows)
    for name, label in (("cold", "cold: empty caches, every layer built"),
                        ("unchanged", "same pipeline again (content hash matches)"),
                        ("code-only", f"after a code-only change to an operator, median of "
                                      f"{args.runs}")):
        lines.append(f"| {label} | {by_verify[False][name]:.2f} | {by_verify[True][name]:.2f} |")
    ratio = [by_verify[v]["cold"] / by_verify[v]["code-only"] for v in (False, True)]
    first_ratio = first / by_verify[False]["code-only"]
    verification = by_verify[True]["code-only"] - by_verify[False]["code-only"]
    lines += ["", f"Code-only rebuild vs cold: {ratio[0]:.1f}x faster without verification, "
              f"{ratio[1]:.1f}x with it; vs the first build on a machine: {first_ratio:.0f}x "
              f"without verification. Every layer but the last shared with the cold build: "
              f"{layers_shared}. With verification on, running the new image and comparing it "
              f"with the pipeline over gRPC and HTTP (about {verification:.1f} s) is most of a "
              "rebuild; writing the repository (the model operator's export and the "
              "pipeline's pickle) and building the code layer are the rest."]
    section = "\n".join(lines) + "\n"
    publish(SECTION, section, write=not args.no_write)


def _first_build(client, os_image: str, cache: Path, quiet) -> float:
    """Seconds for the CPU base from scratch plus a cold pipeline build (no verification)."""
    _remove_images(client)
    os.environ["TRITON_BUILDER_CACHE"] = str(cache)
    started = time.monotonic()
    build_cpu_base(client, os_image=os_image, rebuild=True, on_log=quiet)
    build_docker_image(pipeline(1e-12), f"{IMAGE}:1", verify=False, client=client, on_log=quiet)
    return time.monotonic() - started


def _remove_images(client) -> None:
    for image in client.images.list():
        for tag in image.tags:
            if tag.startswith((f"{IMAGE}:", f"{PAYLOAD_REPOSITORY}:")):
                client.images.remove(tag, force=True)


if __name__ == "__main__":
    main()
