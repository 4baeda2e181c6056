"""NVIDIA perf_analyzer: located or fetched, run at one load, its report parsed.

Why perf_analyzer: it is the load generator Triton's own tools (Model Analyzer) trust; in C++,
it leaves a small machine's cores to the server it measures. Why fetched: only the
``tritonclient`` 2.51.0 wheel carries it, and it needs libraries a host rarely has
(``libcudart.so.12``, ``libb64.so.0d``), unpacked beside it in the cache, not installed. Why
real input data: pipelines decode their input, and perf_analyzer's random bytes make them fail
(Model Analyzer MA#680, MA#857); :func:`write_input_data` sends the pipeline's own examples.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from builder.cache import DownloadError, cache_dir, cached_download, staged
from builder.errors import InputError, TritonBuilderError
from builder.pipeline.signature import PipelineSignature

VERSION = "2.51.0"
"""The last ``tritonclient`` wheel that carries ``perf_analyzer`` (Triton 2.51, NGC 24.10)."""
BINARY = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
CUDART = "nvidia-cuda-runtime-cu12==12.4.127"
"""Any CUDA 12 runtime gives ``libcudart.so.12``; torch's, which the cache often holds already."""
PLATFORMS = {"x86_64": ("manylinux1_x86_64", "manylinux2014_x86_64"),
             "aarch64": ("manylinux2014_aarch64",)}
"""pip ``--platform`` tags, by ``platform.machine()``: tritonclient 2.51.0's x86_64 wheel is
tagged ``manylinux1``, its aarch64 one and the CUDA runtime's ``manylinux2014``."""
ENV = "TRITON_BUILDER_PERF_ANALYZER"
MEASUREMENT_MS = 1000
"""perf_analyzer's measurement window for a search: a load is reported once three windows agree,
so each load measured costs three of them and perf_analyzer's start. One second is where
perf_analyzer's own count windows begin, and Model Analyzer measures with those; the p99 of three
holds a hundred requests at the slowest load tuned here (45 req/s, the model-bound stand-in's
one in flight). Longer windows steady a comparison (``benchmarks/bench_tune.py``'s turns use
two seconds), but they cost a search the settings it would have tried."""


class PerfAnalyzerError(TritonBuilderError, RuntimeError):
    """perf_analyzer could not be fetched, does not run here, or a measurement failed; the
    message names what failed and ends with the tail of perf_analyzer's output."""


@dataclass(frozen=True)
class PerfAnalyzer:
    """A runnable perf_analyzer: the binary and the directories its libraries are found in."""

    path: Path
    library_dirs: tuple[Path, ...] = ()

    def environment(self) -> dict[str, str]:
        """``os.environ`` with :attr:`library_dirs` first on ``LD_LIBRARY_PATH``: the libraries
        were unpacked into the cache, not installed where the loader looks."""
        paths = [str(d) for d in self.library_dirs]
        if os.environ.get("LD_LIBRARY_PATH"):
            paths.append(os.environ["LD_LIBRARY_PATH"])
        return dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(paths))


def perf_analyzer() -> PerfAnalyzer:
    """A perf_analyzer that runs here: ``$TRITON_BUILDER_PERF_ANALYZER`` (a path to the binary),
    else the one unpacked in ``cache_dir("perf-analyzer")`` earlier, else fetched there first
    (the tritonclient wheel's binary, ``libcudart.so.12`` from the CUDA runtime wheel,
    ``libb64.so.0d`` from Debian's ``libb64-0d`` unless the system has it). Checked by running
    ``perf_analyzer --version``; what does not load is named."""
    given = os.environ.get(ENV)
    if given:
        return _checked(PerfAnalyzer(Path(given)))
    machine = platform.machine()
    if machine not in PLATFORMS:
        raise PerfAnalyzerError(f"tritonclient {VERSION} has no perf_analyzer for {machine}; "
                                f"set {ENV} to a perf_analyzer binary")
    root = cache_dir("perf-analyzer") / f"{VERSION}-{machine}"
    if not root.exists():
        _unpack(root, machine)
    return _checked(PerfAnalyzer(root / "bin" / "perf_analyzer", (root / "lib",)))


def _unpack(root: Path, machine: str) -> None:
    """Fetch into a temporary directory beside ``root`` and rename it: an interrupted fetch
    leaves no ``root``, and two fetching at once both end with a whole one."""
    options = ["--only-binary=:all:",
               *(a for tag in PLATFORMS[machine] for a in ("--platform", tag))]
    try:
        client = cached_download(f"tritonclient=={VERSION}", "wheels",
                                 f"tritonclient-{VERSION}-*_{machine}.whl", *options)
        cudart = cached_download(CUDART, "wheels",
                                 f"nvidia_cuda_runtime_cu12-{CUDART.split('==')[1]}-*_{machine}*.whl",
                                 *options)
    except DownloadError as error:
        raise PerfAnalyzerError(f"could not download perf_analyzer's wheels:\n{error.output}\n"
                                f"set {ENV} to a perf_analyzer binary") from error
    with staged(root, Path.exists) as staging:
        for part in ("bin", "lib"):
            (staging / part).mkdir()
        _extract(client, BINARY, staging / "bin" / "perf_analyzer").chmod(0o755)
        _extract(cudart, "nvidia/cuda_runtime/lib/libcudart.so.12",
                 staging / "lib" / "libcudart.so.12")
        if not _system_has("libb64.so.0d"):
            _fetch_libb64(staging / "lib")


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    """One member of a wheel, written to ``dest``."""
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, \
            open(dest, "wb") as out:
        shutil.copyfileobj(source, out)
    return dest


