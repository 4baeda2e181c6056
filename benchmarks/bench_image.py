"""Serving image: a cold build against a rebuild after a code-only change.

The repository is the test bed's sample (a python model, a small ONNX model) plus a larger ONNX
model (``--weights-mb``, real weights, served) and, unless ``--no-environment``, a real packed
environment (``envs/tabulate-demo.txt`` through :func:`builder.environment.pack_environment`,
attached the way the pipeline build attaches it). Weights are drawn fresh on each run, so the
cold build finds nothing cached: payload (base + environment + weights) and serving layers are
built from scratch. The rebuild edits ``model.py`` of the python model and builds again, as a
new process would (the in-process file-hash memo is cleared). Builds are timed without
verification; one verification of the rebuilt image (start, readiness, a request per model
over gRPC and HTTP) is timed on its own.

    python benchmarks/bench_image.py [--runs 3] [--weights-mb 256] [--no-environment] [--no-write]

prints the numbers and replaces the "Serving image: cold build vs code-only rebuild" section of
BENCHMARKS.md (the other sections are left alone).
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
from builder.base.cpu import build_cpu_base  # noqa: E402
from builder.base.os_image import debian_os_image  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.image import context as image_context  # noqa: E402
from builder.image.serving_image import payload_reference  # noqa: E402
from builder.job import build_image_from_repository  # noqa: E402
from builder.verify import VerifyOptions  # noqa: E402
from builder.verify.verification import InferenceCheck, verify_image  # noqa: E402
from tests.support.sample_repository import (  # noqa: E402
    FEATURES,
    expected_linear,
    expected_scale,
    write_sample_repository,
)

SECTION = "## Serving image: cold build vs code-only rebuild"
COMMAND = "python benchmarks/bench_image.py"
IMAGE = "triton-builder-bench/image"
SPEC = ROOT / "envs" / "tabulate-demo.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="code-only rebuilds (median shown)")
    parser.add_argument("--weights-mb", type=int, default=256, help="size of the large model")
    parser.add_argument("--no-environment", action="store_true", help="no packed environment")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    client = ensure_engine()
    os_image = os.environ.get("TRITON_BUILDER_OS_IMAGE") or debian_os_image(client)
    base = build_cpu_base(client, os_image=os_image).tags[0]
    quiet = lambda line: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-image-") as workdir:
        repository = write_sample_repository(Path(workdir) / "models")
        weights = _large_model(repository, args.weights_mb)
        environment = None if args.no_environment else _environment(client, base, repository)
        references, payloads = [], set()
        try:
            started = time.monotonic()
            cold = build_image_from_repository(repository, image_name=f"{IMAGE}:cold",
                                               verify=VerifyOptions(enabled=False),
                                               client=client, on_log=quiet)
            cold_seconds = time.monotonic() - started
            references.append(f"{IMAGE}:cold")
            payloads.add(cold.labels["ai.triton-builder.payload-hash"])
            rebuilds, last = [], cold
            for run in range(args.runs):
                model = repository / "scale" / "1" / "model.py"
                model.write_text(model.read_text() + f"\n# code-only change {run}\n")
                image_context._DIGESTS.clear()
                started = time.monotonic()
                last = build_image_from_repository(
                    repository, image_name=f"{IMAGE}:rebuild-{run}",
                    verify=VerifyOptions(enabled=False),
                    client=client, on_log=quiet)
                rebuilds.append(time.monotonic() - started)
                references.append(f"{IMAGE}:rebuild-{run}")
                payloads.add(last.labels["ai.triton-builder.payload-hash"])
            reused = _only_last_layer_differs(client, cold.id, last.id)
            started = time.monotonic()
            verify_image(client, last.id, _checks())
            verify_seconds = time.monotonic() - started
        finally:
            for reference in references + [payload_reference(p) for p in payloads]:
                try:
                    client.images.remove(reference, force=True)
                except Exception:  # noqa: BLE001 - best effort clean-up
                    pass

    rebuild = statistics.median(rebuilds)
    env_text = (f"environment `envs/{SPEC.name}` packed by `pack_environment` "
                f"({environment / 1e6:.1f} MB)" if environment else "no environment")
    section = "\n".join([
        SECTION,
        "",
        f"`{COMMAND} --runs {args.runs} --weights-mb {args.weights_mb}"
        f"{' --no-environment' if args.no_environment else ''}` — {machine()}, "
        f"base `{base}`; repository: the test bed's sample (python + "
        f"ONNX model) plus an ONNX model of {weights / 1e6:.0f} MB; {env_text}.",
        "",
        "| build (no verification) | seconds |",
        "|---|---|",
        f"| cold: payload (base + environment + weights) and serving layers built | "
        f"{cold_seconds:.2f} |",
        f"| rebuild after editing `model.py`, median of {args.runs} | {rebuild:.2f} |",
        f"| verification of the rebuilt image (start, ready, one request per model over gRPC "
        f"and HTTP) | {verify_seconds:.2f} |",
        "",
        f"Speed-up of a code-only rebuild: {cold_seconds / rebuild:.0f}x (builds only; with the "
        f"verification added to both, {(cold_seconds + verify_seconds) / (rebuild + verify_seconds):.1f}x). "  # noqa: E501
        f"Every layer but the last reused (image RootFS layers compared): {reused}. The "
        f"environment tarball itself was cached by its own builder in both cases. Load average "
        f"at the end: {os.getloadavg()[0]:.1f} (other jobs share the machine).",
        "",
    ])
    publish(SECTION, section, write=not args.no_write)


def _large_model(repository: Path, megabytes: int) -> int:
    """A served ONNX MLP of about ``megabytes`` of fresh random float32 weights."""
    import torch
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    width = int((megabytes * 1e6 / 4 / 3) ** 0.5)
    torch.manual_seed(int(time.time_ns() % 2**31))
    module = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 2)).eval()
    model_dir = repository / "large" / "1"
    model_dir.mkdir(parents=True)
    torch.onnx.export(module, (torch.zeros(1, FEATURES),), str(model_dir / "model.onnx"),
                      input_names=["INPUT"], output_names=["OUTPUT"],
                      dynamic_axes={"INPUT": {0: "batch"}, "OUTPUT": {0: "batch"}},
                      dynamo=False, external_data=False)
    config = mc.ModelConfig(
        name="large", platform="onnxruntime_onnx", max_batch_size=8,
        input=[mc.ModelInput(name="INPUT", data_type=mc.TYPE_FP32, dims=[FEATURES])],
        output=[mc.ModelOutput(name="OUTPUT", data_type=mc.TYPE_FP32, dims=[2])])
    (repository / "large" / "config.pbtxt").write_text(text_format.MessageToString(config))
    return (model_dir / "model.onnx").stat().st_size


def _environment(client, base: str, repository: Path) -> int:
    """Pack (or reuse) a real environment and attach it to the python model; its size."""
    from builder.environment.attach import attach_environment
    from builder.environment.spec import load_spec
    from builder.environment.tarball import pack_environment
    from builder.environment.target import image_target

    tarball = pack_environment(load_spec([SPEC]), image_target(client, base))
    attach_environment(repository, tarball)
    return tarball.path.stat().st_size


def _checks() -> list[InferenceCheck]:
    x = np.ones((2, FEATURES), np.float32)
    return [InferenceCheck("scale", {"X": x}, {"Y": expected_scale(x)}),
            InferenceCheck("linear", {"INPUT": x}, {"OUTPUT": expected_linear(x)}, atol=1e-5)]


def _only_last_layer_differs(client, old_id: str, new_id: str) -> bool:
    old = client.images.get(old_id).attrs["RootFS"]["Layers"]
    new = client.images.get(new_id).attrs["RootFS"]["Layers"]
    return len(old) == len(new) and old[:-1] == new[:-1] and old[-1] != new[-1]


if __name__ == "__main__":
    main()
