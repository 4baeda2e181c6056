"""Clients of served models and pipelines, over gRPC or HTTP, blocking or asyncio.

:class:`Client` calls a served pipeline with the values ``pipe(...)`` takes and returns what it
returns; :class:`TritonRemoteModel` calls any Triton model with numpy arrays and Python values.
"""

from builder.client.aio import AsyncClient, AsyncTritonRemoteModel
from builder.client.errors import (
    RemoteInputError,
    RemoteModelError,
    RemoteTimeoutError,
    ServerUnavailableError,
)
from builder.client.lifecycle import DEFAULT_TIMEOUT
from builder.client.pipeline import Client
from builder.client.remote_model import TritonRemoteModel
from builder.client.retry import RetryPolicy
from builder.errors import InputError

__all__ = [
    "AsyncClient",
    "AsyncTritonRemoteModel",
    "Client",
    "DEFAULT_TIMEOUT",
    "InputError",
    "RemoteInputError",
    "RemoteModelError",
    "RemoteTimeoutError",
    "RetryPolicy",
    "ServerUnavailableError",
    "TritonRemoteModel",
]
