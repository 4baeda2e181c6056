"""How long a serving container may take to become ready: the health check's start period and
the verification's timeout, grown by the environment archives the image carries.

Without archives a server is ready in seconds, and the fixed allowances hold: 60 s of start
period (failed health checks do not count yet; a passing one ends it at once, so a longer one
delays nothing but the verdict on a container that never comes up) and 180 s for verification.
An environment shipped as an archive — every GPU release before r23.07
(:mod:`builder.environment.unpacking`) — is extracted by the python backend at every start
before any python model loads. Measured here (BENCHMARKS.md, "CUDA environments"; the host
Triton 2.51, whose extraction is the same libarchive code as r22.12's): the 22.12 (CUDA 11.8,
torch 2.0.1) environment's 2.38 GB archive made the start to ready 36.5 / 36.9 / 38.8 s on a
quiet machine against 3.4 / 3.6 / 8.4 s unpacked, an extraction of about 33 s (71 MB/s); on
2 CPUs shared with other jobs the same archive took 42.5 / 46.6 / 60.5 s (61 MB/s). The fixed
allowances held, but the slowest start left 44 s before Docker's health check (60 s start
period, then 3 failures 15 s apart) would have marked the container unhealthy, and a bigger
archive or a slower disk leaves none: so both allowances add the time an archive takes at
:data:`EXTRACTION_BYTES_PER_S`, a third of the busy machine's rate.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

from builder.image.context import ENVIRONMENT_SUFFIXES

START_PERIOD_S = 60
"""The health check's start period for an image without environment archives."""
VERIFY_TIMEOUT_S = 180.0
"""Seconds verification waits for readiness, without environment archives."""
EXTRACTION_BYTES_PER_S = 20 * 10**6
"""Archive bytes the python backend extracts per second, allowed for: a third of the 61 MB/s
measured on a busy machine (see the module's text)."""
MEASURED_ARCHIVE_BYTES = 2_342_589_255
"""The 22.12 CUDA environment's archive as measured (``benchmarks/bench_cuda_environment.py``)."""
MEASURED_READY_S = 60.5
"""Its slowest start to ready as a tarball on the host Triton 2.51, on a busy machine (2.34 GB
then, before archives were canonical): the worst case the allowances are held against."""


def extraction_seconds(archive_bytes: int) -> int:
    """The seconds allowed for extracting ``archive_bytes`` of environment archives."""
    return math.ceil(archive_bytes / EXTRACTION_BYTES_PER_S) if archive_bytes > 0 else 0


FETCH_BYTES_PER_S = 20 * 10**6
"""Weight bytes a container fetches per second at start (weights beside the image), allowed
for: a 160 Mbit/s link, slower than a registry on the same network — an allowance, not a
measurement."""


def health_start_period(archive_bytes: int = 0, fetched_bytes: int = 0) -> int:
    """The ``HEALTHCHECK --start-period`` in seconds for an image carrying ``archive_bytes``
    (and fetching ``fetched_bytes`` of weights before its server starts)."""
    fetching = math.ceil(fetched_bytes / FETCH_BYTES_PER_S) if fetched_bytes > 0 else 0
    return START_PERIOD_S + extraction_seconds(archive_bytes) + fetching


def verify_timeout(archive_bytes: int = 0) -> float:
    """How long verification waits for a container carrying ``archive_bytes`` to be ready."""
    return VERIFY_TIMEOUT_S + extraction_seconds(archive_bytes)


def archive_bytes(paths: Iterable[str | os.PathLike]) -> int:
    """The size of the distinct environment archives among ``paths`` (links count once: the
    python backend extracts each real file once per server)."""
    seen: dict[Path, int] = {}
    for path in paths:
        real = Path(path).resolve()
        if real.is_file() and real.name.endswith(ENVIRONMENT_SUFFIXES):
            seen[real] = real.stat().st_size
    return sum(seen.values())


def repository_archive_bytes(repository: str | os.PathLike) -> int:
    """The size of the distinct environment archives inside a model repository."""
    return archive_bytes(p for p in Path(repository).rglob("*")
                         if p.name.endswith(ENVIRONMENT_SUFFIXES))


EMULATION_SLOWDOWN = 10
"""How many times the allowances grow for an image run under emulation (another platform's
than the engine's: qemu-user translates every instruction). Measured here on the example
(BENCHMARKS.md, "Platforms"; 2 quiet cores): the arm64 image's verification — start to ready,
every example over gRPC and HTTP — took 10.2 s under qemu-user 7.2 against 2.6 s for the amd64
image (medians of 2), about 4 times (4.3 times on a busy machine); ten times leaves room for a
busier machine and a bigger pipeline, and costs nothing where the container is ready sooner."""


def emulated_allowance(seconds: float) -> float:
    """``seconds`` of a native container, for one run under emulation."""
    return seconds * EMULATION_SLOWDOWN
