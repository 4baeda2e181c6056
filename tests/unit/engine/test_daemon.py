"""When the builder may start a Docker engine: only on a machine that has none."""

from __future__ import annotations

import pytest

from builder.engine.daemon import EngineError, ensure_engine, running_dockerd


def _proc(root, names):
    root.mkdir(parents=True)
    for pid, name in names.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "comm").write_text(name + "\n")
    (root / "self").mkdir()
    return root


def test_a_running_dockerd_is_found_in_proc(tmp_path):
    found = _proc(tmp_path / "a", {1: "init", 40: "dockerd", 41: "containerd"})
    assert running_dockerd(found) == 40
    assert running_dockerd(_proc(tmp_path / "b", {1: "init", 41: "containerd"})) is None


def test_a_configured_docker_host_is_never_replaced_by_a_new_engine(tmp_path, monkeypatch):
    """``DOCKER_HOST`` at a socket that does not exist: the error names it, at once."""
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError(f"an engine was started: {args}")

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    monkeypatch.setattr(subprocess, "Popen", refuse)
    with pytest.raises(EngineError, match=r"DOCKER_HOST=unix://.*none\.sock .* does not exist"):
        ensure_engine()