def _system_has(library: str) -> bool:
    """Whether the system's dynamic loader resolves ``library`` already (its ``ldconfig``
    cache): then nothing need be fetched for it."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    return any(line.strip().startswith(library + " ") for line in listing.splitlines())


def _fetch_libb64(lib: Path) -> None:
    """Debian's ``libb64-0d``, downloaded and unpacked without installing it into the system."""
    with tempfile.TemporaryDirectory() as work:
        os.chmod(work, 0o777)  # apt-get downloads as its _apt user where it can
        try:
            for command in (["apt-get", "download", "-qq", "libb64-0d"],
                            ["sh", "-c", "dpkg-deb -x libb64-0d_*.deb unpacked"]):
                subprocess.run(command, cwd=work, check=True, capture_output=True, text=True)
            (found,) = Path(work, "unpacked").glob("usr/lib/*/libb64.so.0d")
        except (OSError, ValueError, subprocess.CalledProcessError) as error:
            why = getattr(error, "stderr", "") or error
            raise PerfAnalyzerError(f"perf_analyzer needs libb64.so.0d, which could not be "
                                    f"downloaded ({why}): `apt-get install libb64-0d`") from error
        shutil.copy2(found, lib / found.name)


def _checked(analyzer: PerfAnalyzer) -> PerfAnalyzer:
    """``analyzer`` if ``perf_analyzer --version`` runs; else an error naming the libraries the
    loader did not find (``ldd``)."""
    try:
        run = subprocess.run([str(analyzer.path), "--version"], capture_output=True, text=True,
                             env=analyzer.environment(), timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PerfAnalyzerError(f"{analyzer.path} does not run: {error}") from error
    if run.returncode == 0:
        return analyzer
    ldd = subprocess.run(["ldd", str(analyzer.path)], capture_output=True, text=True,
                         env=analyzer.environment())
    found = re.findall(r"^\s*(\S+) => not found", ldd.stdout, re.MULTILINE)
    missing = f": missing {', '.join(found)}" if found else ""
    raise PerfAnalyzerError(f"{analyzer.path} does not run{missing} (exit status "
                            f"{run.returncode}):\n{_tail(run.stdout + run.stderr)}")


def write_input_data(signature: PipelineSignature, examples: Sequence[tuple], path: Path) -> Path:
    """Write perf_analyzer's ``--input-data`` JSON to ``path``: one entry per example call, so
    that the server decodes real inputs rather than random bytes (MA#680, MA#857).

    Each tensor is one call's ``[1, *dims]`` encoding without the batch axis, as
    ``{"content": ..., "shape": dims}``: numbers flattened; text a list of strings; bytes that
    are not UTF-8 (or hold a NUL, where perf_analyzer cuts a string), and FP16, as
    ``{"b64": ...}`` of Triton's wire bytes (each element length-prefixed, as perf_analyzer's
    input-data documentation requires of a ``b64`` STRING tensor)."""
    if not examples:
        raise InputError("the pipeline has no examples: perf_analyzer would send random bytes; "
                         "give it one with .with_example(...)")
    data = [{name: _tensor(spec.encode_batch([value])[0])
             for (name, spec), value in zip(signature.inputs.items(), example, strict=True)}
            for example in examples]
    path = Path(path)
    path.write_text(json.dumps({"data": data}))
    return path


def _tensor(array: np.ndarray) -> dict:
    shape = list(array.shape)
    if array.dtype == object:
        elements = [bytes(e) for e in array.reshape(-1)]
        try:
            if not any(b"\0" in e for e in elements):
                return {"content": [e.decode("utf-8") for e in elements], "shape": shape}
        except UnicodeDecodeError:
            pass
        wire = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    elif array.dtype == np.float16:  # perf_analyzer reads no FP16 from JSON numbers
        wire = array.astype("<f2").tobytes()
    else:
        return {"content": array.reshape(-1).tolist(), "shape": shape}
    return {"content": {"b64": base64.b64encode(wire).decode("ascii")}, "shape": shape}


@dataclass(frozen=True)
class LoadPoint:
    """What one closed-loop measurement found: throughput and latency at one concurrency."""

    concurrency: int
    rate: float
    """Inferences per second."""
    p50_ms: float
    p99_ms: float
    """Latencies to the answer; for a stream, to its first response."""
    requests: int
    """The requests perf_analyzer counted in the measurement it reports."""


def measure_load(analyzer: PerfAnalyzer, grpc_url: str, model: str, input_data: Path,
                 concurrency: int, *, measurement_ms: int = MEASUREMENT_MS,
                 stability_percent: int = 25, max_trials: int = 6, timeout_s: float = 120.0,
                 streaming: bool = False) -> LoadPoint:
    """Measure ``model`` at ``grpc_url`` with ``concurrency`` requests always in flight (a closed
    loop) until perf_analyzer's windows agree within ``stability_percent``; the data sent is
    ``input_data`` (:func:`write_input_data`). A failed run, a run past ``timeout_s`` or a
    report without this concurrency's row raises :class:`PerfAnalyzerError`.

    ``streaming``: the model is decoupled (a streaming pipeline), each request a gRPC stream;
    the latencies are then those of each stream's first response, which a latency budget bounds
    for a stream (the queue policy refuses a stream that would be late to its first item), read
    from perf_analyzer's profile export (:func:`first_response_latencies`)."""
    url = grpc_url.removeprefix("grpc://")
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as work:
        report, export = Path(work, "report.csv"), Path(work, "profile.json")
        command = [str(analyzer.path), "-m", model, "-u", url, "-i", "grpc",
                   "--input-data", str(input_data),
                   "--concurrency-range", f"{concurrency}:{concurrency}",
                   "--measurement-interval", str(measurement_ms),
                   "--stability-percentage", str(stability_percent),
                   "--max-trials", str(max_trials), "-f", str(report)]
        if streaming:
            command += ["--streaming", "--profile-export-file", str(export)]
        what = f"perf_analyzer on model {model!r} at {url}, concurrency {concurrency}"
        try:
            run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env=analyzer.environment(), timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            output = error.stdout or ""
            output = output.decode(errors="replace") if isinstance(output, bytes) else output
            raise PerfAnalyzerError(f"{what} ran past {timeout_s:g} s:\n{_tail(output)}") from None
        if run.returncode != 0:  # unstable: exit status 2 and no report
            why = (f"did not stabilize within {stability_percent}% in {max_trials} windows of "
                   f"{measurement_ms} ms (raise one of these)" if "Failed to obtain stable"
                   in run.stdout else "failed")
            raise PerfAnalyzerError(
                f"{what} {why} (exit status {run.returncode}):\n{_tail(run.stdout)}")
        rows = list(csv.DictReader(report.open())) if report.exists() else []
        profile = json.loads(export.read_text()) if streaming and export.exists() else None
    row = next((r for r in rows if r.get("Concurrency") == str(concurrency)), None)
    if row is None:
        raise PerfAnalyzerError(f"{what}: its report has no row for concurrency {concurrency}:"
                                f"\n{_tail(run.stdout)}")
    if streaming and profile is None:
        raise PerfAnalyzerError(f"{what}: it wrote no profile export, which a stream's latency "
                                f"to its first response is read from:\n{_tail(run.stdout)}")
    rate = float(row["Inferences/Second"])
    counted = re.search(r"Request count: (\d+)", run.stdout)
    requests = int(counted.group(1)) if counted else round(rate * measurement_ms / 1000)
    if profile is not None:  # streaming: checked above
        p50_ms, p99_ms = first_response_latencies(profile, concurrency)
    else:
        p50_ms, p99_ms = float(row["p50 latency"]) / 1000, float(row["p99 latency"]) / 1000
    return LoadPoint(concurrency=concurrency, rate=rate, p50_ms=p50_ms, p99_ms=p99_ms,
                     requests=requests)


STABLE_WINDOWS = 3
"""The measurement windows perf_analyzer reports: the last three, which agreed."""


def first_response_latencies(profile: dict, concurrency: int) -> tuple[float, float]:
    """p50 and p99 (ms) of the time to each stream's first response, from perf_analyzer's
    profile export (``--profile-export-file``): the requests of the ``concurrency`` experiment
    sent within its last :data:`STABLE_WINDOWS` windows, those its report is of."""
    experiment = next((e for e in profile.get("experiments", ())
                       if e["experiment"].get("mode") == "concurrency"
                       and e["experiment"].get("value") == concurrency), None)
    if experiment is None:
        raise PerfAnalyzerError(f"perf_analyzer's profile export has no experiment at "
                                f"concurrency {concurrency}")
    boundaries = experiment.get("window_boundaries") or []
    start = boundaries[-STABLE_WINDOWS - 1] if len(boundaries) > STABLE_WINDOWS else None
    latencies = [(request["response_timestamps"][0] - request["timestamp"]) / 1e6
                 for request in experiment["requests"]
                 if request.get("response_timestamps")
                 and (start is None or start <= request["timestamp"] < boundaries[-1])]
    if not latencies:
        raise PerfAnalyzerError(f"perf_analyzer's profile export holds no answered stream at "
                                f"concurrency {concurrency}")
    p50, p99 = np.percentile(latencies, [50, 99], method="higher")
    return float(p50), float(p99)


def _tail(output: str, lines: int = 30) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])
