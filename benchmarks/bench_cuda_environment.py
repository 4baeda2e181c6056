"""CUDA environments: size, build time, and the time to ready as a tarball against unpacked.

For ``cuda='11.8'`` (22.12) and ``cuda='12.4'`` (24.05), both bridged from this Python 3.11, the
environment a build makes for the text-embedding example with its encoder on the GPU, through
the build's own steps (:func:`builder.environment.prepare.environment_spec`,
:func:`~builder.environment.torch_for_cuda.resolve_cuda_packages`, the bridge's
:class:`~builder.environment.carried.CarriedInterpreterPacker`,
:func:`~builder.environment.tarball.pack_environment`). On 22.12 torch comes in because BLS hands
the GPU model's outputs over by dlpack; on 24.05 nothing in the example needs torch, so the
pipeline asks for it (``requirements=["torch"]``, as a pipeline with a torch operator does).
torch is chosen from PyTorch's per-CUDA index or, where that cannot be reached, from PyPI's
wheel metadata.

What cannot exist here: the NGC release image (the interpreter target is an image holding
Python 3.11 on glibc 2.31, ``--interpreter-image``; the tests build one,
``triton-builder-test/python-source:3.11-bullseye``) and the stub compiled on 22.12's image (the
22.12 environment is packed without one; the stub adds no packages). Time to ready is measured
with the host Triton 2.51 (the nvidia-pytriton wheel's, ``builder.tritonserver.host_process``)
serving one python model (``benchmarks/environment_model.py``, which imports torch in
``initialize``) whose ``EXECUTION_ENV_PATH`` is the environment, attached by
:func:`~builder.environment.attach.attach_environment` as the archive (extracted by the python
backend at every server start: what 22.12 and 23.05 do at every start, r24.10 too unless given a
directory) or unpacked (used in place, python_backend r23.07 and later).

    python benchmarks/bench_cuda_environment.py [--runs 3] [--cuda 11.8 --cuda 12.4]
        [--interpreter-image IMAGE] [--find-links DIR] [--no-write]

Build time is one cold build per CUDA (fresh environment cache; with ``--find-links``, the
wheels come from directories downloaded before, so PyPI's speed is not in it);
the server starts alternate tarball / directory, ``--runs`` times each, and
the table holds their medians. Prints the numbers and replaces the "CUDA environments" section of
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from tritonclient.grpc import model_config_pb2  # noqa: E402

from benchmarks.report import machine, publish  # noqa: E402
from builder.base import resolve  # noqa: E402
from builder.base.releases import StubSource  # noqa: E402
from builder.bridge.interpreter import INTERPRETER_IMAGE_VARIABLE  # noqa: E402
from builder.bridge.plan import BridgeOptions, plan_python  # noqa: E402
from builder.bridge.wheel_stub import wheel_stub  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.environment.attach import attach_environment  # noqa: E402
from builder.environment.carried import CarriedInterpreterPacker  # noqa: E402
from builder.environment.index import PackageIndex  # noqa: E402
from builder.environment.prepare import EnvironmentOptions, environment_spec  # noqa: E402
from builder.environment.tarball import EnvironmentTarball, pack_environment  # noqa: E402
from builder.environment.target import interpreter_target  # noqa: E402
from builder.environment.torch_for_cuda import PYTORCH_INDEX, resolve_cuda_packages  # noqa: E402
from builder.repository.writer import build_pipeline_model  # noqa: E402
from builder.tritonserver.host_process import TritonServer  # noqa: E402
from pipelines.text_embedding import pipeline  # noqa: E402

SECTION = "## CUDA environments: size, build, time to ready"
COMMAND = "python benchmarks/bench_cuda_environment.py"
STAND_IN = "triton-builder-test/python-source:3.11-bullseye"
EXTRA_REQUIREMENTS = {"11.8": [], "12.4": ["torch"]}
"""What the pipeline asks for besides what the build adds (see the module's docstring)."""
MODEL = "torch_probe"
READY_TIMEOUT = 900.0


@dataclass
class Measured:
    cuda: str
    release: str
    torch: str
    tarball: EnvironmentTarball
    build_seconds: float
    tarball_bytes: int
    unpacked_bytes: int
    files: int
    ready: dict[str, list[float]]
    answer: str


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="server starts of each kind (median)")
    parser.add_argument("--cuda", action="append", help="CUDA versions (default 11.8 and 12.4)")
    parser.add_argument("--interpreter-image", default=os.environ.get(INTERPRETER_IMAGE_VARIABLE)
                        or STAND_IN, help="image whose python3 the environment carries")
    parser.add_argument("--find-links", action="append", default=[],
                        help="directories of wheels downloaded before (PyPI's speed left out)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    client = ensure_engine()
    index = PackageIndex(find_links=tuple(str(Path(d).resolve()) for d in args.find_links))
    results = [_measure(client, cuda, args.interpreter_image, args.runs, index)
               for cuda in args.cuda or ["11.8", "12.4"]]
    rows = []
    for m in results:
        tar, unpacked = (statistics.median(m.ready[k]) for k in ("tarball", "directory"))
        rows.append(
            f"| {m.cuda} ({m.release}) | {m.torch} | {m.tarball_bytes / 1e9:.2f} GB | "
            f"{m.unpacked_bytes / 1e9:.2f} GB ({m.files} files) | {m.build_seconds:.0f} s | "
            f"{tar:.1f} s | {unpacked:.1f} s | {tar - unpacked:.1f} s |")
    section = "\n".join([
        SECTION, "",
        f"`{COMMAND} --runs {args.runs}"
        f"{''.join(' --find-links DIR' for _ in args.find_links)}` on {machine()}"
        + (" (DIR: `pip download` of the same requirements)" if args.find_links else "")
        + f"; interpreter image `"
        f"{args.interpreter_image}` (a stand-in for the official Python image: no NGC image or "
        f"Docker Hub here). The text-embedding example, encoder on the GPU, bridged from "
        f"Python 3.11; torch chosen by the build (PyTorch's index unreachable here: from PyPI's "
        f"wheel metadata). Build: one cold build (fresh environment cache"
        + (", wheels from a local `--find-links` directory: PyPI's speed left out"
           if args.find_links else ", wheels from PyPI through pip's cache as this machine had it")
        + "). "
        f"Ready: a host Triton 2.51 (nvidia-pytriton wheel) started on one python model "
        f"that imports torch from the environment, until `/v2/health/ready`; tarball and "
        f"directory starts alternate, medians of {args.runs}.", "",
        "| CUDA (release) | torch | tarball | unpacked | build | ready, tarball | "
        "ready, directory | extraction's share |",
        "|---|---|---|---|---|---|---|---|",
        *rows, "",
        "Each answer came from the environment's torch: "
        + "; ".join(f"{m.cuda}: `{m.answer}`" for m in results) + ".",
        "A tarball is extracted by the python backend at every server start (22.12 and 23.05 "
        "know no other way); a directory is used in place (r23.07 and later), so GPU releases "
        "that accept one get the environment unpacked in an image layer. No GPU here: a GPU "
        "machine adds CUDA initialisation, not extraction. Load average (1 min) when the run "
        f"began: {load_before:.1f}, when it ended: {os.getloadavg()[0]:.1f} (2 CPUs; the "
        "benchmark's own build keeps both busy). Build time: the interpreter copied out of the "
        "image, the packages installed in a container of it, the canonical archive written "
        "(gzip level 4) and read back whole by the check; the unpacked size is what the image's "
        "environment layer holds on a GPU release from 23.07 on.",
    ])
    publish(SECTION, section, write=not args.no_write)


def _measure(client, cuda: str, interpreter_image: str, runs: int,
             index: PackageIndex) -> Measured:
    release = resolve(cuda)
    plan = plan_python(release, options=BridgeOptions(interpreter_image=interpreter_image))
    with tempfile.TemporaryDirectory(prefix="bench-cuda-env-") as workdir:
        work = Path(workdir)
        built = build_pipeline_model(pipeline, work / "pipeline", format_priority=("onnx",),
                                     parallelism=1, target=release)
        started = time.monotonic()
        target = interpreter_target(client, interpreter_image, python_version=plan.python_version,
                                    triton_version=release.triton_version)
        libraries = (wheel_stub(plan.stub.requirement, plan.python_version).libraries
                     if plan.stub.kind == StubSource.WHEEL and plan.stub.requirement else ())
        spec = environment_spec(built, release, target.python_version,
                                [node.op for node in pipeline.nodes], EnvironmentOptions(
                                    requirements=tuple(EXTRA_REQUIREMENTS.get(cuda, []))))
        resolution = resolve_cuda_packages(spec, release, python_version=target.python_version,
                                           platforms=target.platform_tags(), index=index,
                                           pytorch_index=PYTORCH_INDEX, on_log=print)
        tarball = pack_environment(resolution.spec, target,
                                   packer=CarriedInterpreterPacker(libraries),
                                   index=resolution.index, cache=work / "environments",
                                   on_log=print)
        build_seconds = time.monotonic() - started
        repositories = {kind: _repository(work / kind, tarball, unpacked=kind == "directory")
                        for kind in ("tarball", "directory")}
        unpacked = repositories["directory"] / MODEL / "environment"
        sizes = [p.lstat().st_size for p in unpacked.rglob("*") if p.is_file()]
        ready: dict[str, list[float]] = {kind: [] for kind in repositories}
        answer = ""
        for _ in range(runs):
            for kind, repository in repositories.items():
                seconds, answer = _start_to_ready(repository)
                ready[kind].append(seconds)
                print(f"{cuda} {kind}: ready in {seconds:.1f} s")
        torch = next((c.requirement for c in resolution.choices), "no torch")
        return Measured(cuda, release.release, torch, tarball, build_seconds,
                        tarball.path.stat().st_size, sum(sizes), len(sizes), ready, answer)


def _repository(root: Path, tarball: EnvironmentTarball, *, unpacked: bool) -> Path:
    """One python model, ``benchmarks/environment_model.py``, given the environment."""
    model = root / MODEL
    (model / "1").mkdir(parents=True)
    shutil.copyfile(Path(__file__).with_name("environment_model.py"), model / "1" / "model.py")
    config = model_config_pb2.ModelConfig(name=MODEL, backend="python", max_batch_size=0)
    config.output.add(name="OUTPUT", data_type=model_config_pb2.TYPE_STRING, dims=[1])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    (model / "config.pbtxt").write_text(text_format.MessageToString(config))
    attach_environment(root, tarball, unpacked=unpacked)
    return root


def _start_to_ready(repository: Path) -> tuple[float, str]:
    """Seconds from starting the server to ``/v2/health/ready``, and the model's answer."""
    server = TritonServer(repository)
    started = time.monotonic()
    try:
        server.start(timeout=READY_TIMEOUT)
        seconds = time.monotonic() - started
        with httpclient.InferenceServerClient(server.http_url) as http:
            result = http.infer(MODEL, [], outputs=[httpclient.InferRequestedOutput("OUTPUT")])
        answer = np.asarray(result.as_numpy("OUTPUT")).reshape(-1)[0].decode().replace(
            f"{repository.parent}/", "")
    finally:
        server.close()
    return seconds, answer


if __name__ == "__main__":
    main()
