"""The whole job, one step per stage: base → repository → environment → image → verify → push.

:func:`build_docker_image` is what users came for: the release's base image
(:mod:`builder.base`), the model repository (:mod:`builder.repository`), the one Python
environment packed against that base (:mod:`builder.environment`), the serving image
(:mod:`builder.image`), run and compared — over gRPC and HTTP — with the in-process pipeline on
its examples (:mod:`builder.verify`), and only then tagged and pushed (:mod:`builder.push`).
:func:`build_image_from_repository` is its second half, for a repository written before.

The modules, in the job's order: the options, defined once (``build_options``); what is decided
before the engine is touched (``build_plan``); one platform's verified image
(``platform_build``); tags and pushes (``publish``); the entry points (``docker_image``).

A new image stays untagged until verification passed: a failing build, a failing verification or
an interrupt (SIGINT or SIGTERM, :mod:`builder.interrupts`) never leaves a tag on a broken image,
and what the build made on the engine — the verification container, the new image and the layers
it made — is removed again (:class:`builder.engine.Leftovers`).
"""

from builder.job.build_options import BuildOptions, RepositoryOptions, build_options
from builder.job.build_plan import BuildPlan, plan_build
from builder.job.docker_image import build_docker_image, build_image_from_repository
from builder.job.platform_build import ImageBuild

__all__ = ["BuildOptions", "BuildPlan", "ImageBuild", "RepositoryOptions", "build_docker_image",
           "build_image_from_repository", "build_options", "plan_build"]
