"""The ways a call to a served model fails, told apart the same way for gRPC and HTTP.

tritonclient reports failures as an ``InferenceServerException`` whose status is a gRPC code
name or an HTTP status number, or lets socket, gevent and aiohttp exceptions through. Callers
need three answers, whatever the protocol: retry (the server is not there), give up waiting (a
deadline passed) or fix the request (the server refused it: :class:`RemoteInputError`). Any
other answer is a server fault. :func:`classify` maps everything onto those.
"""

from __future__ import annotations

import asyncio
import sys

from tritonclient.utils import InferenceServerException

from builder.errors import InputError, TritonBuilderError


class RemoteModelError(TritonBuilderError, RuntimeError):
    """The server answered with an error; ``status`` is its gRPC code or HTTP status."""

    def __init__(self, message: str, status: str = "") -> None:
        super().__init__(message)
        self.status = status


class RemoteInputError(RemoteModelError, InputError):
    """The server refused the request as the caller's mistake (gRPC ``INVALID_ARGUMENT``, HTTP
    400 or 413): a bad tensor, a request over the pipeline's size limit, an input an operator
    rejected. Never retried; the same request fails the same way."""


class ServerUnavailableError(TritonBuilderError, ConnectionError):
    """The server could not be reached, or said it cannot serve now (gRPC UNAVAILABLE, HTTP 503,
    connection refused or reset). The only failure that is retried."""


class RemoteTimeoutError(TritonBuilderError, TimeoutError):
    """No answer within the client's timeout; not retried, the request may still be running."""


_UNAVAILABLE = {"StatusCode.UNAVAILABLE", "503"}
_TIMEOUT = {"StatusCode.DEADLINE_EXCEEDED", "504"}
_CLIENT_MISTAKE = {"StatusCode.INVALID_ARGUMENT", "400", "413"}


def classify(error: BaseException, what: str) -> Exception | None:
    """The error to raise instead of ``error``, or None when it is not a transport failure."""
    if isinstance(error, InferenceServerException):
        status = error.status() or ""
        message = f"{what}: {error.message()}"
        if status in _UNAVAILABLE:
            return ServerUnavailableError(message)
        if status in _TIMEOUT:
            return RemoteTimeoutError(message)
        error_class = RemoteInputError if status in _CLIENT_MISTAKE else RemoteModelError
        return error_class(f"{message} [{status}]" if status else message, status)
    if isinstance(error, (TimeoutError, asyncio.TimeoutError)) or _is_gevent_timeout(error):
        return RemoteTimeoutError(f"{what}: timed out ({type(error).__name__} {error})")
    if isinstance(error, (ConnectionError, OSError)) or _is_aiohttp_connection_error(error) \
            or _is_gevent_connection_closed(error):
        return ServerUnavailableError(f"{what}: {type(error).__name__}: {error}")
    return None


def _is_gevent_timeout(error: BaseException) -> bool:
    # gevent is imported by tritonclient.http only; do not import it for gRPC users
    gevent_timeout = getattr(sys.modules.get("gevent"), "Timeout", None)
    return gevent_timeout is not None and isinstance(error, gevent_timeout)


def _is_gevent_connection_closed(error: BaseException) -> bool:
    """geventhttpclient's ``HTTPConnectionClosed``: the server closed a kept-alive connection
    before it answered (it stopped, or was killed) — the HTTP client's counterpart of
    ``http.client.RemoteDisconnected``, which is a ``ConnectionResetError``."""
    response = sys.modules.get("geventhttpclient.response")
    closed = getattr(response, "HTTPConnectionClosed", None)
    return closed is not None and isinstance(error, closed)


def _is_aiohttp_connection_error(error: BaseException) -> bool:
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(error, aiohttp.ClientConnectionError)
