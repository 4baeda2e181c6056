"""NVIDIA Triton Model Analyzer, run on a model repository: the tuner we compare ours with.

Why this module: ``benchmarks/bench_tune.py`` compares our tuner with Model Analyzer's "quick
search with the composing models listed" on the same repository and latency budget. This runs
``model-analyzer profile`` (local launch mode, ``--run-config-search-mode quick``) and reads its
results back: the best measured configuration whose p99 is within the budget, its req/s, and
how long the search took.

What Model Analyzer needs here (triton-model-analyzer 1.58.0):

* Its own virtual environment (``.nox/model-analyzer``, made on first use): it pins
  ``tritonclient`` 2.73 and installs a placeholder ``perf_analyzer`` package without a binary.
* A ``perf_analyzer`` binary: ours (:func:`builder.tune.perf_analyzer.perf_analyzer`, from the
  ``tritonclient`` 2.51.0 wheel), passed as ``perf_analyzer_path`` through a small wrapper
  script that puts its libraries (``libcudart.so.12``, ``libb64.so.0d``) on
  ``LD_LIBRARY_PATH``: Model Analyzer runs perf_analyzer with ``triton_server_environment``,
  so the server's ``LD_LIBRARY_PATH`` replaces any set for Model Analyzer itself.
* A ``tritonserver`` (the ``nvidia-pytriton`` wheel's, ``triton_server_path``) started with a
  ``--backend-directory`` holding the python backend stub for the Python running this module
  (``triton_server_flags``) and the environment :class:`~builder.tritonserver.host_process.
  TritonServer` gives it (``triton_server_environment``: ``LD_LIBRARY_PATH`` for the server's
  libraries and ``libpython``, this interpreter's directory first on ``PATH`` so the stub's
  embedded Python sees this environment's packages).
* Real input data (``perf_analyzer_flags: input-data``): pipelines decode their input, and
  perf_analyzer's random bytes fail them (MA#680, MA#857).
* Free ports (its defaults are 8000-8002) and a fresh checkpoint directory (it resumes from a
  checkpoint it finds, measuring nothing).

In local mode Model Analyzer serves the *original* repository with explicit model control and
loads each candidate configuration as a config override under the model's own name, so our
pipeline model finds its in-process ONNX files beside it as usual. On a machine without a GPU
(no CUDA for numba) it marks the profiled model ``cpu_only`` and searches ``KIND_CPU``
instances, but not the BLS composing models: those are listed in ``cpu_only_composing_models``
here (on any machine without a GPU, and where their config asks for ``KIND_CPU`` instances);
likewise the pipeline model, whose config asks for CPU instances, is marked ``cpu_only`` on a
GPU machine.

What its results mean (read from its checkpoint, which holds every measurement; its summary
reports are skipped, so ``search_s`` is the search: pass ``extra_config={"skip_summary_reports":
False}`` for its ``results/results/metrics-model-inference.csv``):

* The quick search hill-climbs over max_batch_size (powers of two), instance count (each model,
  composing ones included) with dynamic batching on, measuring each candidate at one
  concurrency, ``2 x max_batch_size x instances`` (clamped to ``run_config_search_max_
  concurrency`` only where that is set; the default config is measured at ``2 x its
  max_batch_size x instances`` unclamped, 128 for ours). Then it sweeps concurrency 1, 2, 4, ...
  for the top 3 configs and the default, stopping when req/s gains under 5% over 4 steps, with
  a binary search where the p99 constraint starts failing. It restarts tritonserver for every
  config.
* Each measurement is one perf_analyzer run: closed loop at a fixed concurrency, batch 1,
  ``count_windows`` mode (windows of at least 50-150 requests until 3 agree within 10%); p99 is
  perf_analyzer's client-side p99 latency over those windows; req/s its client throughput.
* The constraint only labels measurements (``Satisfies Constraints``); the search still
  measures configs beyond it. The best result here is the highest req/s among measurements
  with p99 <= budget, which is what its summary ranks first.
* With BLS composing models it files results under the top-level variant only, and keeps one
  run config per top-level variant (its report shows ``pipeline_config_3`` whatever composing
  variant ran); the composing variants of each measurement are read from its key here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from builder.tritonserver.host_process import _server_environment, free_ports  # noqa: E402
from builder.tritonserver.wheel import triton_distribution  # noqa: E402
from builder.tune.perf_analyzer import perf_analyzer  # noqa: E402

MODEL_ANALYZER = "triton-model-analyzer==1.58.0"
VENV = ROOT / ".nox" / "model-analyzer"


STALL_S = 180.0
"""Seen here: the quick search, its candidates all measured, may loop without end proposing
them again ("Existing measurement found for run config. Skipping profile", hundreds of MB of
log) and measure nothing more. A search that has saved no checkpoint for this long while its
log grows is stopped, and what it measured is read; its search time is then the time to its
last measurement."""


class ModelAnalyzerError(RuntimeError):
    """``model-analyzer profile`` failed or left no results; the message ends with its log."""


@dataclass(frozen=True)
class AnalyzerResult:
    rate: float            # req/s of its best config within the budget (0.0 if none)
    p99_ms: float
    concurrency: int
    config: dict           # the best model config's key settings per model
    search_s: float        # wall time of `model-analyzer profile`
    configs_measured: int  # how many model configs it measured (combinations with composing)
    measurements: int = 0  # how many perf_analyzer measurements (configs x concurrencies)
    finished: bool = True  # False: it stalled (see STALL_S) and was stopped


def model_analyzer_venv(venv: Path = VENV) -> Path:
    """The ``model-analyzer`` executable of ``venv``, installed there first if missing."""
    executable = venv / "bin" / "model-analyzer"
    if executable.exists():
        return executable
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    MODEL_ANALYZER], check=True)
    return executable


def profile_config(model_repository: Path, pipeline_model: str, composing_models: list[str],
                   latency_budget_ms: float, input_data: Path, workdir: Path,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Model Analyzer's YAML config (as a dict) for a quick search of ``pipeline_model``; also
    writes the backend directory into ``workdir``. ``extra`` overrides or adds options (e.g.
    ``run_config_search_max_concurrency`` to bound a smoke run)."""
    distribution = triton_distribution()
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    backends = distribution.backend_directory(workdir / "backends", python_version)
    server_env = _server_environment(distribution, {}, (backends / "python",))
    http, grpc, metrics = free_ports(3)
    gpu = has_gpu()
    config: dict[str, Any] = {
        "model_repository": str(model_repository.resolve()),
        "profile_models": {pipeline_model: {"cpu_only": True}} if cpu_only(
            model_repository, pipeline_model, gpu) else [pipeline_model],
        "run_config_search_mode": "quick",
        "triton_launch_mode": "local",
        "triton_server_path": str(distribution.tritonserver),
        "triton_server_flags": {"backend-directory": str(backends)},
        "triton_server_environment": {key: server_env[key]
                                      for key in ("LD_LIBRARY_PATH", "PATH")},
        "triton_output_path": str(workdir / "tritonserver.log"),
        "triton_http_endpoint": f"localhost:{http}",
        "triton_grpc_endpoint": f"localhost:{grpc}",
        "triton_metrics_url": f"http://localhost:{metrics}/metrics",
        "perf_analyzer_path": str(_perf_analyzer_wrapper(workdir / "bin")),
        "perf_analyzer_flags": {"input-data": str(input_data.resolve())},
        "perf_output": True,
        "perf_output_path": str(workdir / "perf_analyzer.log"),
        "objectives": {"perf_throughput": 10},
        "constraints": {"perf_latency_p99": {"max": float(latency_budget_ms)}},
        "output_model_repository_path": str(workdir / "output_model_repository"),
        "override_output_model_repository": True,
        "checkpoint_directory": str(workdir / "checkpoints"),
        "export_path": str(workdir / "results"),
        "skip_summary_reports": True,
        "skip_detailed_reports": True,
    }
    if composing_models:
        config["bls_composing_models"] = list(composing_models)
        cpu = [name for name in composing_models if cpu_only(model_repository, name, gpu)]
        if cpu:
            config["cpu_only_composing_models"] = cpu
    config.update(extra or {})
    return config


