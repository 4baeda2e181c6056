"""A custom ``base_image=`` whose own Python is not the release facts': probed, then adopted or
refused, before the model repository is written.

Real parts: the CPU base on Debian trixie (Python 3.13, Triton 2.51 from the ``nvidia-pytriton``
wheel) passed as ``base_image=`` of the CPU release, whose facts say Python 3.11 (bookworm), and
probed by the same probe the environment step's ``image_target`` uses
(:mod:`builder.base.image_probe`). Before this check, the build went
on as native 3.11 and stopped in the environment step with pip's ``ResolutionImpossible``. The
interpreter the bridged environment carries comes from the Debian bookworm OS image of the test
bed (Python 3.11), standing in for ``python:3.11-slim-trixie`` from Docker Hub.
"""

from __future__ import annotations

import sys

import pytest

from builder import build_docker_image
from builder.base.releases import resolve
from builder.bridge import BasePythonError, fit_base_python, plan_python
from tests.support.example_inputs import EXAMPLES

pytestmark = [pytest.mark.slow, pytest.mark.alongside]


@pytest.fixture(scope="module")
def trixie(docker_client, trixie_base_image):
    if sys.version_info[:2] == (3, 13):
        pytest.skip("this builder is Python 3.13, the trixie base's own: nothing differs")
    return trixie_base_image


def test_the_probed_python_gives_the_plan_that_base_python_would(docker_client, trixie):
    facts = resolve(None, base_image=trixie)
    assert facts.python_version == "3.11"  # the CPU release's facts: bookworm
    image_id = docker_client.images.get(trixie).id
    release, plan = fit_base_python(plan_python(facts), docker_client, image_id)
    stated = resolve(None, base_image=trixie, base_python="3.13")
    assert release == plan.release == stated
    assert plan == plan_python(stated)
    assert plan.bridged and plan.stub.kind == "pytriton-wheel"


def test_an_image_without_a_stub_keeps_the_facts(docker_client, os_image):
    """The Debian OS image (python3 3.11, no Triton): its python3 says nothing about a stub,
    so 22.12's facts (Python 3.8) stand and the plan is unchanged."""
    facts = resolve("11.8", base_image=os_image)
    plan = plan_python(facts)
    release, kept = fit_base_python(plan, docker_client, docker_client.images.get(os_image).id)
    assert release == facts and kept == plan


def test_a_base_python_with_no_route_is_refused_before_the_repository(docker_client, trixie):
    log: list[str] = []
    pipeline, _ = EXAMPLES["text_embedding"]
    with pytest.raises(BasePythonError) as refused:
        build_docker_image(pipeline, "triton-builder-test/gpu-rows-trixie-refused:1",
                           base_image=trixie, bridge=False, client=docker_client,
                           on_log=log.append)
    message = str(refused.value)
    assert trixie in message and "Python 3.13" in message and "Python 3.11" in message
    assert "base_python='3.13'" in message and "another base image" in message
    assert not any("model repository" in line for line in log), log


def test_a_custom_base_with_another_python_is_adopted_and_serves(docker_client, trixie,
                                                                os_image):
    pipeline, inputs = EXAMPLES["text_embedding"]
    reference = "triton-builder-test/gpu-rows-trixie-adopted:1"
    built = build_docker_image(pipeline, reference, base_image=trixie, interpreter_image=os_image,
                               verify_calls=[(x,) for x in inputs[:3]], client=docker_client)
    try:
        assert built.release.python_version == "3.13" and built.release.image == trixie
        assert "pipeline" in built.verification.models
    finally:
        docker_client.images.remove(reference, force=True)
