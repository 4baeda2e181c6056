"""One platform's build: who its image runs as."""

from __future__ import annotations

from builder.base import resolve
from builder.job.platform_build import _user


def test_images_that_extract_a_bridged_environment_at_start_run_as_root():
    """22.12 extracts its environment from an archive at every start, after the python backend
    has probed (and, as root only, chmod-ed) a bridged stub that cannot load yet: those images
    run as root unless the user says otherwise; every release that takes a directory does not."""
    said = []
    assert _user(None, resolve("11.8"), True, said.append) == "root"
    assert "extracts its environment at every start" in said[0]
    assert _user("triton", resolve("11.8"), True, said.append) == "triton"
    assert _user(None, resolve("11.8"), False, said.append) is None, "the release's own stub"
    assert _user(None, resolve(None), True, said.append) is None, "an unpacked environment"
