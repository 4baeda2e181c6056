"""A base image's own Python, read from the image, against the release facts.

The release table (:mod:`builder.base.releases`) says which Python each release's python backend
runs, and ``base_image=`` keeps those facts while building on another image — a mirror, or a
custom build. Where that image's stub runs another Python (a Python 3.13 CPU base passed without
``base_python='3.13'``), a build planned on the facts goes on as native and stops late, in the
environment step, with pip's ``ResolutionImpossible``. So once the base image is on the engine,
and before the model repository is written, the Python its stub links (read by the probe the
environment step uses too, :mod:`builder.base.image_probe`, cached per image ID) is compared
with the facts: where it differs, the image's Python is adopted and the Python plan made again
with the same options (native, bridged or refused as :func:`~builder.bridge.plan.plan_python`
decides); where no route reaches it, the build is refused naming the image, both Pythons and the
fix. The probe is the base stage's; the plan, and so this check, the bridge's.
"""

from __future__ import annotations

from dataclasses import replace

import docker

from builder.base.image_probe import IMAGE_STUB, ImageProbeError, probe_image
from builder.base.releases import Release
from builder.bridge.errors import PythonBridgeError
from builder.bridge.plan import BridgeOptions, PythonPlan, plan_python, require_buildable


class BasePythonError(PythonBridgeError):
    """The base image's own Python is not the release facts', and the pipeline has no route to
    it."""


def fit_base_python(plan: PythonPlan, client: docker.DockerClient,
                    image_id: str) -> tuple[Release, PythonPlan]:
    """The release and Python plan for the base image ``image_id`` (``plan.release.image`` on
    this engine): unchanged where its stub's Python is the facts', else with that Python (and
    the image's glibc) adopted and the plan made again; raises :class:`BasePythonError` where
    the pipeline's Python has no route to it. An image whose stub cannot be read (none at
    :data:`IMAGE_STUB`, or no ``python3`` to read it with) keeps the facts."""
    facts = plan.release
    try:
        probed = probe_image(client, facts.image, image_id, IMAGE_STUB,
                             what="find python3 and the python backend stub")
    except ImageProbeError:
        return facts, plan  # no python3 to read the stub with (a bridged build brings its own)
    found = probed["stub_python"]
    if found is None or found == facts.python_version:
        return facts, plan  # no stub where Triton images keep it: nothing says otherwise
    glibc = probed["glibc"].removeprefix("glibc ").strip() or facts.glibc
    release = replace(facts, python_version=found, glibc=glibc)
    try:
        adopted = plan_python(release, plan.python_version, plan.options or BridgeOptions(),
                              conda=plan.conda)
        require_buildable(adopted)
    except PythonBridgeError as error:
        raise BasePythonError(
            f"the base image {facts.image} runs its python models on Python {found} (the "
            f"Python its stub links), not on Python {facts.python_version} as the facts of "
            f"{facts.describe()} say, and this pipeline's Python {plan.python_version} has no "
            f"route to it: {error}. Fix: state the image's Python (base_python='{found}' for a "
            f"CPU base) with the bridge on, or pass another base image whose Python is "
            f"{plan.python_version}") from None
    return release, adopted
