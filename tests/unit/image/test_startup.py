"""Start period and verification timeout: fixed without environment archives, grown by the
archives an image carries, and enough for the 22.12 CUDA environment as measured."""

from __future__ import annotations

import os
import re

from builder.base import resolve
from builder.image import startup
from builder.image.serving_dockerfile import render_serving_dockerfile

HEALTH_INTERVAL_S, HEALTH_RETRIES = 15, 3  # dockerfiles/serving.Dockerfile.j2


def _sparse(path, size: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as stream:
        stream.truncate(size)
    return path


def test_without_archives_the_fixed_allowances_hold(tmp_path):
    (tmp_path / "m" / "environment" / "bin").mkdir(parents=True)  # unpacked: nothing to extract
    assert startup.repository_archive_bytes(tmp_path) == 0
    assert startup.health_start_period(0) == startup.START_PERIOD_S == 60
    assert startup.verify_timeout(0) == startup.VERIFY_TIMEOUT_S == 180.0
    assert "--start-period=60s" in render_serving_dockerfile(resolve("12.4"))


def test_an_archive_counts_once_however_many_models_link_it(tmp_path):
    size = 3 * 10**9
    archive = _sparse(tmp_path / "pipeline" / "environment.tar.gz", size)
    (tmp_path / "post").mkdir()
    (tmp_path / "post" / "environment.tar.gz").symlink_to(os.path.relpath(archive,
                                                                          tmp_path / "post"))
    assert startup.repository_archive_bytes(tmp_path) == size
    extra = startup.extraction_seconds(size)
    assert extra == -(-size // startup.EXTRACTION_BYTES_PER_S) > 0
    assert startup.health_start_period(size) == 60 + extra
    assert startup.verify_timeout(size) == 180 + extra
    dockerfile = render_serving_dockerfile(resolve("11.8"),
                                           start_period=startup.health_start_period(size))
    assert re.search(rf"HEALTHCHECK .*--start-period={60 + extra}s ", dockerfile)


def test_the_allowances_fit_the_measured_22_12_start():
    """The 22.12 environment's archive as measured (BENCHMARKS.md, "CUDA environments"): with
    the extraction at a third of the measured rate, verification waits longer than the measured
    start, and the health check marks the container unhealthy only after it."""
    size, ready = startup.MEASURED_ARCHIVE_BYTES, startup.MEASURED_READY_S
    assert startup.verify_timeout(size) >= 2 * ready
    unhealthy_after = startup.health_start_period(size) + HEALTH_INTERVAL_S * HEALTH_RETRIES
    assert unhealthy_after >= 2 * ready
