"""The slim GPU route: size, pushed size, cold build, rebuild after a code change, and
``docker run`` to ready, beside the NGC route; and where an environment's build time goes.

Two examples, built with ``slim=True``:

* ONNX — the text-embedding pipeline as it is (its encoder an ONNX model operator, served by the
  onnxruntime backend on onnxruntime-gpu), CUDA 12.6;
* torch — the same pipeline with the encoder in the ``python`` format (its torch module served by
  the python backend), CUDA 13.0: the builder's torch (2.13.0) has a CUDA 13.0 build on PyPI and
  none for 12.6 (PyTorch's own index, which may have one, is unreachable here).

Per example: ``--runs`` cold builds, each with an empty ``TRITON_BUILDER_CACHE``, pip without a
cache (every wheel from the package index), its own ``SOURCE_DATE_EPOCH`` and the previous run's
images removed (nothing cached anywhere); after the last, ``--runs`` rebuilds after a change to
the pooling operator's code; every build verified against the in-process pipeline (no GPU here:
on the CPU, as the build says). Then the image's size, its compressed size as pushed to a local
registry (``docker-registry``), and ``--runs`` starts from ``docker run`` to
``/v2/health/ready`` (with the verification's ``KIND_CPU`` configs mounted: Triton refuses
``KIND_GPU`` where there is no GPU). Medians throughout.

The NGC route cannot be built here (no NGC). Its size is the NGC image's published size plus
our layers: for the ONNX example those are measured by building it on the NGC route (24.10,
bridged from Python 3.11 through the wheel's stub) on the test bed's stand-in for an NGC image
(``triton-builder-test/cuda-12.4-release:1``, interpreter
``triton-builder-test/python-source:3.11-bullseye``), image size less the stand-in's; for the
torch example they are its environment layer as the slim image ships it (the same torch and CUDA
wheels) plus the bridged interpreter the ONNX one measured. The install step is measured with pip
(the packer's) and with uv on the ONNX example's wheels in a container of the slim base.

    python benchmarks/bench_slim_gpu.py [--runs 3] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report import machine, publish  # noqa: E402
from builder import build_docker_image, pipe  # noqa: E402
from builder.base.gpu_slim import build_slim_base  # noqa: E402
from builder.base.os_image import debian_os_image  # noqa: E402
from builder.base.releases import builder_python  # noqa: E402
from builder.engine import ensure_engine  # noqa: E402
from builder.verify.container import ServingContainer  # noqa: E402
from builder.verify.placement import cpu_config_mounts  # noqa: E402
from pipelines import text_embedding  # noqa: E402
from tests.support.engine_images import image_ids, remove_images_made  # noqa: E402
from tests.support.testbed import LocalRegistry  # noqa: E402

SECTION = "## Slim GPU images: size, build, start, beside the NGC route"
COMMAND = "python benchmarks/bench_slim_gpu.py"
IMAGE = "triton-builder-bench/slim-gpu"
NGC_PUBLISHED_GB = 15.5
"""``nvcr.io/nvidia/tritonserver:24.06-py3`` as pulled (triton-inference-server/server#7474): the
latest release whose size users published; no figure for 24.10 or 25.11 was found."""
NGC_STAND_IN = "triton-builder-test/cuda-12.4-release:1"
INTERPRETER_STAND_IN = "triton-builder-test/python-source:3.11-bullseye"
EXAMPLES = {"onnx": ("12.6", ("onnx",)), "torch": ("13.0", ("python",))}
GOALS_GB = {"onnx": 3.0, "torch": 7.0}


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
    return (pipe.input("text")
            .map("text", ("ids", "mask"), text_embedding.Tokenizer())
            .map(("ids", "mask"), "hidden", encoder)
            .map(("hidden", "mask"), "vec", Pool(epsilon))
            .output("vec")
            .with_example("hello world"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    client = ensure_engine()
    os_image = os.environ.get("TRITON_BUILDER_OS_IMAGE") or debian_os_image(client)
    os.environ["TRITON_BUILDER_OS_IMAGE"] = os_image
    os.environ["PIP_NO_CACHE_DIR"] = "1"
    base = client.images.get(build_slim_base(client, builder_python(), os_image=os_image).id)
    load_start = os.getloadavg()[0]
    quiet = lambda line: None  # noqa: E731
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-slim-") as workdir, \
            LocalRegistry(Path(tempfile.mkdtemp(prefix="bench-registry-"))) as registry:
        for name, (cuda, formats) in EXAMPLES.items():
            results[name] = _example(client, name, cuda, formats, args.runs,
                                     Path(workdir), registry, quiet)
        ngc_layers = _ngc_route_layers(client, quiet)
        install = _install_tools(client, base, Path(workdir))
    load_end = os.getloadavg()[0]
    base_gb = base.attrs["Size"] / 1e9
    lines = [SECTION, "",
             f"`{COMMAND} --runs {args.runs}` — {machine()}, no GPU; slim base "
             f"`{base.tags[0]}` ({base_gb:.2f} GB) on `{os_image}`. Load average (1 min): "
             f"{load_start:.1f} at the start, {load_end:.1f} at the end (the benchmark's own "
             f"builds). Medians of {args.runs}; every build verified against the "
             f"in-process pipeline (on the CPU: no GPU here).", "",
             "| example | CUDA | image | pushed (compressed) | goal | NGC route | slim / NGC | "
             "cold build | rebuild after a code change | `docker run` → ready |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, measured in results.items():
        ngc = NGC_PUBLISHED_GB + (ngc_layers["onnx"] if name == "onnx" else
                                  measured["environment_gb"] + ngc_layers["interpreter"])
        lines.append(
            f"| {name} ({', '.join(EXAMPLES[name][1])}) | {EXAMPLES[name][0]} | "
            f"{measured['image_gb']:.2f} GB | {measured['pushed_gb']:.2f} GB | "
            f"≤ {GOALS_GB[name]:.0f} GB and ≤ ⅓ of NGC | {ngc:.1f} GB | "
            f"{measured['image_gb'] / ngc:.2f} | {measured['cold_s']:.0f} s | "
            f"{measured['rebuild_s']:.1f} s | {measured['ready_s']:.1f} s |")
    lines += ["", "Where a cold build's environment time went (median seconds; wheels from the "
              "package index, pip without a cache):", "",
              "| example | wheels downloaded | download | install | pack | canonical | check "
              "| environment in the image (unpacked) |", "|---|---|---|---|---|---|---|---|"]
    for name, measured in results.items():
        steps = measured["steps"]
        lines.append(f"| {name} | {measured['downloaded_gb']:.2f} GB | "
                     + " | ".join(f"{steps.get(step, 0):.1f}" for step in
                                  ("download", "install", "pack", "canonical", "check"))
                     + f" | {measured['environment_gb']:.2f} GB |")
    lines += ["", f"Install step on the ONNX example's wheels ({install['wheels']}; the newest "
              f"cuDNN, as before the build pinned torch's), in a "
              f"container of the slim base, no network, medians of {install['runs']}: pip (the "
              f"packer's command) {install['pip']:.1f} s, uv {install['uv_version']} "
              f"{install['uv']:.1f} s.",
              "", f"NGC route: the NGC image's published size, {NGC_PUBLISHED_GB} GB "
              f"(24.06-py3, triton-inference-server/server#7474; no published figure for 24.10 "
              f"or 25.11 was found), plus our layers: ONNX example built on the NGC route "
              f"(24.10, bridged) on the stand-in `{NGC_STAND_IN}`: "
              f"{ngc_layers['onnx']:.2f} GB over the stand-in; torch example: its environment "
              f"as the slim image ships it plus the bridged interpreter that ONNX build carried "
              f"({ngc_layers['interpreter']:.2f} GB). The NGC route of the ONNX example needs no "
              f"onnxruntime-gpu (NGC's C++ backend), the slim route brings it and the CUDA "
              f"libraries."]
    publish(SECTION, "\n".join(lines) + "\n", write=not args.no_write)


def _example(client, name: str, cuda: str, formats: tuple[str, ...], runs: int,
             workdir: Path, registry: LocalRegistry, quiet) -> dict:
    reference = f"{IMAGE}-{name}:{cuda}"
    before = image_ids(client)
    cold, steps, downloaded = [], [], []
    for run in range(runs):
        remove_images_made(client, before, (reference,))
        os.environ["TRITON_BUILDER_CACHE"] = str(workdir / f"{name}-cache-{run}")
        os.environ["SOURCE_DATE_EPOCH"] = str(1_764_028_800 + run)
        started = time.monotonic()
        _build(client, pipeline(1e-12), reference, cuda, formats, quiet)
        cold.append(time.monotonic() - started)
        (made,) = (workdir / f"{name}-cache-{run}" / "environments").glob("*/environment.json")
        environment = json.loads(made.read_text())
        steps.append(environment["steps"])
        downloaded.append(environment["downloaded_bytes"])
        if run < runs - 1:  # gigabytes each; the last one serves the rebuilds
            shutil.rmtree(workdir / f"{name}-cache-{run}")
    rebuilds = []
    for run in range(runs):
        started = time.monotonic()
        _build(client, pipeline(1e-9 * (run + 1)), reference, cuda, formats, quiet)
        rebuilds.append(time.monotonic() - started)
    image = client.images.get(reference)
    environment_gb = _environment_layer_gb(client, image)
    pushed = _pushed_gb(client, reference, registry)
    ready = [_ready_seconds(client, reference, workdir / f"{name}-configs") for _ in range(runs)]
    remove_images_made(client, before, (reference,))
    return {"cold_s": statistics.median(cold), "rebuild_s": statistics.median(rebuilds),
            "image_gb": image.attrs["Size"] / 1e9, "pushed_gb": pushed,
            "ready_s": statistics.median(ready), "environment_gb": environment_gb,
            "downloaded_gb": statistics.median(downloaded) / 1e9,
            "steps": {step: statistics.median(s[step] for s in steps) for step in steps[0]}}


def _build(client, pipe_, reference: str, cuda: str, formats: tuple[str, ...], quiet) -> None:
    """A verified slim build; once more if another job's clean-up on the shared engine removed
    a layer the legacy builder was building on ("unknown parent image ID", seen here)."""
    from builder.engine.image_build import ImageBuildError

    for attempt in (1, 2):
        try:
            build_docker_image(pipe_, reference, cuda=cuda, slim=True, format_priority=formats,
                               client=client, on_log=quiet)
            return
        except ImageBuildError as error:
            if attempt == 2 or "unknown parent image ID" not in str(error):
                raise
            print(f"retrying {reference}: {str(error).splitlines()[0]}", flush=True)


def _environment_layer_gb(client, image) -> float:
    """The size of the image's largest layer: the environment's (``COPY environment/ /``)."""
    return max(entry["Size"] for entry in client.api.history(image.id)) / 1e9


def _pushed_gb(client, reference: str, registry: LocalRegistry) -> float:
    """The compressed bytes the registry holds for the image: its manifest's layers and config."""
    from builder.push import push_image

    target = f"{registry.host}/{reference.split('/', 1)[1]}"
    client.images.get(reference).tag(target)
    try:
        push_image(client, target)
        name, tag = target.split("/", 1)[1].rsplit(":", 1)
        request = urllib.request.Request(
            f"http://{registry.host}/v2/{name}/manifests/{tag}",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            manifest = json.load(response)
    finally:
        client.images.remove(target)
    return (manifest["config"]["size"] + sum(layer["size"] for layer in manifest["layers"])) / 1e9


def _ready_seconds(client, reference: str, configs: Path) -> float:
    """From ``docker run`` to ``/v2/health/ready``, with ``KIND_CPU`` configs mounted as the
    build's verification mounts them (Triton refuses ``KIND_GPU`` without a GPU)."""
    repository = configs / "repository"
    models = client.containers.run(reference, ["ls", "/models"], entrypoint=[], remove=True)
    names = models.decode().split()
    for model in names:
        text = client.containers.run(reference, ["cat", f"/models/{model}/config.pbtxt"],
                                     entrypoint=[], remove=True)
        (repository / model).mkdir(parents=True, exist_ok=True)
        (repository / model / "config.pbtxt").write_bytes(text)
    volumes = cpu_config_mounts(repository, names, configs / "cpu", "/models")
    started = time.monotonic()
    with ServingContainer(client, reference, volumes=volumes) as _:
        return time.monotonic() - started


def _ngc_route_layers(client, quiet) -> dict:
    """Our layers of the ONNX example on the NGC route (24.10 bridged), on the stand-in."""
    reference = f"{IMAGE}-ngc-route:12.6"
    before = image_ids(client)
    os.environ.pop("SOURCE_DATE_EPOCH", None)
    os.environ["TRITON_BUILDER_CACHE"] = tempfile.mkdtemp(prefix="bench-ngc-route-")
    build_docker_image(pipeline(1e-12), reference, cuda="12.6", base_image=NGC_STAND_IN,
                       interpreter_image=INTERPRETER_STAND_IN, verify=False, client=client,
                       on_log=quiet)
    image, stand_in = client.images.get(reference), client.images.get(NGC_STAND_IN)
    interpreter = client.containers.run(
        reference, ["sh", "-c", "du -sb $(dirname $(find /models -path '*/bin/python3*' "
                                "-type f | head -1))/../lib/python3.11 | cut -f1"],
        entrypoint=[], remove=True)
    layers = (image.attrs["Size"] - stand_in.attrs["Size"]) / 1e9
    remove_images_made(client, before, (reference,))  # the stand-in, older, stays
    return {"onnx": layers, "interpreter": int(interpreter.decode().split()[0]) / 1e9}


def _install_tools(client, base, workdir: Path, runs: int = 3) -> dict:
    """pip (as the packer runs it) against uv installing the ONNX example's wheels into a venv,
    in a container of the slim base with the wheels and uv's binary mounted."""
    from builder.environment.index import PackageIndex
    from builder.environment.packers import fetch_wheels, pip_wheel
    from builder.environment.spec import requirements_spec
    from builder.environment.target import image_target

    target = image_target(client, base.tags[0])
    spec = requirements_spec(["onnxruntime-gpu[cuda,cudnn]==1.26.0", "numpy==1.26.4",
                              "cuda-toolkit[cublas,cudart,cufft,curand,nvjitlink,nvrtc]==12.6.*"],
                             "benchmark")
    work = (workdir / "install").resolve()
    work.mkdir()
    requirements, constraints, wheels = fetch_wheels(spec, target, work, PackageIndex(),
                                                     lambda line: None)
    uv_dir = work / "uv"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_17_x86_64", "--python-version", "3.11", "uv",
                    "-d", str(uv_dir), "-q"], check=True)
    (uv_wheel,) = uv_dir.glob("uv-*.whl")
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(uv_wheel), str(uv_dir)],
                   check=True)
    (uv,) = uv_dir.glob("uv-*.data/scripts/uv")
    uv.chmod(0o755)
    pip = pip_wheel(wheels) / "pip"
    times: dict[str, list[float]] = {"pip": [], "uv": []}
    for run in range(runs):
        for tool in ("pip", "uv"):
            venv = work / f"venv-{tool}-{run}"
            python = venv / "bin" / "python"
            create = [target.python_executable, "-m", "venv", "--without-pip", str(venv)]
            if tool == "pip":
                install = [str(python), str(pip), "install", "--no-index", "--find-links",
                           str(wheels), "--no-compile", "--no-cache-dir",
                           "--disable-pip-version-check", "-r", str(requirements),
                           "-c", str(constraints)]
            else:
                install = [str(uv), "pip", "install", "--python", str(python), "--no-index",
                           "--find-links", str(wheels), "--cache-dir",
                           str(work / f"uv-cache-{run}"), "-r", str(requirements),
                           "-c", str(constraints)]
            script = (f"{shlex.join(create)} && s=$(date +%s.%N) && {shlex.join(install)} "
                      f">/dev/null && e=$(date +%s.%N) && echo \"$s $e\"")
            output = target.run(["/bin/sh", "-c", script], what=f"install with {tool}",
                                binds=[work], env={"HOME": "/tmp"})
            start, end = (float(x) for x in output.split()[-2:])
            times[tool].append(end - start)
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True).stdout
    return {"pip": statistics.median(times["pip"]), "uv": statistics.median(times["uv"]),
            "runs": runs, "uv_version": version.split()[1] if version else "?",
            "wheels": f"{sum(w.stat().st_size for w in wheels.glob('*.whl')) / 1e9:.2f} GB"}


if __name__ == "__main__":
    main()