def has_gpu() -> bool:
    """Whether ``nvidia-smi`` lists a GPU here."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listing.returncode == 0 and "GPU" in listing.stdout


def cpu_only(model_repository: Path, model: str, gpu: bool) -> bool:
    """Whether Model Analyzer must search ``model`` with ``KIND_CPU`` instances: no GPU here, or
    its config asks for CPU instances only. Model Analyzer itself marks only the profiled
    models CPU-only when it finds no GPU; composing models it searches as ``KIND_GPU``, which
    fail to load on such a machine (then its quick search stops after the default config)."""
    if not gpu:
        return True
    path = model_repository / model / "config.pbtxt"
    text = path.read_text() if path.exists() else ""
    return set(re.findall(r"\bkind\s*:\s*(KIND_\w+)", text)) == {"KIND_CPU"}


def _perf_analyzer_wrapper(directory: Path) -> Path:
    """A ``perf_analyzer`` script that runs ours with its libraries found (``exec``: the
    process Model Analyzer watches is perf_analyzer itself)."""
    analyzer = perf_analyzer()
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / "perf_analyzer"
    libraries = os.pathsep.join(str(d) for d in analyzer.library_dirs)
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export LD_LIBRARY_PATH={shlex.quote(libraries)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
        f"exec {shlex.quote(str(analyzer.path))} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def run_model_analyzer(model_repository: Path, pipeline_model: str, composing_models: list[str],
                       latency_budget_ms: float, input_data: Path, workdir: Path, *,
                       timeout_s: float = 1800,
                       extra_config: dict[str, Any] | None = None) -> AnalyzerResult:
    """Run Model Analyzer's quick search on ``pipeline_model`` (BLS ``composing_models``
    listed) under a p99 ``latency_budget_ms``; the best measurement within the budget.

    ``extra_config`` adds Model Analyzer options (bounds for a smoke run); the defaults are its
    quick-search defaults."""
    executable = model_analyzer_venv()
    workdir = Path(workdir).resolve()
    shutil.rmtree(workdir / "checkpoints", ignore_errors=True)
    shutil.rmtree(workdir / "results", ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    config = profile_config(Path(model_repository), pipeline_model, composing_models,
                            latency_budget_ms, Path(input_data), workdir, extra_config)
    config_path = workdir / "config.yaml"
    config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(workdir / "bin"), env.get("PATH", "")])
    log_path = workdir / "model_analyzer.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(executable), "profile", "-f", str(config_path)],
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env,
            start_new_session=True)
        try:
            finished, search_s = _wait(process, workdir, log_path, started, timeout_s)
        except BaseException:
            _kill_tree(process)
            raise
    if finished and process.returncode != 0:
        raise ModelAnalyzerError(f"model-analyzer profile exited {process.returncode}:\n"
                                 f"{_tail(log_path)}")
    result = _best_result(workdir, config, pipeline_model, latency_budget_ms, search_s)
    return result if finished else replace(result, finished=False)


def _wait(process: subprocess.Popen, workdir: Path, log_path: Path, started: float,
          timeout_s: float) -> tuple[bool, float]:
    """Wait for Model Analyzer: (whether it ended by itself, its search time). A search that
    stalls (:data:`STALL_S`) is stopped; its time is then up to its last checkpoint."""
    while True:
        try:
            process.wait(5)
            return True, time.monotonic() - started
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now - started > timeout_s:
            _kill_tree(process)
            raise ModelAnalyzerError(f"model-analyzer profile ran past {timeout_s:.0f}s:\n"
                                     f"{_tail(log_path)}") from None
        saved = [p.stat().st_mtime for p in (workdir / "checkpoints").glob("*.ckpt")]
        if saved and time.time() - max(saved) > STALL_S and log_path.stat().st_size > 50e6:
            _kill_tree(process)
            return False, max(saved) - (time.time() - (now - started))


def _kill_tree(process: subprocess.Popen) -> None:
    """Model Analyzer and what it started: it starts tritonserver and perf_analyzer in their
    own sessions, so they are found as its descendants (``/proc``), not by process group."""
    pids = [process.pid, *_descendants(process.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            process.poll()  # reaps Model Analyzer once it exits
            time.sleep(0.2)
        if not any(_alive(pid) for pid in pids):
            break
    process.wait()


def _descendants(root: int) -> list[int]:
    """The processes below ``root``, from ``/proc/*/stat`` parent ids."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it only waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _tail(path: Path, lines: int = 60) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def _best_result(workdir: Path, config: dict, pipeline_model: str, budget_ms: float,
                 search_s: float) -> AnalyzerResult:
    """The measurement with the most req/s whose p99 is within ``budget_ms`` (ties: the lower
    p99), read from Model Analyzer's checkpoint: it holds every measurement with its model
    configs (the summary CSV holds only the ones its report keeps)."""
    checkpoint = Path(config["checkpoint_directory"]) / "0.ckpt"
    if not checkpoint.exists():
        raise ModelAnalyzerError(f"model-analyzer profile left no checkpoint {checkpoint}:\n"
                                 f"{_tail(workdir / 'model_analyzer.log')}")
    rows = measurements(checkpoint, pipeline_model)
    if not rows:
        raise ModelAnalyzerError(f"model-analyzer measured nothing for {pipeline_model!r}:\n"
                                 f"{_tail(workdir / 'model_analyzer.log')}")
    configs = len({row["variant"] for row in rows})
    within = [row for row in rows if row["p99_ms"] <= budget_ms]
    if not within:
        return AnalyzerResult(0.0, 0.0, 0, {}, search_s, configs, len(rows))
    best = max(within, key=lambda row: (row["rate"], -row["p99_ms"]))
    return AnalyzerResult(best["rate"], best["p99_ms"], best["concurrency"], best["config"],
                          search_s, configs, len(rows))


def measurements(checkpoint: Path, pipeline_model: str) -> list[dict]:
    """Every measurement of ``pipeline_model`` in a Model Analyzer checkpoint: ``variant`` (the
    measured combination of model config variants, e.g. ``pipeline_config_3`` or, with BLS
    composing models, ``pipeline_config_3+image_classifier_config_4``), concurrency, req/s, p99
    (ms: perf_analyzer's client-side p99) and the key settings of each model's config.

    Model Analyzer files its results under the top-level variant only and keeps one run config
    per top-level variant; which composing variants a measurement ran with is only in its key
    (the run config's representation ends with their names), so it is read from there."""
    state = json.loads(checkpoint.read_text())
    results = state["ResultManager.results"]["_results"].get(pipeline_model, {})
    variants: dict[str, dict] = {}  # variant name -> its model config
    for run_config, _ in results.values():
        for model_run in run_config["_model_run_configs"]:
            for variant in (model_run["_model_config_variant"],
                            *model_run.get("_composing_config_variants", [])):
                variants[variant["variant_name"]] = variant["model_config"]
    names = state.get("ModelManager.model_variant_name_manager", {})
    variants.update(names.get("_model_config_dicts", {}))
    rows = []
    for run_config, by_key in results.values():
        for key, measurement in by_key.items():
            runs = run_config["_model_run_configs"]
            top = measurement["_model_variants_name"].split(",")
            composing = [c["variant_name"] for run in runs
                         for c in run.get("_composing_config_variants", [])]
            if composing:
                named = key.rsplit(" ", 1)[-1].split(",")
                if all(name in variants for name in named):
                    composing = named
            combination = [*top, *composing]
            settings = {variants[name].get("name", name): {"variant": name,
                                                           **key_settings(variants[name])}
                        for name in combination if name in variants}
            for model in measurement["_model_config_measurements"]:
                data = {tag: value["_value"] for tag, value in model["_non_gpu_data"]}
                if "perf_throughput" not in data or "perf_latency_p99" not in data:
                    continue
                rows.append({"variant": "+".join(combination),
                             "concurrency": int(model["_model_specific_pa_params"]
                                                ["concurrency-range"] or 0),
                             "rate": float(data["perf_throughput"]),
                             "p99_ms": float(data["perf_latency_p99"]),
                             "config": settings})
    return rows


def key_settings(model_config: dict) -> dict:
    """Instance count and kind, max_batch_size and dynamic batching of one model config, as
    Model Analyzer records it (protobuf JSON, camelCase or snake_case keys, 64-bit numbers as
    strings)."""
    def field(snake: str, camel: str) -> Any:
        return model_config.get(snake, model_config.get(camel))

    groups = field("instance_group", "instanceGroup") or []
    batching = field("dynamic_batching", "dynamicBatching")
    return {
        "instance_count": sum(int(group.get("count", 1)) for group in groups) or 1,
        "kind": ",".join(sorted({group.get("kind", "KIND_AUTO") for group in groups})) or None,
        "max_batch_size": int(field("max_batch_size", "maxBatchSize") or 0),
        "dynamic_batching": None if batching is None else {
            key: (int(value) if isinstance(value, str) and value.isdigit() else value)
            for key, value in batching.items()},
    }


def main() -> None:
    """Smoke run: Model Analyzer on the image example (in-process ONNX, no composing model)."""
    import argparse
    import tempfile

    from builder import build_pipeline_model
    from builder.tune.perf_analyzer import write_input_data
    from pipelines import image_classification as example

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--budget-ms", type=float, default=50.0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--full", action="store_true",
                        help="Model Analyzer's own search bounds, not the smoke run's")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="model-analyzer-"))
    build_pipeline_model(example.pipeline, workdir / "models")
    write_input_data(example.pipeline.signature(), example.pipeline.examples,
                     workdir / "input.json")
    bounds = {} if args.full else {"run_config_search_max_concurrency": 8,
                                   "run_config_search_max_instance_count": 2,
                                   "run_config_search_max_model_batch_size": 8}
    result = run_model_analyzer(workdir / "models", "pipeline", [], args.budget_ms,
                                workdir / "input.json", workdir / "analyzer",
                                extra_config=bounds)
    print(json.dumps(result.__dict__, indent=2))
    print(f"logs: {workdir / 'analyzer'}")


if __name__ == "__main__":
    main()
