"""What the clients retry: a server that is not there or says it cannot serve now, and nothing
else; for how long, and what the error says when they give up."""

from __future__ import annotations

import socket
import threading

import pytest
import tritonclient.http as httpclient

from builder.client.errors import (
    RemoteInputError,
    RemoteModelError,
    ServerUnavailableError,
    classify,
)
from builder.client.retry import RetryPolicy, call_with_retry
from builder.errors import InputError


def test_a_kept_alive_connection_the_server_closes_is_unavailable():
    """A stopping server (killed after its drain) closes the HTTP connections it keeps alive:
    geventhttpclient reports ``HTTPConnectionClosed``, which must be retried like a reset."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def close_every_connection():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.recv(65536)
            connection.close()

    threading.Thread(target=close_every_connection, daemon=True).start()
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=10)
    try:
        with pytest.raises(Exception) as raised:
            client.is_server_ready()
    finally:
        client.close()
        listener.close()
    assert type(raised.value).__name__ == "HTTPConnectionClosed"
    assert isinstance(classify(raised.value, "ready"), ServerUnavailableError)


def test_a_refusal_the_client_must_fix_is_not_retried():
    from tritonclient.utils import InferenceServerException

    found = classify(InferenceServerException("no such model", status="StatusCode.NOT_FOUND"),
                     "infer")
    assert isinstance(found, RemoteModelError) and not isinstance(found, ServerUnavailableError)


@pytest.mark.parametrize("status", ["StatusCode.INVALID_ARGUMENT", "400", "413"])
def test_a_request_the_server_refused_as_bad_input_is_an_input_error(status):
    """The same ``except InputError`` catches bad input found by the client before sending and
    bad input the server refused; a server fault is not one."""
    from tritonclient.utils import InferenceServerException

    found = classify(InferenceServerException("not an image", status=status), "infer")
    assert isinstance(found, RemoteInputError) and isinstance(found, InputError)
    assert isinstance(found, RemoteModelError) and found.status == status
    fault = classify(InferenceServerException("boom", status="StatusCode.INTERNAL"), "infer")
    assert not isinstance(fault, InputError)


def test_retries_stop_at_the_deadline_and_say_so():
    attempts = []

    def down():
        attempts.append(1)
        raise ServerUnavailableError("refused")

    policy = RetryPolicy(retries=100, initial_delay=0.05, multiplier=1.0, jitter=0,
                         deadline=0.3)
    with pytest.raises(ServerUnavailableError,
                       match=r"gave up after \d+ attempts in 0\.\ds: UNAVAILABLE is retried "
                             r"with backoff, up to the retry deadline of 0.3s"):
        call_with_retry(down, policy)
    assert 4 <= len(attempts) <= 8
