"""Reading files out of an image without running it.

A container is *created* from the image (never started: no entrypoint runs, nothing of the image
executes, an image without a shell or a command works too), the files are fetched with the
engine's archive endpoint and the container is removed. That costs a fraction of a second and
works the same on an NGC image, our CPU base or a serving image.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

import docker
import docker.errors

from builder.engine.container_lifecycle import throwaway_container
from builder.engine.daemon import EngineError

_NO_COMMAND = ["/triton-builder-never-started"]
"""Creating a container of an image without CMD needs a command; it is never run."""


def read_image_files(client: docker.DockerClient, image: str,
                     paths: Sequence[str]) -> dict[str, bytes | None]:
    """The content of each of ``paths`` in ``image`` (None where the image has no such file).

    A path that is a symlink is followed inside the image, as the container would see it.
    Raises :class:`~builder.engine.daemon.EngineError` when the engine cannot create the
    container or read from it (and ``docker.errors.ImageNotFound`` for an unknown image).
    """
    try:
        with throwaway_container(client, image, command=_NO_COMMAND,
                                 network_disabled=True) as container:
            return {path: _read(container, path) for path in paths}
    except docker.errors.ImageNotFound:
        raise
    except docker.errors.APIError as error:
        raise EngineError(f"cannot read {', '.join(paths)} from a container of {image}: "
                          f"{error}") from error


def _read(container, path: str, *, hops: int = 8) -> bytes | None:
    try:
        chunks, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        member = archive.next()
        if member is None:
            return None
        if member.issym() and hops:
            target = member.linkname
            if not target.startswith("/"):
                target = f"{path.rsplit('/', 1)[0]}/{target}"
            return _read(container, target, hops=hops - 1)
        extracted = archive.extractfile(member) if member.isfile() else None
        return extracted.read() if extracted is not None else None


def copy_image_directory(client: docker.DockerClient, image: str, path: str,
                         dest: Path) -> Path:
    """Copy the directory ``path`` of ``image`` (its whole tree) to ``dest``, which must not
    exist; returns ``dest``. Members that would land outside ``dest`` are refused (tarfile's
    ``tar`` filter: a packed environment's absolute symlinks, into the image, stay as they
    are)."""
    if dest.exists():
        raise FileExistsError(dest)
    try:
        with throwaway_container(client, image, command=_NO_COMMAND,
                                 network_disabled=True) as container:
            chunks, _ = container.get_archive(path.rstrip("/") + "/.")
            staging = dest.with_name(f".{dest.name}.partial")
            staging.mkdir(parents=True)
            try:
                with tempfile.TemporaryFile(dir=dest.parent) as spooled:
                    for chunk in chunks:  # an environment runs to gigabytes: not in memory
                        spooled.write(chunk)
                    spooled.seek(0)
                    with tarfile.open(fileobj=spooled) as archive:
                        archive.extractall(staging, filter="tar")
                staging.rename(dest)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except docker.errors.ImageNotFound:
        raise
    except docker.errors.APIError as error:
        raise EngineError(f"cannot copy {path} from a container of {image}: {error}") from error
    return dest
