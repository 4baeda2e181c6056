"""Putting a lock's weights in the node's cache before the server starts.

For each file of the lock (:mod:`.weights_lock`), once per digest: a file the cache holds is
used once its digest is read again; else it is fetched from the registry
(``GET /v2/<name>/blobs/<digest>``, the distribution API every OCI registry serves), into
``partial/<hex>``, hashed as it arrives, and renamed into ``blobs/`` only when the digest
matches. A fetch that stops — a dropped connection, a registry restarting, a container killed
halfway — goes on from where it stopped: the next attempt (or the next start, the partial file
being in the cache volume) asks for ``Range: bytes=<have>-``. Failures worth retrying
(refused or reset connections, time-outs, 5xx, 429) are retried with back-off until the
deadline (:data:`TIMEOUT_VARIABLE`); the others end at once. Two containers of a node that
start together fetch each digest once: a lock file per digest serialises them.

Every failure is one :class:`~.weights_lock.WeightsError` naming the model operator, the file
and its digest, and the supervisor then exits without starting the server: a container is
never ready with a model half loaded.

Where from, and with which credentials: :mod:`.weights_registry`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .weights_lock import (
    CACHE_DIR,
    READ_SIZE,
    WeightFile,
    WeightsError,
    WeightsLock,
    blob_path,
    hash_prefix,
    partial_path,
    verify_blob,
)
from .weights_registry import AUTH_VARIABLE, Source, open_blob

TIMEOUT_VARIABLE = "TRITON_BUILDER_WEIGHTS_TIMEOUT_S"
TIMEOUT_S = 1800.0
"""How long all the fetches of a start may take, retries included."""
READ_TIMEOUT_S = 60.0
"""How long one read may wait for bytes before the attempt counts as failed."""
MAX_BACKOFF_S = 30.0
RETRIED_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass
class FetchReport:
    """What a start did for the weights: files found in the cache, files fetched, bytes
    received from the registry (a resumed fetch counts only what it still needed)."""

    cached: list[str] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)
    received: int = 0
    resumed: dict[str, int] = field(default_factory=dict)
    """digest → the bytes a fetch already had when it went on."""
    attempts: int = 0


def ensure_weights(lock: WeightsLock, *, cache: str = CACHE_DIR,
                   environ: Mapping[str, str] | None = None,
                   log: Callable[[str], None] = lambda line: None,
                   sleep: Callable[[float], None] = time.sleep) -> FetchReport:
    """Every file of ``lock`` in ``cache``, checked: fetched where missing (see the module)."""
    environ = os.environ if environ is None else environ
    timeout = float(environ.get(TIMEOUT_VARIABLE) or TIMEOUT_S)
    deadline = time.monotonic() + timeout
    source = Source.of(lock, environ)
    report = FetchReport()
    for directory in (Path(cache) / "blobs" / "sha256", Path(cache) / "partial"):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise WeightsError(f"cannot write the weights cache {cache}: {error.strerror} "
                               f"(mount a writable volume there)") from None
    for file in lock.unique():
        with _locked(Path(cache) / "partial" / f"{file.hex}.lock"):
            if verify_blob(file, cache):
                report.cached.append(file.digest)
                continue
            started = time.monotonic()
            _fetch(file, source, cache, deadline, timeout, report, log, sleep)
            report.fetched.append(file.digest)
            log(f"weights of {file.model!r}: {Path(file.path).name} ({file.size / 1e6:.1f} MB, "
                f"{file.digest[:19]}…) fetched from {source.registry}/{source.name} in "
                f"{time.monotonic() - started:.1f}s"
                + (f", resumed at {report.resumed[file.digest] / 1e6:.1f} MB"
                   if file.digest in report.resumed else ""))
    log(f"weights in place: {len(lock.unique())} files, {lock.size / 1e6:.1f} MB "
        f"({len(report.cached)} from the cache, {len(report.fetched)} fetched)")
    return report


def _fetch(file: WeightFile, source: Source, cache: str, deadline: float, timeout: float,
           report: FetchReport, log: Callable[[str], None],
           sleep: Callable[[float], None]) -> None:
    partial = partial_path(file.digest, cache)
    failures = 0
    while True:
        report.attempts += 1
        try:
            _fetch_once(file, source, partial, deadline, report)
            break
        except _Transient as error:
            failures += 1
            wait = min(MAX_BACKOFF_S, 2.0 ** (failures - 1))
            if time.monotonic() + wait >= deadline:
                raise WeightsError(
                    f"{file.describe()}: could not fetch it from "
                    f"{source.registry}/{source.name} within {timeout:g}s "
                    f"({failures} attempts; last: {error})") from None
            log(f"weights of {file.model!r}: fetch failed ({error}); retrying in {wait:g}s")
            sleep(wait)
    found = _finish(partial, file)
    if found != file.digest:
        partial.unlink()
        raise WeightsError(f"{file.describe()}: the registry {source.registry}/{source.name} "
                           f"served content of digest {found}: refused (a corrupted blob)")
    os.replace(partial, blob_path(file.digest, cache))


def _fetch_once(file: WeightFile, source: Source, partial: Path, deadline: float,
                report: FetchReport) -> None:
    have = partial.stat().st_size if partial.exists() else 0
    if have > file.size:
        partial.unlink()
        have = 0
    if have == file.size:
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    read_timeout = max(1.0, min(READ_TIMEOUT_S, deadline - time.monotonic()))
    try:
        response = open_blob(source, source.blob_url(file.digest), headers, read_timeout)
    except urllib.error.HTTPError as error:
        if error.code in RETRIED_STATUS:
            raise _Transient(f"HTTP {error.code}") from None
        if error.code == 416 and have:
            partial.unlink()
            raise _Transient("the registry refused the range; starting over") from None
        raise WeightsError(_refusal(file, source, error.code)) from None
    except (urllib.error.URLError, OSError) as error:
        raise _Transient(_reason(error)) from None
    with response:
        if have and response.status != 206:
            have = 0
        elif have:
            report.resumed[file.digest] = have
        try:
            with open(partial, "ab" if have else "wb") as out:
                while True:
                    chunk = response.read(READ_SIZE)
                    if not chunk:
                        break
                    out.write(chunk)
                    report.received += len(chunk)
                    if time.monotonic() > deadline:
                        raise _Transient("the time-out passed during the transfer")
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise WeightsError(f"{file.describe()}: the weights cache is full "
                                   f"({error.strerror})") from None
            raise _Transient(_reason(error)) from None
    if partial.stat().st_size < file.size:
        raise _Transient(f"the transfer stopped at {partial.stat().st_size} of {file.size} "
                         f"bytes")


def _finish(partial: Path, file: WeightFile) -> str:
    if partial.stat().st_size != file.size:
        return f"(a file of {partial.stat().st_size} bytes, not {file.size})"
    return "sha256:" + hash_prefix(partial).hexdigest()


class _Transient(Exception):
    """An attempt failed in a way worth another."""


def _refusal(file: WeightFile, source: Source, status: int) -> str:
    where = f"{source.registry}/{source.name}"
    if status == 404:
        return (f"{file.describe()}: {where} does not hold it (404): were the weights pushed "
                f"with the image?")
    if status in (401, 403):
        return f"{file.describe()}: {where} refused to serve it ({status}): set {AUTH_VARIABLE}"
    return f"{file.describe()}: {where} answered {status}"


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None) or error
    if isinstance(reason, socket.timeout):
        return "timed out"
    return str(reason)


class _locked:
    """An exclusive ``flock`` on ``path`` for the ``with`` block."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.stream = open(self.path, "a")
        fcntl.flock(self.stream, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self.stream, fcntl.LOCK_UN)
        self.stream.close()
