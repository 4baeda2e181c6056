"""Where a model environment will run: a Triton image, or this host for host-process servers.

A packed environment only works where its Python minor equals the python backend stub's, its
base interpreter exists at the same absolute path, and its compiled wheels fit the C library.
All of that is read from the target itself — a throwaway container of the image, or the host
interpreter — rather than assumed, and the same object runs the build commands there, so a
venv is made by the very interpreter that will run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from builder.base.image_probe import IMAGE_STUB, PROBE, probe_image, run_in_image
from builder.environment.errors import TargetError
from builder.tritonserver.wheel import TRITON_VERSION

_HOST_VARIABLES_DROPPED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV",
                           "CONDA_PREFIX")


@dataclass(frozen=True)
class EnvironmentTarget:
    """The interpreter an environment is built from and the stub that will load it."""

    python_version: str
    """``major.minor`` of the target's ``python3`` (the interpreter venvs are made from)."""
    full_python_version: str
    python_executable: str
    """Absolute path of that interpreter where the environment runs."""
    interpreter_dirs: tuple[str, ...]
    """Directories holding it (as named and resolved): a venv's ``home`` must be one of them."""
    stub_python_version: str
    """``major.minor`` of the Python the python backend stub is linked against."""
    machine: str
    glibc_version: str
    triton_version: str | None
    image: str | None = None
    image_id: str | None = None
    client: docker.DockerClient | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        return f"image {self.image}" if self.image else "this host"

    def require_matching_stub(self) -> None:
        """Refuse a target whose interpreter cannot make environments its stub loads."""
        if self.python_version != self.stub_python_version:
            raise TargetError(
                f"{self.where}: python3 is Python {self.python_version} ({self.python_executable})"
                f" but the python backend stub is built for Python {self.stub_python_version}; "
                f"an environment made from this interpreter would not load. Build from an image "
                f"(or host Python) whose python3 is {self.stub_python_version}, or use a conda "
                f"environment that brings its own Python {self.stub_python_version}."
            )

    def platform_tags(self) -> list[str]:
        """Wheel platform tags the target can run, most specific first (for ``pip download``)."""
        return platform_tags(self.glibc_version, self.machine)

    def fingerprint(self) -> str:
        """What an environment built for this target depends on (hashed into the cache key)."""
        return json.dumps([self.full_python_version, self.python_executable,
                           self.stub_python_version, self.machine, self.glibc_version,
                           self.image_id or f"host:{os.path.realpath(self.python_executable)}"])

    def run(self, argv: list[str], *, what: str, binds: Iterable[Path] = (),
            env: Mapping[str, str] | None = None) -> str:
        """Run ``argv`` on the target and return its standard output.

        In an image, a container runs it with no network, as this user, with each path of
        ``binds`` mounted at the same absolute path; on the host it is a plain process with
        the caller's Python variables removed. A non-zero exit raises with the command's output.
        """
        if self.image is None:
            return _run_on_host(argv, what=what, env=env)
        assert self.client is not None, "an image target needs its Docker client"
        return run_in_image(self.client, self.image, argv, what=what, binds=binds, env=env,
                            error=TargetError)


