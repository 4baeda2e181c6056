"""Weights beside the image: pushed as an OCI artifact to a real registry (Debian's
``docker-registry``, distribution 2.8), fetched by the supervisor's code into a cache — from
empty, from the cache with the registry stopped, a corrupted blob, a fetch killed halfway, a
registry that does not answer. No engine: the container's code runs here as it runs in it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from builder.engine.reference import ImageReference
from builder.engine.registry import registry_request
from builder.push.weights_artifact import (
    CONFIG_MEDIA_TYPE,
    FILE_MEDIA_TYPE,
    MODEL_ANNOTATION,
    push_weights,
)
from builder.runtime import drain
from builder.runtime.supervisor.main import WEIGHTS_FAILED, main
from builder.runtime.supervisor.weights_fetch import TIMEOUT_VARIABLE, ensure_weights
from builder.runtime.supervisor.weights_lock import (
    CACHE_VARIABLE,
    LOCK_VARIABLE,
    WeightFile,
    WeightsError,
    WeightsLock,
    blob_path,
    partial_path,
    unnamed_blobs,
)
from builder.runtime.supervisor.weights_registry import AUTH_VARIABLE, REGISTRY_VARIABLE
from tests.support.testbed import LocalRegistry

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def own_registry(tmp_path):
    """A registry of the test's own: some tests stop it or damage what it stores."""
    (tmp_path / "registry").mkdir()
    with LocalRegistry(tmp_path / "registry") as running:
        yield running


