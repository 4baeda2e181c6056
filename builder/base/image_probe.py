"""What a Triton image holds, read from a throwaway container of it rather than assumed.

Its ``python3`` (version, executable, directories), machine, C library, ``TRITON_SERVER_VERSION``
and the Python its python backend stub links (the ``libpythonX.Y`` named in the binary). The
base stage reads it to hold a base image against the release facts
(:mod:`builder.base.base_python`); the environment step reads the same facts to build the
environment there (:mod:`builder.environment.target`). Answers are kept per image ID: an ID is
the hash of the image's content, so the same ID always holds the same Python and stub.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import docker
import docker.errors

from builder.cache import cache_dir
from builder.engine.container_lifecycle import create_container, remove_container
from builder.engine.ownership import BuildOwner
from builder.errors import TritonBuilderError

IMAGE_STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"
"""Where NGC images (and our CPU base image) keep the python backend stub."""

PROBE = r"""
import json, os, platform, re, sys
stub = sys.argv[1]
linked = None
if stub and os.path.exists(stub):
    with open(stub, "rb") as binary:
        found = re.search(rb"libpython(3\.\d+)\.so", binary.read())
    linked = found.group(1).decode() if found else None
executable = sys.executable
print(json.dumps({
    "version": "%d.%d" % sys.version_info[:2], "full_version": platform.python_version(),
    "executable": executable,
    "interpreter_dirs": sorted({os.path.dirname(executable),
                                os.path.dirname(os.path.realpath(executable))}),
    "machine": platform.machine(), "glibc": os.confstr("CS_GNU_LIBC_VERSION") or "",
    "stub_found": bool(stub) and os.path.exists(stub), "stub_python": linked,
    "triton_version": os.environ.get("TRITON_SERVER_VERSION"),
}))
"""
"""Run by the image's ``python3`` with the stub's path (or ``""``) as its argument."""


class ImageProbeError(TritonBuilderError, RuntimeError):
    """A command in a throwaway container of an image failed, or printed no answer."""


def probe_image(client: docker.DockerClient, image: str, image_id: str, stub_path: str, *,
                what: str, error: type[Exception] = ImageProbeError) -> dict:
    """The facts :data:`PROBE` prints in ``image`` (cached per ``image_id`` and stub path)."""
    facts = _cached_image_facts(image_id, stub_path)
    if facts is None:
        output = run_in_image(client, image, ["python3", "-c", PROBE, stub_path], what=what,
                              binds=(), env=None, error=error)
        try:
            facts = json.loads(output.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError) as unreadable:
            raise error(f"image {image}: unreadable probe output:\n{output[-2000:]}"
                        ) from unreadable
        _cache_image_facts(image_id, stub_path, facts)
    return facts


def run_in_image(client: docker.DockerClient, image: str, argv: list[str], *, what: str,
                 binds: Iterable[Path], env: Mapping[str, str] | None,
                 error: type[Exception] = ImageProbeError) -> str:
    """Run ``argv`` in a throwaway container of ``image`` (no network, this user, each of
    ``binds`` at its own path) and return its standard output; ``error`` for a failure."""
    volumes = {str(path): {"bind": str(path), "mode": "rw"} for path in binds}
    try:
        container = create_container(
            client, image, owner=BuildOwner.here(), start=True, entrypoint=argv[:1],
            command=argv[1:], volumes=volumes, environment=dict(env or {}),
            network_disabled=True, user=f"{os.getuid()}:{os.getgid()}", working_dir="/tmp")
    except docker.errors.APIError as failure:
        raise error(f"could not start a container of {image} to {what}: "
                    f"{failure.explanation or failure}") from failure
    try:
        status = container.wait()
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        remove_container(client, container.id)
    code = status.get("StatusCode", -1)
    if code != 0:
        raise error(f"could not {what} in image {image} (exit {code}):\n"
                    f"{(stdout + stderr).strip()[-6000:]}")
    return stdout


def _facts_file(image_id: str, stub_path: str) -> Path:
    key = hashlib.sha256("\0".join([image_id, stub_path, PROBE]).encode()).hexdigest()
    return cache_dir("targets") / f"{key[:32]}.json"


def _cached_image_facts(image_id: str, stub_path: str) -> dict | None:
    try:
        return json.loads(_facts_file(image_id, stub_path).read_text())
    except (OSError, ValueError):
        return None


def _cache_image_facts(image_id: str, stub_path: str, facts: dict) -> None:
    path = _facts_file(image_id, stub_path)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(facts, sort_keys=True))
    partial.replace(path)
