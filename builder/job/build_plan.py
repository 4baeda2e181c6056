"""Everything a build decides before it pulls, builds or writes anything.

Why first: bad input is refused before the engine is touched — a pipeline without examples to
verify with, operators whose rows depend on each other, a CUDA version no release has, a
Python no bridge reaches, a requirement without a wheel for a platform — and the in-process
answers that verification compares with are computed once. No engine is needed: the plan is
unit-tested without one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from builder.base import resolve
from builder.bridge import PythonPlan, plan_python, require_buildable
from builder.engine import (
    DEFAULT_PLATFORM,
    Platform,
    UnknownPlatformError,
    parse_platform,
    parse_platforms,
    tag_references,
)
from builder.environment import require_platform_wheels
from builder.image import WeightsChoiceError
from builder.job.build_options import BuildOptions
from builder.pipeline import Pipeline, check_row_independence
from builder.verify import NothingToVerifyError


@dataclass(frozen=True)
class BuildPlan:
    """What a build will make: its references, each platform's Python plan, and the calls
    verification sends with the answers it must get."""

    image_name: str
    references: tuple[str, ...]
    """``image_name`` and the tags, as full references."""
    targets: tuple[Platform, ...]
    python: dict[Platform, PythonPlan]
    """Each platform's release and how the builder's Python runs on it."""
    unverified: tuple[Platform, ...]
    calls: tuple[tuple[Any, ...], ...]
    expected: tuple[Any, ...]
    """``pipe(*call)`` for each of ``calls``: the reference answers."""

    @property
    def multi(self) -> bool:
        """One image per platform, tagged ``TAG-<architecture>``, and an index at push."""
        return len(self.targets) > 1


def plan_build(pipe: Pipeline, image_name: str, tags: Iterable[str],
               options: BuildOptions) -> BuildPlan:
    """Decide the build of ``pipe`` as ``image_name`` (and ``tags``), or refuse it."""
    targets = parse_platforms(options.platforms)
    unverified = _unverified(targets, options.no_verify_platforms)
    if options.image.weights == "artifact" and len(targets) > 1:
        raise WeightsChoiceError(
            f"weights='artifact' builds one platform's image for now, not "
            f"{', '.join(map(str, targets))}: build each platform on its own, or keep the "
            f"weights in the image (weights='image')")
    references = tuple(tag_references(image_name, tags))
    verifying = options.verify
    calls = tuple(tuple(call) for call in (verifying.calls if verifying.calls is not None
                                           else pipe.examples))
    if verifying.enabled and not calls:
        raise NothingToVerifyError(
            "verification needs at least one call: give the pipeline an example "
            "(pipe.with_example(...)) or pass verify_calls=[...], or verify=False")
    expected = tuple(pipe(*call) for call in calls)
    check_row_independence(pipe, options.repository.export_tolerance)
    base, environment = options.base, options.environment
    python = {}
    for target in targets:
        release = resolve(base.cuda, base.triton_version, base.base_image,
                          base_python=base.base_python, platform=target, slim=base.slim)
        python[target] = plan_python(release, options=options.bridge,
                                     conda=environment.packer == "conda")
        require_buildable(python[target])
    if targets != (DEFAULT_PLATFORM,):
        operators = [node.op for node in pipe.nodes]
        for target in targets:
            require_platform_wheels(python[target].release, python[target].python_version,
                                    env_specs=environment.env_specs,
                                    requirements=environment.requirements,
                                    operators=operators, index=environment.index)
    return BuildPlan(image_name=image_name, references=references, targets=targets,
                     python=python,
                     unverified=unverified, calls=calls, expected=expected)


def _unverified(targets: tuple[Platform, ...], names: Iterable[str]) -> tuple[Platform, ...]:
    """The platforms of ``names`` (``--no-verify-platform``), each one of ``targets``."""
    chosen = tuple(parse_platform(name) for name in names)
    stray = [str(p) for p in chosen if p not in targets]
    if stray:
        raise UnknownPlatformError(
            f"no_verify_platforms names {', '.join(stray)}, which this build is not for "
            f"(platforms: {', '.join(map(str, targets))})")
    return chosen