def weights(tmp_path: Path, model: str, sizes: dict[str, int], seed: int = 0):
    """Files of random bytes for ``model``, and the lock entries naming them."""
    files = {}
    for index, (name, size) in enumerate(sorted(sizes.items())):
        path = tmp_path / model / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size) if seed == 0 else
                         hashlib.sha256(f"{seed}{index}".encode()).digest() * (size // 32))
        digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        files[WeightFile(model, f"/models/{model}/1/{name}", digest, size)] = path
    return files


def pushed_lock(registry: LocalRegistry, tmp_path: Path, **models: dict[str, int]):
    repository = f"{registry.host}/weights-test"
    every = {}
    for model, sizes in models.items():
        files = weights(tmp_path / "source", model, sizes)
        push_weights(repository, model, files)
        every.update(files)
    return WeightsLock(repository, tuple(every)), every


def test_the_lock_reads_back_and_refuses_what_is_not_one(tmp_path):
    lock = WeightsLock("reg.example.com/embed", (
        WeightFile("encoder", "/models/encoder/1/model.onnx", "sha256:" + "a" * 64, 10),
        WeightFile("head", "/models/head/1/model.onnx", "sha256:" + "a" * 64, 10)))
    assert WeightsLock.from_json(lock.to_json()) == lock
    assert lock.models == ["encoder", "head"] and len(lock.unique()) == 1 and lock.size == 10
    with pytest.raises(WeightsError, match="not a sha256 digest: 'md5:1'"):
        WeightsLock.from_json(json.dumps({"schema": 1, "repository": "r/x", "models": {
            "m": [{"path": "/models/m/1/x", "digest": "md5:1", "size": 1}]}}))
    with pytest.raises(WeightsError, match="schema 2, this supervisor reads schema 1"):
        WeightsLock.from_json(json.dumps({"schema": 2}))


def test_an_artifact_per_model_lands_and_a_second_push_uploads_nothing(registry, tmp_path):
    files = weights(tmp_path, "encoder", {"model.onnx": 4096, "model.onnx.data": 3 << 20})
    repository = f"{registry.host}/artifact-test"
    first = push_weights(repository, "encoder", files)
    assert len(first.uploaded) == 2 and first.uploaded_bytes == 4096 + (3 << 20)
    again = push_weights(repository, "encoder", files)
    assert again.digest == first.digest and again.uploaded == ()
    served = registry_request(ImageReference.parse(f"{repository}:x"),
                              f"manifests/{first.digest}")
    manifest = json.loads(served.body)
    assert hashlib.sha256(served.body).hexdigest() == first.digest.split(":")[1]
    assert manifest["config"]["mediaType"] == CONFIG_MEDIA_TYPE
    assert manifest["annotations"] == {MODEL_ANNOTATION: "encoder"}
    assert [(layer["mediaType"], layer["digest"], layer["annotations"][
        "org.opencontainers.image.title"]) for layer in manifest["layers"]] == [
        (FILE_MEDIA_TYPE, file.digest, file.path) for file in files]


def test_an_empty_cache_is_filled_then_serves_with_the_registry_stopped(own_registry, tmp_path):
    lock, files = pushed_lock(own_registry, tmp_path, encoder={"a.data": 5 << 20, "b.onnx": 999},
                              head={"model.onnx": 12345})
    cache = tmp_path / "cache"
    lines: list[str] = []
    first = ensure_weights(lock, cache=str(cache), environ={}, log=lines.append)
    assert sorted(first.fetched) == sorted(f.digest for f in files) and first.cached == []
    assert first.received == sum(f.size for f in files)
    for file, source in files.items():
        assert blob_path(file.digest, cache).read_bytes() == source.read_bytes()
    assert "weights in place: 3 files" in lines[-1] and "3 fetched" in lines[-1]
    own_registry.stop()
    second = ensure_weights(lock, cache=str(cache), environ={})
    assert second.fetched == [] and second.received == 0 and len(second.cached) == 3


def test_a_corrupted_blob_is_refused_naming_the_operator_and_digest(own_registry, tmp_path):
    lock, files = pushed_lock(own_registry, tmp_path, encoder={"model.onnx.data": 1 << 20})
    (file,) = files
    stored = (own_registry.storage / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
              / file.hex[:2] / file.hex / "data")
    damaged = bytearray(stored.read_bytes())
    damaged[1000] ^= 0xFF
    stored.write_bytes(bytes(damaged))
    cache = tmp_path / "cache"
    with pytest.raises(WeightsError) as refused:
        ensure_weights(lock, cache=str(cache), environ={})
    message = str(refused.value)
    assert "model operator 'encoder'" in message and file.digest in message
    assert "corrupted blob" in message
    assert not blob_path(file.digest, cache).exists()
    assert not partial_path(file.digest, cache).exists()


def test_a_damaged_cache_file_is_fetched_again(own_registry, tmp_path):
    lock, files = pushed_lock(own_registry, tmp_path, encoder={"model.onnx": 70000})
    cache = tmp_path / "cache"
    ensure_weights(lock, cache=str(cache), environ={})
    (file,) = files
    blob = blob_path(file.digest, cache)
    blob.write_bytes(b"\0" * file.size)
    again = ensure_weights(lock, cache=str(cache), environ={})
    assert again.fetched == [file.digest] and blob.read_bytes() == files[file].read_bytes()


SLOW_FETCH = textwrap.dedent("""
    import json, sys, time
    from builder.runtime.supervisor import weights_fetch, weights_registry
    from builder.runtime.supervisor.weights_lock import WeightsLock

    opener = weights_registry.OPENER

    class Slow:
        def open(self, request, timeout):
            response = opener.open(request, timeout=timeout)
            read = response.read
            def slowly(size):
                time.sleep(0.05)
                return read(size)
            response.read = slowly
            return response

    weights_registry.OPENER = Slow()
    lock = WeightsLock.from_json(sys.stdin.read())
    weights_fetch.ensure_weights(lock, cache=sys.argv[1], environ={})
""")


def test_a_fetch_killed_halfway_resumes_where_it_stopped(own_registry, tmp_path):
    lock, files = pushed_lock(own_registry, tmp_path, encoder={"model.onnx.data": 64 << 20})
    (file,) = files
    cache = tmp_path / "cache"
    fetching = subprocess.Popen([sys.executable, "-c", SLOW_FETCH, str(cache)], cwd=ROOT,
                                stdin=subprocess.PIPE, text=True)
    fetching.stdin.write(lock.to_json())
    fetching.stdin.close()
    partial = partial_path(file.digest, cache)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (partial.exists()
                                               and partial.stat().st_size >= 8 << 20):
        time.sleep(0.02)
    fetching.send_signal(signal.SIGKILL)
    fetching.wait()
    had = partial.stat().st_size
    assert 8 << 20 <= had < file.size and not blob_path(file.digest, cache).exists()
    report = ensure_weights(lock, cache=str(cache), environ={})
    assert report.resumed == {file.digest: had}
    assert report.received == file.size - had
    assert blob_path(file.digest, cache).read_bytes() == files[file].read_bytes()


def test_a_registry_that_does_not_answer_fails_clearly_within_the_time_out(tmp_path):
    lock = WeightsLock("127.0.0.1:9/embed", (
        WeightFile("encoder", "/models/encoder/1/model.onnx", "sha256:" + "b" * 64, 10),))
    waits: list[float] = []
    started = time.monotonic()
    with pytest.raises(WeightsError) as failed:
        ensure_weights(lock, cache=str(tmp_path / "cache"),
                       environ={TIMEOUT_VARIABLE: "20"}, sleep=waits.append)
    assert time.monotonic() - started < 20
    message = str(failed.value)
    assert "model operator 'encoder'" in message and "127.0.0.1:9/embed within 20s" in message
    assert waits[:5] == [1, 2, 4, 8, 16] or waits == [1, 2, 4, 8]


def test_a_missing_blob_is_one_error_without_retries(own_registry, tmp_path):
    lock = WeightsLock(f"{own_registry.host}/never-pushed", (
        WeightFile("head", "/models/head/1/model.onnx", "sha256:" + "c" * 64, 10),))
    waits: list[float] = []
    with pytest.raises(WeightsError, match=r"model operator 'head'.*does not hold it \(404\)"):
        ensure_weights(lock, cache=str(tmp_path / "cache"), environ={}, sleep=waits.append)
    assert waits == []


def test_the_registry_variable_points_the_fetch_elsewhere(own_registry, tmp_path):
    lock, _ = pushed_lock(own_registry, tmp_path, head={"model.onnx": 100})
    moved = WeightsLock("registry.invalid:5000/weights-test", lock.files)
    report = ensure_weights(moved, cache=str(tmp_path / "cache"),
                            environ={REGISTRY_VARIABLE: own_registry.host})
    assert len(report.fetched) == 1


def _locked_container(registry: LocalRegistry, tmp_path: Path, monkeypatch, size: int):
    """One pushed file, and the environment of a container whose lock names it: the file's
    entry, its source, the cache (empty)."""
    lock, files = pushed_lock(registry, tmp_path, encoder={"model.onnx": size})
    ((file, source),) = files.items()
    lock_file = tmp_path / "weights.lock.json"
    lock_file.write_text(lock.to_json())
    cache = tmp_path / "cache"
    monkeypatch.setenv(LOCK_VARIABLE, str(lock_file))
    monkeypatch.setenv(CACHE_VARIABLE, str(cache))
    monkeypatch.setattr(drain, "STATE_DIR", tmp_path / "drain")
    return file, source, cache


def test_the_supervisor_starts_the_server_only_once_the_weights_are_in_place(
        own_registry, tmp_path, monkeypatch):
    file, _, cache = _locked_container(own_registry, tmp_path, monkeypatch, 2048)
    monkeypatch.setenv("TRITON_BUILDER_METRICS_PORT", "0")
    blob = str(blob_path(file.digest, cache))
    server = [sys.executable, "-c",
              f"import os, sys; sys.exit(0 if os.path.exists({blob!r}) else 9)"]
    assert main(server) == 0
    own_registry.stop()
    blob_path(file.digest, cache).unlink()
    monkeypatch.setenv(TIMEOUT_VARIABLE, "2")
    started = tmp_path / "started"
    assert main([sys.executable, "-c", f"open({str(started)!r}, 'w')"]) == \
        WEIGHTS_FAILED
    assert not started.exists()


def test_fetch_weights_fills_the_cache_and_exits_as_an_init_container(
        own_registry, tmp_path, monkeypatch):
    file, source, cache = _locked_container(own_registry, tmp_path, monkeypatch, 4096)
    assert main(["--fetch-weights"]) == 0
    assert blob_path(file.digest, cache).read_bytes() == source.read_bytes()
    own_registry.stop()
    blob_path(file.digest, cache).write_bytes(b"damaged")
    monkeypatch.setenv(TIMEOUT_VARIABLE, "2")
    assert main(["--fetch-weights"]) == WEIGHTS_FAILED
    monkeypatch.setenv(LOCK_VARIABLE, str(tmp_path / "no-lock.json"))
    assert main(["--fetch-weights"]) == 0, "an image with its weights inside has none to fetch"


def test_doctor_finds_the_cached_files_no_lock_names(own_registry, tmp_path):
    lock, _ = pushed_lock(own_registry, tmp_path, encoder={"model.onnx": 100})
    cache = tmp_path / "cache"
    ensure_weights(lock, cache=str(cache), environ={})
    stray = blob_path("sha256:" + "d" * 64, cache)
    stray.write_bytes(b"old")
    assert unnamed_blobs(cache, [f.digest for f in lock.files]) == [stray]
    assert unnamed_blobs(cache, []) == sorted([stray, blob_path(lock.files[0].digest, cache)])


class _GuardedRegistry(BaseHTTPRequestHandler):
    """A registry behind a token service whose blobs live on another host (blob storage),
    as Docker Hub's and cloud registries' do: what the real registry here does not do."""

    blob = b""
    seen: list[tuple[str, str | None]] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        port = self.server.server_address[1]
        self.seen.append((url.path, self.headers.get("Authorization")))
        if url.path == "/token":
            query = dict(urllib.parse.parse_qsl(url.query))
            good = (self.headers.get("Authorization") == "Basic " + base64.b64encode(
                b"puller:s3cret").decode() and query["scope"] == "repository:team/app:pull")
            return self._send(200 if good else 401, json.dumps({"token": "t0k"}).encode())
        if url.path.startswith("/v2/team/app/blobs/"):
            if self.headers.get("Authorization") != "Bearer t0k":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}'
                                 f'/token",service="test"')
                self.end_headers()
                return None
            self.send_response(307)
            self.send_header("Location", f"http://localhost:{port}/storage/blob")
            self.end_headers()
            return None
        if url.path == "/storage/blob":
            return self._send(400 if self.headers.get("Authorization") else 200, self.blob)
        return self._send(404, b"")

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_credentials_go_through_the_token_service_and_not_to_blob_storage(tmp_path):
    _GuardedRegistry.blob = os.urandom(5000)
    _GuardedRegistry.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GuardedRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    digest = "sha256:" + hashlib.sha256(_GuardedRegistry.blob).hexdigest()
    lock = WeightsLock(f"127.0.0.1:{server.server_address[1]}/team/app", (
        WeightFile("encoder", "/models/encoder/1/model.onnx", digest, 5000),))
    try:
        with pytest.raises(WeightsError, match=r"token service refused .* set "
                                               r"TRITON_BUILDER_WEIGHTS_AUTH"):
            ensure_weights(lock, cache=str(tmp_path / "none"), environ={})
        report = ensure_weights(lock, cache=str(tmp_path / "cache"),
                                environ={AUTH_VARIABLE: "puller:s3cret"})
    finally:
        server.shutdown()
    assert report.fetched == [digest]
    assert blob_path(digest, tmp_path / "cache").read_bytes() == _GuardedRegistry.blob
    assert ("/storage/blob", None) in _GuardedRegistry.seen
