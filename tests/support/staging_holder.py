"""A process in the middle of filling a cache entry (:func:`builder.cache.staged`) or a build's
working directory (:func:`builder.cache.build_scratch`), held there until it is killed, as a
build killed outright is, or let go to finish."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.paths import REPO_ROOT

_HOLD = """
import pathlib, sys
from builder.cache import build_scratch, staged
with (staged(pathlib.Path(sys.argv[1])) if sys.argv[1] else build_scratch()) as directory:
    (directory / "half-written").write_bytes(bytes(1 << 20))
    print(directory, flush=True)
    sys.stdin.read()
"""


class StagingHolder:
    """``staged(entry)`` in another process, one MiB written, waiting in the block; without
    ``entry``, ``build_scratch()`` in ``temporary`` (the child's ``TMPDIR``)."""

    def __init__(self, entry: Path | None = None, temporary: Path | None = None) -> None:
        environment = {**os.environ, **({"TMPDIR": str(temporary)} if temporary else {})}
        self.process = subprocess.Popen([sys.executable, "-c", _HOLD, str(entry or "")],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, cwd=REPO_ROOT, env=environment)
        self.staging = Path(self.process.stdout.readline().strip())
        # older than STALE_AFTER_S, so that only its lock tells whether it is stale
        past = time.time() - 60
        os.utime(self.staging, (past, past))

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def finish(self) -> int:
        self.process.stdin.close()
        return self.process.wait(timeout=30)
