"""Which push failures are retried, and what the error tells the user to do.

The engine reports a failed push as text in its progress stream; these are the messages
dockerd 20-27 sends for each case (the e2e tests produce several of them for real: a port
where nothing listens, a host that does not resolve, an image that is not there).
"""

from __future__ import annotations

import pytest

from builder.push.docker_push import PushResult, _explain, _is_transient

TRANSIENT = [
    'Get "https://reg:5000/v2/": dial tcp 10.0.0.5:5000: connect: connection refused',
    "received unexpected HTTP status: 503 Service Unavailable",
    "net/http: TLS handshake timeout",
    "toomanyrequests: too many requests",
    "read tcp 10.0.0.2:4242->10.0.0.5:5000: read: connection reset by peer",
]
PERMANENT = [
    'Get "https://nope.invalid/v2/": dial tcp: lookup nope.invalid: no such host',
    "unauthorized: authentication required",
    "denied: requested access to the resource is denied",
    "An image does not exist locally with the tag: reg:5000/app",
    "x509: certificate signed by unknown authority (possibly a timeout)",
]


@pytest.mark.parametrize("message", TRANSIENT)
def test_failures_worth_retrying(message):
    assert _is_transient(message)


@pytest.mark.parametrize("message", PERMANENT)
def test_failures_not_worth_retrying_even_when_they_mention_a_transient_word(message):
    assert not _is_transient(message)


@pytest.mark.parametrize(("message", "hint"), [
    (PERMANENT[0], "the registry host reg.example.com:5000 does not resolve"),
    (TRANSIENT[0], "nothing listens at reg.example.com:5000: is the registry running?"),
    (PERMANENT[1], "run `docker login reg.example.com:5000`"),
    (PERMANENT[3], "build or tag the image first"),
])
def test_the_error_names_the_fix(message, hint):
    text = _explain("reg.example.com:5000/team/app:1", message, attempts=4)
    assert text.startswith("push of reg.example.com:5000/team/app:1 failed after 4 attempts: ")
    assert hint in text


def test_one_attempt_is_not_counted_and_an_unknown_failure_has_no_hint():
    assert _explain("reg:5000/app:1", "manifest invalid", 1) == (
        "push of reg:5000/app:1 failed: manifest invalid")


def test_a_pushed_image_is_pinned_by_its_digest_without_its_tag():
    result = PushResult("reg:5000/team/app:1", "sha256:" + "0" * 64, attempts=1)
    assert result.pinned == "reg:5000/team/app@sha256:" + "0" * 64
