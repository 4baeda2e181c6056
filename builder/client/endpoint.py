"""Where a served model lives: protocol, address and model name, from one URL.

Users copy URLs around (``grpc://host:8001/embed``, ``http://host:8000/v2/models/embed``), so
the client takes one string and splits it here, once, with errors that say what was expected.
The protocol is never guessed from a port number: Triton's ports are configurable and a wrong
guess fails late and obscurely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

Scheme = Literal["grpc", "http"]

# URL scheme -> (protocol, TLS)
_SCHEMES: dict[str, tuple[Scheme, bool]] = {
    "grpc": ("grpc", False),
    "grpcs": ("grpc", True),
    "http": ("http", False),
    "https": ("http", True),
}
# The KServe v2 path of a model, accepted as well as the bare ``/<model>``.
_KSERVE_PATH = re.compile(r"^/?v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/?$")


@dataclass(frozen=True)
class Endpoint:
    """One model on one server, reachable over one protocol."""

    scheme: Scheme
    address: str  # host:port, as tritonclient wants it (no scheme)
    model: str
    version: str = ""  # "" means the server's version policy decides
    ssl: bool = False

    @property
    def url(self) -> str:
        secure = "s" if self.ssl else ""
        version = f"/versions/{self.version}" if self.version else ""
        return f"{self.scheme}{secure}://{self.address}/v2/models/{self.model}{version}"


def parse_endpoint(
    url: str, model: str | None = None, scheme: str | None = None, version: str = ""
) -> Endpoint:
    """Split ``url`` into an :class:`Endpoint`; ``model``/``scheme`` fill what the URL lacks.

    Accepted: ``grpc://host:port/model``, ``http://host:port/model``,
    ``http://host:port/v2/models/model[/versions/N]``, or ``host:port`` with ``scheme=`` and
    ``model=``. A value given both ways must agree.
    """
    has_scheme = "://" in url
    parts = urlsplit(url if has_scheme else f"//{url}")
    url_scheme = parts.scheme.lower() if has_scheme else None
    if url_scheme is not None and url_scheme not in _SCHEMES:
        raise ValueError(f"unsupported scheme {url_scheme!r} in {url!r}: use one of "
                         f"{', '.join(_SCHEMES)}")
    chosen = _agree("scheme", url_scheme, scheme and scheme.lower(), url)
    if chosen is None:
        raise ValueError(f"{url!r} does not say the protocol: write grpc://… or http://…, "
                         "or pass scheme='grpc' or scheme='http'")
    if chosen not in _SCHEMES:
        raise ValueError(f"unsupported scheme {chosen!r}: use one of {', '.join(_SCHEMES)}")
    protocol, ssl = _SCHEMES[chosen]
    if not parts.hostname or parts.port is None:
        raise ValueError(f"{url!r} needs a host and a port, e.g. grpc://127.0.0.1:8001/model")

    url_model, url_version = _model_from_path(parts.path, url)
    name = _agree("model", url_model, model, url)
    if not name:
        raise ValueError(f"{url!r} does not name a model: append /<model> or pass model=…")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return Endpoint(
        scheme=protocol, address=f"{host}:{parts.port}", model=name,
        version=_agree("version", url_version, version or None, url) or "", ssl=ssl,
    )


def _model_from_path(path: str, url: str) -> tuple[str | None, str | None]:
    if path in ("", "/"):
        return None, None
    match = _KSERVE_PATH.match(path)
    if match:
        return match["model"], match["version"]
    name = path.strip("/")
    if "/" in name:
        raise ValueError(f"cannot read a model name from the path of {url!r}: use /<model> or "
                         "/v2/models/<model>[/versions/<n>]")
    return name, None


def _agree(what: str, from_url: str | None, given: str | None, url: str) -> str | None:
    if from_url and given and from_url != given:
        raise ValueError(f"{what} {given!r} contradicts {from_url!r} in {url!r}")
    return from_url or given
