"""Construction and lifecycle shared by the blocking and the asyncio clients.

The two flavours differ in how they wait (threads or the event loop), not in what they are: a
model at an endpoint, a retry policy, a bound on requests in flight, a transport opened on first
use, and a pipeline client wrapping such a model. That part is written once, here; each flavour
names its transport opener, its lock and its way of closing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from builder.client.endpoint import Endpoint, parse_endpoint
from builder.client.retry import RetryPolicy, as_policy

if TYPE_CHECKING:
    from builder.client.codec import PipelineCodec
    from builder.client.served_model import ServedModel

DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_IN_FLIGHT = 8


class RemoteModelBase:
    """A model on a Triton server: where it is and how requests to it are retried and bounded.

    ``url`` names the protocol, address and model (see
    :func:`builder.client.endpoint.parse_endpoint`); ``endpoint`` (the model name) and
    ``scheme`` fill in what it leaves out. ``timeout`` bounds each request in seconds;
    ``retries`` (a count or a :class:`RetryPolicy`) is how often a request that found the server
    unavailable is tried again, with exponential backoff; ``max_in_flight`` bounds the requests
    of one ``batch`` sent at once.
    """

    open_transport: ClassVar[staticmethod[[Endpoint, float, int], Any]]
    new_lock: ClassVar[Callable[[], Any]]

    def __init__(
        self,
        url: str,
        endpoint: str | None = None,
        scheme: str | None = None,
        *,
        version: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        retries: int | RetryPolicy = 5,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.endpoint: Endpoint = parse_endpoint(url, endpoint, scheme, version)
        self.retry_policy = as_policy(retries)
        self.max_in_flight = max_in_flight
        self._transport = type(self).open_transport(self.endpoint, timeout, max_in_flight)
        self._spec: ServedModel | None = None
        self._lock = type(self).new_lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint.url!r})"


class PipelineClientBase:
    """A served pipeline: its model (arguments as for :class:`RemoteModelBase`) and the codec
    read from it on first use."""

    model_class: ClassVar[type[RemoteModelBase]]

    def __init__(self, url: str, endpoint: str | None = None, scheme: str | None = None,
                 **options: Any) -> None:
        self.model = self.model_class(url, endpoint, scheme, **options)
        self._codec: PipelineCodec | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model.endpoint.url!r})"


class Closing:
    """``with``: ``close()`` on the way out."""

    if TYPE_CHECKING:  # each subclass has its own
        def close(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncClosing:
    """``async with``: ``await close()`` on the way out."""

    if TYPE_CHECKING:  # each subclass has its own
        async def close(self) -> None: ...

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
