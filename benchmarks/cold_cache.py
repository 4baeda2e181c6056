"""An empty builder cache for one measured step, with only what the benchmark does not time."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.cache import cache_dir

VARIABLE = "TRITON_BUILDER_CACHE"


@contextmanager
def cold_cache(prefix: str, *carried: str) -> Iterator[Path]:
    """``$TRITON_BUILDER_CACHE`` pointed at a new empty directory while the block runs, holding
    copies of the current cache's ``carried`` subdirectories (downloads whose speed is PyPI's,
    not the builder's: ``wheels``, ``tools``); the previous value comes back after."""
    sources = [cache_dir(name) for name in carried]
    previous = os.environ.get(VARIABLE)
    with tempfile.TemporaryDirectory(prefix=prefix) as cache:
        for source in sources:
            shutil.copytree(source, Path(cache) / source.name)
        os.environ[VARIABLE] = cache
        try:
            yield Path(cache)
        finally:
            if previous is None:
                os.environ.pop(VARIABLE, None)
            else:
                os.environ[VARIABLE] = previous
