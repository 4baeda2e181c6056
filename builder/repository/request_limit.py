"""How large one request to the pipeline may be, and the shared memory that takes.

Why a limit: a request reaches the pipeline model through the python backend's shared memory in
``/dev/shm``. One larger than the room left there fails inside the backend with ``INTERNAL
Failed to increase the shared memory pool size`` — a server fault to every balancer, retry
policy and alert, for what is the client's mistake. The pipeline model refuses a request over
the limit ``INVALID_ARGUMENT`` / HTTP 400, naming it, before decoding it or running an operator
(:mod:`builder.runtime.pipeline_model`), and the replica is given the shared memory for requests
up to the limit (:func:`shm_size`).

No Triton release can refuse it earlier for both protocols: the gRPC frontend takes messages up
to 2 GiB in every release, and the HTTP frontend's ``--http-max-input-size`` (64 MiB by
default) arrived after 24.10; neither knows the pipeline. A request too large for the
replica's ``/dev/shm`` itself still fails in the backend — hence :func:`shm_size`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from builder.errors import BuildError
from builder.pipeline.signature import PipelineSignature
from builder.runtime.request_size import MAX_REQUEST_PARAMETER, shm_mib, tensor_bytes

MIB = 1024 * 1024
DEFAULT_MAX_REQUEST_BYTES = 16 * MIB
"""The limit unless a pipeline's examples ask for more: a quarter of Docker's default 64 MiB
``/dev/shm``, beside the stubs' own regions (4 MiB each)."""
EXAMPLE_HEADROOM = 64
"""How many times its largest example call a request may be (examples are small samples)."""
DOCKER_SHM = 64 * MIB
"""What ``docker run`` gives a container without ``--shm-size``."""

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "MAX_REQUEST_PARAMETER", "max_request_bytes",
           "shm_size"]


def max_request_bytes(asked: int | None, signature: PipelineSignature,
                      examples: Sequence[Sequence[Any]]) -> int:
    """The limit: ``asked``, else :data:`DEFAULT_MAX_REQUEST_BYTES` or :data:`EXAMPLE_HEADROOM`
    times the largest example call, whichever is more, in whole MiB."""
    if asked is not None:
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise BuildError(f"max_request_bytes must be a positive number of bytes, got "
                             f"{asked!r}")
        return asked
    largest = max((request_size(signature, call) for call in examples), default=0)
    return max(DEFAULT_MAX_REQUEST_BYTES, math.ceil(EXAMPLE_HEADROOM * largest / MIB) * MIB)


def request_size(signature: PipelineSignature, call: Sequence[Any]) -> int:
    """The bytes of one call's input tensors as a client sends them."""
    return sum(tensor_bytes(spec.encode_batch([value]))
               for spec, value in zip(signature.inputs.values(), call, strict=True))


def shm_size(limit: int) -> str | None:
    """The ``docker run --shm-size`` a replica needs for requests up to ``limit``; ``None``
    where Docker's default is enough."""
    needed = shm_mib(limit)
    return None if needed * MIB <= DOCKER_SHM else f"{needed}m"