def platform_tags(glibc_version: str, machine: str) -> list[str]:
    """Wheel platform tags a glibc system runs, most specific first."""
    major, minor = (int(part) for part in glibc_version.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 16, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{machine}" for floor, name in legacy.items() if minor >= floor]
    return tags + [f"linux_{machine}"]


def image_target(client: docker.DockerClient, image: str, *,
                 stub_path: str = IMAGE_STUB) -> EnvironmentTarget:
    """Probe ``image`` (a throwaway container) for its Python, C library and stub.

    The answer is kept per image ID: an ID is the hash of the image's content, so the same ID
    always holds the same Python and stub, and a rebuild skips the container.
    """
    try:
        image_id = client.images.get(image).id
    except docker.errors.ImageNotFound as error:
        raise TargetError(f"image {image} is not on this Docker engine: build or pull it "
                          f"first") from error
    facts = probe_image(client, image, image_id, stub_path,
                        what="find python3 and the python backend stub", error=TargetError)
    if not facts["stub_found"]:
        raise TargetError(f"image {image} has no python backend stub at {stub_path}: is it a "
                          f"Triton image? Pass stub_path= if it lives elsewhere")
    if not facts["stub_python"]:
        raise TargetError(f"image {image}: cannot tell which libpython {stub_path} links")
    return _target(facts, facts["stub_python"], image=image, image_id=image_id, client=client)


def interpreter_target(client: docker.DockerClient, image: str, *, python_version: str,
                       triton_version: str | None = None) -> EnvironmentTarget:
    """An image that holds the Python a bridged environment carries (no Triton, no stub).

    Its ``python3`` must be ``python_version``: the bridged stub is built for that Python.
    ``triton_version`` is the release's (what the stub speaks, which decides numpy's range).
    """
    try:
        image_id = client.images.get(image).id
    except docker.errors.ImageNotFound:
        try:
            image_id = client.images.pull(image).id
        except docker.errors.APIError as error:
            raise TargetError(
                f"the interpreter image {image} is not on this engine and cannot be pulled "
                f"({error.explanation or error}): pass interpreter_image= (an image whose "
                f"python3 is Python {python_version}) or set TRITON_BUILDER_INTERPRETER_IMAGE"
            ) from error
    facts = probe_image(client, image, image_id, "", what="find python3", error=TargetError)
    if facts["version"] != python_version:
        raise TargetError(f"the interpreter image {image} has Python {facts['version']}, not "
                          f"{python_version}: pick an image whose python3 is {python_version}")
    facts = {**facts, "triton_version": triton_version}
    return _target(facts, python_version, image=image, image_id=image_id, client=client)


def host_target(python: str | os.PathLike | None = None, *,
                stub_python_version: str | None = None) -> EnvironmentTarget:
    """This host as the target, for host-process servers (``tritonserver.host_process``).

    ``python`` is the interpreter environments are made from (default: this one). The host
    server runs the stub for the Python running it, which is the default stub version.
    """
    python = str(python or sys.executable)
    output = _run_on_host([python, "-c", PROBE, ""], what="probe the host Python", env=None)
    facts = _facts(output, "this host")
    stub = stub_python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    facts["triton_version"] = facts["triton_version"] or TRITON_VERSION
    return _target(facts, stub, image=None, image_id=None, client=None)


def _target(facts: dict, stub: str, *, image: str | None, image_id: str | None,
            client: docker.DockerClient | None) -> EnvironmentTarget:
    glibc = facts["glibc"].removeprefix("glibc ").strip()
    if not glibc:
        raise TargetError(f"{'image ' + image if image else 'this host'} has no glibc (musl?): "
                          f"Triton's python backend needs a glibc system")
    return EnvironmentTarget(
        python_version=facts["version"], full_python_version=facts["full_version"],
        python_executable=facts["executable"],
        interpreter_dirs=tuple(facts["interpreter_dirs"]), stub_python_version=stub,
        machine=facts["machine"], glibc_version=glibc, triton_version=facts["triton_version"],
        image=image, image_id=image_id, client=client,
    )


def _facts(output: str, where: str) -> dict:
    try:
        return json.loads(output.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as error:
        raise TargetError(f"{where}: unreadable probe output:\n{output[-2000:]}") from error


def _run_on_host(argv: list[str], *, what: str, env: Mapping[str, str] | None) -> str:
    variables = {key: value for key, value in os.environ.items()
                 if key not in _HOST_VARIABLES_DROPPED and not key.startswith("PIP_")}
    variables.update(env or {})
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=variables)
    except OSError as error:
        raise TargetError(f"could not {what} on this host: {error}") from error
    if result.returncode != 0:
        raise TargetError(f"could not {what} on this host (exit {result.returncode}):\n"
                          f"{_tail(result.stdout + result.stderr)}")
    return result.stdout


def _tail(text: str, characters: int = 6000) -> str:
    return text.strip()[-characters:]
