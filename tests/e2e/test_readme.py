"""The README's code runs: every Python block, and "Your first image" as a reader follows it.

Issue 33: the README's model operator example built a repository Triton refused. Its pipeline
file is now complete, and this test writes it as ``my_pipeline.py`` and runs the three commands
under it (``image``, ``serve``, ``infer``) as they are written; what it changes is only what a
shared test machine needs: the image's tag (``embed:1`` may be anyone's) and the host ports
(8000-8002 may be taken). The served answer must be the in-process one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import docker.errors
import numpy as np
import pytest

from builder.tritonserver.host_process import free_ports
from builder.verify.equality import check_same
from tests.support.readme import (
    FIRST_IMAGE,
    first_image_commands,
    first_image_file,
    load_first_image,
    python_blocks,
)

pytestmark = pytest.mark.alongside

README_TAG = "embed:1"
WALK_THROUGH_TAG = "triton-builder-test/readme-first-image:1"


def test_every_python_block_runs(text_embedding_image, tmp_path, monkeypatch):
    """In order, each in a fresh namespace, from a scratch directory (the API block writes
    ``models/``). The first block builds the example's image: the one the test bed built as
    ``text_embedding_image``, so it is found up to date by its content."""
    monkeypatch.chdir(tmp_path)
    ran = []
    for block in python_blocks():
        code = block.code
        if not block.section:  # the headline: build_docker_image(pipeline, image_name=...)
            assert f'"{README_TAG}"' in code, code
            code = code.replace(f'"{README_TAG}"', repr(text_embedding_image))
        exec(compile(code, f"README.md:{block.line}", "exec"),  # noqa: S102 - the README's own
             {"__name__": f"readme_{block.line}"})
        ran.append(f"{block.section or 'headline'} (line {block.line})")
    assert len(ran) >= 3 and any(FIRST_IMAGE in r for r in ran), ran
    assert (tmp_path / "models" / "text_encoder" / "config.pbtxt").exists()
    print("\n".join(ran))


def test_your_first_image_builds_serves_and_answers_as_in_process(cpu_base_image, docker_client,
                                                                  tmp_path):
    filename, code = first_image_file()
    (tmp_path / filename).write_text(code)
    image, serve, infer = first_image_commands()
    assert [command[:2] for command in (image, serve, infer)] == [
        ["triton-builder", "image"], ["triton-builder", "serve"], ["triton-builder", "infer"]]
    http, grpc, metrics = free_ports(3)
    image = [WALK_THROUGH_TAG if arg == README_TAG else arg for arg in image]
    serve = [WALK_THROUGH_TAG if arg == README_TAG else arg for arg in serve] + [
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    assert ":8001/" in infer[2], infer
    infer = [*infer[:2], infer[2].replace(":8001/", f":{grpc}/"), *infer[3:]]
    container = None
    try:
        assert _run(image, tmp_path).stdout.strip() == WALK_THROUGH_TAG
        container = _run(serve, tmp_path).stdout.strip()
        answer = json.loads(_run(infer, tmp_path).stdout)
        text = infer[infer.index("-i") + 1].partition("=")[2]
        (tmp_path / "reference").mkdir()
        expected = load_first_image(tmp_path / "reference").pipeline(text)
        assert expected.shape == (16,)
        check_same(np.asarray(answer, dtype=np.float32), expected)
    finally:
        if container:
            docker_client.containers.get(container).remove(force=True)
        try:
            docker_client.images.remove(WALK_THROUGH_TAG, force=True)
        except docker.errors.ImageNotFound:
            pass


def _run(command: list[str], directory: Path) -> subprocess.CompletedProcess:
    """A README command, run by this environment's console script from ``directory``."""
    program = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert program, f"{command[0]} is not installed beside {sys.executable}"
    result = subprocess.run([program, *command[1:]], cwd=directory, capture_output=True,
                            text=True, timeout=900, env=dict(os.environ))
    assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stderr}"
    return result
