"""The one time a build writes into what it makes: ``SOURCE_DATE_EPOCH``, else a fixed date.

Why: two builds of the same inputs must give the same image, byte for byte, so that a digest says
whether two images hold the same thing and a layer cache on another machine can hit. Every time
stamp the builder would otherwise take from the clock — the mtimes in a packed environment and in
the build context, the image's ``created`` and its history, the ``org.opencontainers.image.created``
label — is this one instead. ``SOURCE_DATE_EPOCH`` is the reproducible-builds convention
(https://reproducible-builds.org/specs/source-date-epoch/): CI sets it to the last commit's time
to date an image by its sources. Without it the date is :data:`DEFAULT_EPOCH`, 2000-01-01 — the
"portable" mtime of Bazel's rules_pkg, late enough that no tar or zip tool calls it implausible.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

from builder.errors import TritonBuilderError

DEFAULT_EPOCH = 946684800
"""2000-01-01T00:00:00Z."""


class BuildEpochError(TritonBuilderError, ValueError):
    """``SOURCE_DATE_EPOCH`` is set but not a whole number of seconds since 1970."""


def build_epoch() -> int:
    """Seconds since 1970: ``SOURCE_DATE_EPOCH`` when set, else :data:`DEFAULT_EPOCH`."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not value:
        return DEFAULT_EPOCH
    if not value.isdigit():
        raise BuildEpochError(f"SOURCE_DATE_EPOCH={value!r} is not a whole number of seconds "
                              f"since 1970 (for example: git log -1 --format=%ct)")
    return int(value)


def rfc3339(epoch: int) -> str:
    """``2000-01-01T00:00:00Z``: the form of ``created`` in image configs and OCI labels."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
