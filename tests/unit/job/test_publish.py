"""The end of a build: how long it took and the most memory it held, said and kept (no engine:
nothing is pushed)."""

from __future__ import annotations

import time

from builder.base.releases import resolve
from builder.job.platform_build import ImageBuild
from builder.job.publish import publish
from builder.progress import peak_memory


def test_peak_memory_counts_what_this_process_held():
    held = bytearray(256 * 1024 * 1024)
    held[::4096] = b"x" * len(held[::4096])  # touched, so resident
    assert peak_memory() >= len(held)


def test_the_build_reports_its_peak_memory_and_keeps_it():
    image = ImageBuild(id="sha256:" + "a" * 64, release=resolve(None), content_hash="h",
                       labels={}, built=True, run_command="docker run --rm x:1")
    lines: list[str] = []
    result = publish(image, {resolve(None).platform: image}, ["x:1"], client=None, push=False,
                     started=time.monotonic() - 2, on_log=lines.append)
    assert result.peak_memory_bytes == peak_memory() > 0
    assert lines[0].startswith("built in 2.") and "peak memory" in lines[0], lines
    assert f"{result.peak_memory_bytes / 1e9:.2f} GB" in lines[0]
    assert lines[-1] == "run it: docker run --rm x:1"
