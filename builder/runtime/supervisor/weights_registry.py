"""How a container talks to the registry that holds its weights: which one, over which
scheme, with which credentials, and through redirects.

``TRITON_BUILDER_WEIGHTS_REGISTRY`` replaces the lock's registry host (a mirror, or the registry
a build's verification starts), ``TRITON_BUILDER_WEIGHTS_REPOSITORY`` the whole ``host/name``.
Plain HTTP is used for loopback hosts and where ``TRITON_BUILDER_WEIGHTS_INSECURE`` is set;
credentials, where the registry asks for them, come from ``TRITON_BUILDER_WEIGHTS_AUTH``
(``user:password``, e.g. from a Kubernetes secret), through the registry's token service when
its challenge names one. A redirect to another host (blob storage behind the registry) does not
carry them: a presigned URL refuses a second authorization.

Standard library only, Python 3.8 and later.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .weights_lock import WeightsError, WeightsLock

REGISTRY_VARIABLE = "TRITON_BUILDER_WEIGHTS_REGISTRY"
REPOSITORY_VARIABLE = "TRITON_BUILDER_WEIGHTS_REPOSITORY"
INSECURE_VARIABLE = "TRITON_BUILDER_WEIGHTS_INSECURE"
AUTH_VARIABLE = "TRITON_BUILDER_WEIGHTS_AUTH"


@dataclass(frozen=True)
class Source:
    """The registry repository the blobs come from, and how to talk to it."""

    registry: str
    name: str
    insecure: bool
    auth: str | None = None

    @classmethod
    def of(cls, lock: WeightsLock, environ: Mapping[str, str]) -> Source:
        repository = environ.get(REPOSITORY_VARIABLE) or lock.repository
        registry, _, name = repository.partition("/")
        if "." not in registry and ":" not in registry and registry != "localhost":
            registry, name = "registry-1.docker.io", repository
            name = name if "/" in name else f"library/{name}"
        registry = environ.get(REGISTRY_VARIABLE) or registry
        if not name:
            raise WeightsError(f"the weights repository {repository!r} names no repository")
        insecure = loopback(registry) or environ.get(INSECURE_VARIABLE, "") not in (
            "", "0", "false", "no")
        return cls(registry, name, insecure, environ.get(AUTH_VARIABLE) or None)

    def blob_url(self, digest: str) -> str:
        scheme = "http" if self.insecure else "https"
        return f"{scheme}://{self.registry}/v2/{self.name}/blobs/{digest}"


class NoCredentialsAcrossHosts(urllib.request.HTTPRedirectHandler):
    """Follows a registry's redirect to its blob storage without the registry's credentials."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != \
                urllib.parse.urlsplit(req.full_url).netloc:
            new.headers.pop("Authorization", None)
            new.unredirected_hdrs.pop("Authorization", None)
        return new


OPENER = urllib.request.build_opener(NoCredentialsAcrossHosts)


def open_blob(source: Source, url: str, headers: dict[str, str], timeout: float) -> Any:
    """The response to ``GET url`` (``HTTPError`` as urllib raises it), authorized where the
    registry challenges."""
    request = urllib.request.Request(url, headers=headers)
    try:
        return OPENER.open(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code != 401:
            raise
        challenge = error.headers.get("WWW-Authenticate", "")
    authorized = urllib.request.Request(url, headers=headers)
    authorized.add_unredirected_header("Authorization", _authorization(source, challenge,
                                                                       timeout))
    return OPENER.open(authorized, timeout=timeout)


def _authorization(source: Source, challenge: str, timeout: float) -> str:
    basic = (base64.b64encode(source.auth.encode()).decode() if source.auth else None)
    try:
        return answer_challenge(challenge, basic, f"repository:{source.name}:pull", timeout)
    except ChallengeUnanswered as why:
        registry = source.registry
        raise WeightsError({
            "credentials": f"{registry} wants credentials for the weights: set "
                           f"{AUTH_VARIABLE}=user:password",
            "scheme": f"{registry} asks for an authentication this supervisor does not speak: "
                      f"{challenge!r}",
            "realm": f"{registry} asks for an authentication this supervisor does not speak: "
                     f"{challenge!r}",
            "refused": f"{registry}'s token service refused to let this container pull "
                       f"{source.name} ({why.code}): set {AUTH_VARIABLE}",
            "no token": f"{registry}'s token service sent no token",
        }[why.reason]) from None


class ChallengeUnanswered(Exception):
    """Why a registry's challenge got no ``Authorization``: ``reason`` is ``"credentials"``
    (it wants some, none given), ``"scheme"`` (neither basic nor bearer), ``"realm"`` (a bearer
    challenge without a token service),
    ``"refused"`` (the token service answered ``code``) or ``"no token"``. Each caller says
    what its user should do about it."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def answer_challenge(challenge: str, basic: str | None, scope: str, timeout: float) -> str:
    """The ``Authorization`` that answers a ``WWW-Authenticate`` challenge: ``basic``
    credentials (base64 ``user:password``) as they are, or a bearer token for ``scope`` from
    the challenge's token service; :class:`ChallengeUnanswered` otherwise."""
    scheme, fields = parse_challenge(challenge)
    if scheme == "basic":
        if basic is None:
            raise ChallengeUnanswered("credentials")
        return f"Basic {basic}"
    if scheme != "bearer":
        raise ChallengeUnanswered("scheme")
    if not fields.get("realm"):
        raise ChallengeUnanswered("realm")
    fields.setdefault("scope", scope)
    try:
        token = request_token(fields, basic, timeout)
    except urllib.error.HTTPError as error:
        raise ChallengeUnanswered("refused", error.code) from None
    if not token:
        raise ChallengeUnanswered("no token")
    return f"Bearer {token}"


def parse_challenge(challenge: str) -> tuple[str, dict[str, str]]:
    """The scheme (lower case) and fields of a ``WWW-Authenticate`` challenge."""
    scheme, _, params = challenge.partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', params))


def request_token(fields: Mapping[str, str], basic: str | None, timeout: float) -> str | None:
    """The token a bearer challenge's ``realm`` gives for its other fields (``scope``,
    ``service``), asked with ``basic`` credentials where there are some; ``HTTPError`` when
    it refuses (the distribution spec's token authentication)."""
    query = {name: value for name, value in fields.items() if name != "realm"}
    request = urllib.request.Request(f"{fields['realm']}?{urllib.parse.urlencode(query)}")
    if basic is not None:
        request.add_header("Authorization", f"Basic {basic}")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        token: dict[str, Any] = json.load(answer)
    return token.get("token") or token.get("access_token")


def loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in ("localhost", "127.0.0.1", "::1", "[::1]") or name.startswith("127.")
