"""Asking a registry for a tag's digest through its authentication challenges.

The e2e tests ask Debian's real ``docker-registry``, which runs here without authentication;
a registry with a token service (Docker Hub, GHCR, Harbor) cannot run here. So the challenges
are played by a small HTTP server in the test, speaking the distribution API's manifest
endpoint and a token realm, and the credentials come from a real Docker configuration file
read by the Docker SDK, as in a build.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from builder.engine.registry import MANIFEST_TYPES, RegistryError, is_loopback, manifest_digest

DIGEST = "sha256:" + "ab" * 32
TOKEN = "registry-token"
USER, PASSWORD = "builder", "s3cret"


class _Registry(BaseHTTPRequestHandler):
    challenge = "bearer"
    send_digest = True
    token_requests: list[dict[str, str]] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/token":
            return self._token(dict(urllib.parse.parse_qsl(url.query)))
        if url.path != "/v2/team/app/manifests/1":
            return self._answer(404)
        if MANIFEST_TYPES not in self.headers.get("Accept", ""):
            return self._answer(406)
        wanted = {"bearer": f"Bearer {TOKEN}", "basic": f"Basic {_basic(USER, PASSWORD)}"}
        if self.headers.get("Authorization") != wanted.get(self.challenge, "never sent"):
            port = self.server.server_address[1]
            challenge = {"bearer": f'Bearer realm="http://127.0.0.1:{port}/token",service="test"',
                         "basic": 'Basic realm="test"', "no realm": 'Bearer service="test"',
                         "digest": 'Digest realm="test"'}[self.challenge]
            return self._answer(401, {"WWW-Authenticate": challenge})
        self._answer(200, {"Docker-Content-Digest": DIGEST} if self.send_digest else {})

    def _token(self, query: dict[str, str]) -> None:
        self.token_requests.append({**query, "authorization": self.headers.get("Authorization")})
        if self.headers.get("Authorization") != f"Basic {_basic(USER, PASSWORD)}":
            return self._answer(401)
        body = json.dumps({"token": TOKEN}).encode()
        self._answer(200, {"Content-Type": "application/json"}, body)

    def _answer(self, code: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def registry():
    """A registry on a loopback port: yields its handler class (set ``challenge`` and
    ``send_digest`` on it; it records ``token_requests``) and its host."""
    handler = type("Handler", (_Registry,), {"token_requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def docker_login(tmp_path, monkeypatch):
    """A Docker configuration holding a login for ``host`` (what `docker login host` writes)."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))

    def login(host: str) -> None:
        (tmp_path / "config.json").write_text(
            json.dumps({"auths": {host: {"auth": _basic(USER, PASSWORD)}}}))
    return login


def test_loopback_registries_are_the_insecure_default():
    assert is_loopback("127.0.0.1:5000") and is_loopback("localhost:80")
    assert is_loopback("[::1]:5000") and is_loopback("127.0.0.1")
    assert not is_loopback("registry.example.com:5000") and not is_loopback("10.0.0.1:5000")


def test_a_bearer_challenge_is_answered_with_a_token_for_the_repository(registry, docker_login):
    handler, host = registry
    docker_login(host)
    assert manifest_digest(f"{host}/team/app:1") == DIGEST
    (request,) = handler.token_requests
    assert request["scope"] == "repository:team/app:pull" and request["service"] == "test"


def test_without_a_login_the_token_refusal_names_docker_login(registry, docker_login):
    handler, host = registry
    with pytest.raises(RegistryError, match=rf"refused a token for team/app \(401\); run "
                                            rf"`docker login {host}`"):
        manifest_digest(f"{host}/team/app:1")
    assert handler.token_requests[0]["authorization"] is None


def test_a_basic_challenge_sends_the_docker_login(registry, docker_login):
    handler, host = registry
    handler.challenge = "basic"
    with pytest.raises(RegistryError, match=rf"wants a login: run `docker login {host}`"):
        manifest_digest(f"{host}/team/app:1")
    docker_login(host)
    assert manifest_digest(f"{host}/team/app:1") == DIGEST


def test_a_missing_tag_and_a_missing_digest_are_errors_that_name_them(registry, docker_login):
    handler, host = registry
    docker_login(host)
    with pytest.raises(RegistryError, match=r"has no manifest team/other:1 \(404\)"):
        manifest_digest(f"{host}/team/other:1")
    handler.send_digest = False
    with pytest.raises(RegistryError, match="did not send Docker-Content-Digest for team/app:1"):
        manifest_digest(f"{host}/team/app:1")


def test_a_registry_that_is_not_loopback_is_asked_over_https_only(registry):
    _, host = registry
    with pytest.raises(RegistryError, match=r"cannot reach the registry .*https://") as error:
        manifest_digest(f"{host}/team/app:1", insecure=False, timeout=5)
    assert "http://" not in str(error.value)


@pytest.mark.parametrize("challenge, message", [
    ("no realm", "sent a bearer challenge without a realm"),
    ("digest", "asks for an unknown authentication: 'Digest realm=\"test\"'")])
def test_a_challenge_it_cannot_answer_is_named(registry, challenge, message):
    handler, host = registry
    handler.challenge = challenge
    with pytest.raises(RegistryError, match=re.escape(f"{host} {message}")):
        manifest_digest(f"{host}/team/app:1")
