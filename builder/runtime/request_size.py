"""The largest request the pipeline model serves: its limit, a request's size as it travels,
and whether ``/dev/shm`` holds requests at the limit (:mod:`builder.repository.request_limit`
says why).

Copied beside the pipeline's ``model.py`` as ``triton_builder_request_size.py``, which it
imports; like it, imports nothing from ``builder`` and loads on Python 3.8.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

MAX_REQUEST_PARAMETER = "max_request_bytes"
"""The pipeline model's config parameter: the largest request it serves, in bytes (written by
:mod:`builder.repository.request_limit`)."""
MAX_REQUEST_ENV = "TRITON_BUILDER_MAX_REQUEST_BYTES"
"""Sets the limit at run (``docker run -e``), over the config's."""
SHM_PER_REQUEST = 4
"""The ``/dev/shm`` a replica needs, in requests at the limit: the python backend copies a whole
dynamic batch into its region before the pipeline sees it, and regions do not shrink."""


def shm_mib(limit: int) -> int:
    """The ``/dev/shm`` a replica needs for requests up to ``limit`` bytes, in whole MiB: what
    the build gives it (``--shm-size``) and what this model asks for when it has less."""
    return -(-SHM_PER_REQUEST * limit // 2**20)


class RequestTooLargeError(ValueError):
    """A request's inputs are more bytes than the pipeline serves: the client's mistake."""


def tensor_bytes(array: np.ndarray) -> int:
    """The bytes of a tensor as it travels: its data, and for BYTES each element's 4-byte
    length prefix."""
    if array.dtype != object:
        return array.nbytes
    return sum(len(v) if isinstance(v, (bytes, bytearray)) else len(str(v).encode())
               for v in array.flat) + 4 * array.size


def request_limit(parameters: dict[str, Any], environ: dict[str, str],
                  api: Any) -> int | None:
    """The limit: :data:`MAX_REQUEST_ENV` where set to a positive integer, else the config's
    parameter, else none (a repository written before limits existed)."""
    configured = parameters.get(MAX_REQUEST_PARAMETER, {}).get("string_value")
    for source, value in ((MAX_REQUEST_ENV, environ.get(MAX_REQUEST_ENV)),
                          (MAX_REQUEST_PARAMETER, configured)):
        if value in (None, ""):
            continue
        if str(value).isdigit() and int(value) > 0:
            return int(value)
        api.log_warning(f"{source}={value!r} is not a positive number of bytes: ignored")
    return None


def check_shared_memory(limit: int | None, api: Any, path: str = "/dev/shm") -> None:
    """Warn where ``path`` is too small for requests at the limit: the python backend copies
    them there first, and fails them as server faults when it cannot."""
    if limit is None:
        return
    try:
        stat = os.statvfs(path)
    except OSError:
        return
    total = stat.f_frsize * stat.f_blocks
    if total < 2 * limit:
        api.log_warning(
            f"{path} holds {total / 2**20:.0f} MiB, too little for requests near the "
            f"{limit / 2**20:.3g} MiB limit: those fail in the python backend (INTERNAL, "
            f"'Failed to increase the shared memory pool size'). Give the container "
            f"--shm-size={shm_mib(limit)}m, or lower {MAX_REQUEST_ENV}")


def check_size(arrays: dict[str, np.ndarray], limit: int) -> None:
    size = sum(tensor_bytes(array) for array in arrays.values())
    if size > limit:
        raise RequestTooLargeError(
            f"the request's inputs are {size} bytes, over this pipeline's limit of {limit} "
            f"bytes ({limit / 2**20:.3g} MiB; max_request_bytes at build, {MAX_REQUEST_ENV} at "
            f"run)")
