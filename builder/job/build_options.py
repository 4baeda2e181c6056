"""A build's options, defined once: one frozen object per stage, made from flat keywords.

Why: :func:`builder.job.build_docker_image` takes flat keywords (``cuda=``, ``requirements=``,
``latency_budget_ms=`` …) because that is what a user writes, and each stage takes its own
frozen options object because that is what a stage needs. :func:`build_options` is the one
place between them: every keyword is a field of one stage's object (its name is the field's,
or an alias in :data:`ALIASES`), an unknown keyword is refused with the closest names, and a
keyword that answers a question an object given with ``options=`` answered already is refused
naming it. Adding an option is adding a field. As PyTriton's config path and model_navigator's
"config once, then steps": nothing after this function reads a keyword.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from builder.base import BaseOptions
from builder.bridge import BridgeOptions
from builder.environment import EnvironmentOptions
from builder.errors import BuildError
from builder.image import ImageOptions
from builder.repository import RepositoryOptions
from builder.tune import Tuning, read_tuning
from builder.verify import VerifyOptions

StageOptions = (BaseOptions | BridgeOptions | EnvironmentOptions | RepositoryOptions
                | ImageOptions | VerifyOptions)

GROUPS: dict[str, type] = {"base": BaseOptions, "bridge": BridgeOptions,
                           "environment": EnvironmentOptions, "repository": RepositoryOptions,
                           "image": ImageOptions, "verify": VerifyOptions}
""":class:`BuildOptions`'s field → the stage's options class."""

ALIASES: dict[str, tuple[str, str]] = {
    "bridge": ("bridge", "enabled"), "verify": ("verify", "enabled"),
    "verify_calls": ("verify", "calls"),
}
"""Keywords whose name is not their field's: ``bridge=False`` reads better than
``enabled=False``, and both ``BridgeOptions`` and ``VerifyOptions`` have an ``enabled``."""

INTERNAL: dict[str, frozenset[str]] = {
    "bridge": frozenset({"enabled"}), "verify": frozenset({"enabled", "calls"}),
    "image": frozenset({"environment", "environment_python", "platforms", "signature"}),
}
"""Fields that are no keyword under their own name: aliased above, or set by the build itself
(an image's environment, its Python and platforms, the signature label from the pipeline)."""

OWNED = {"target": "the release of each platform", "model_root": "where it writes the repository"}
"""``build_pipeline_model`` keywords the build chooses itself, per platform."""


@dataclass(frozen=True)
class BuildOptions:
    """Everything a build is asked, one frozen object per stage; see :func:`build_options`."""

    base: BaseOptions = BaseOptions()
    bridge: BridgeOptions = BridgeOptions()
    environment: EnvironmentOptions = EnvironmentOptions()
    repository: RepositoryOptions = RepositoryOptions()
    image: ImageOptions = ImageOptions()
    verify: VerifyOptions = VerifyOptions()
    platforms: tuple[str, ...] | None = field(default=None, metadata={"help": (
        "Platforms to build for (linux/amd64, linux/arm64; one tag, one image "
        "index at push); default linux/amd64.")})
    no_verify_platforms: tuple[str, ...] = field(default=(), metadata={"help": (
        "Platforms built without verifying them (a warning).")})
    tuning: Tuning | None = field(default=None, metadata={"help": (
        "A tuning file written by triton-builder tune: its settings (instances, "
        "batching, the latency budget) are applied to this build.")})

    def __post_init__(self) -> None:
        if self.platforms is not None:
            object.__setattr__(self, "platforms", tuple(self.platforms))
        object.__setattr__(self, "no_verify_platforms", tuple(self.no_verify_platforms))


def keyword_fields() -> MappingProxyType:
    """Every keyword :func:`build_options` takes → ``(group, field)`` (``group`` ``None`` for
    :class:`BuildOptions`'s own fields)."""
    table: dict[str, tuple[str | None, str]] = {}
    for group, kind in GROUPS.items():
        for each in fields(kind):
            if each.name not in INTERNAL.get(group, ()):
                table[each.name] = (group, each.name)
    table.update(ALIASES)
    table.update({name: (None, name) for name in ("platforms", "no_verify_platforms",
                                                  "tuning")})
    return MappingProxyType(table)


KEYWORDS = keyword_fields()


def build_options(options: BuildOptions | Sequence[StageOptions] | None = None,
                  **keywords: Any) -> BuildOptions:
    """The build's options: ``options`` (a :class:`BuildOptions`, or some stages' objects), with
    ``keywords`` set on the stage each belongs to.

    Refused, before anything is pulled or written: an unknown keyword (naming the closest), a
    keyword the build chooses itself (``target``, ``model_root``), an object that is no
    stage's, and two answers to one question — a keyword of a stage whose object ``options``
    holds, or, from a :class:`BuildOptions`, one whose field it set (differing from the
    default: a shared ``BuildOptions`` takes the keywords it left open).
    """
    chosen, given = _given(options)
    shared = isinstance(options, BuildOptions)
    if keywords.get("tuning") is not None:
        keywords = _tuned(keywords)
    changes: dict[str | None, dict[str, Any]] = {}
    for keyword, value in keywords.items():
        if keyword in OWNED:
            raise BuildError(f"build_docker_image chooses {keyword}= itself ({OWNED[keyword]}), "
                             f"for each platform: choose the release with cuda=, "
                             f"triton_version=, base_image= or platforms=")
        if keyword not in KEYWORDS:
            close = difflib.get_close_matches(keyword, list(KEYWORDS), n=3)
            raise TypeError(f"build_docker_image got an unknown keyword {keyword!r}"
                            + (f"; did you mean {', '.join(close)}?" if close else ""))
        group, name = KEYWORDS[keyword]
        if group in given and (not shared or _differs(getattr(chosen, group), name)):
            raise ValueError(f"{keyword} given both as a keyword and in "
                             f"{type(getattr(chosen, group)).__name__}: give each once")
        changes.setdefault(group, {})[name] = _frozen(value)
    stages = {group: replace(getattr(chosen, group), **values)
              for group, values in changes.items() if group is not None}
    return replace(chosen, **stages, **changes.get(None, {}))


def _tuned(keywords: dict[str, Any]) -> dict[str, Any]:
    """``keywords`` with a tuning file's settings added; one that a keyword sets otherwise
    than the tuning (and than the library's default, which a command line passes) is refused."""
    tuning = keywords["tuning"]
    if not isinstance(tuning, Tuning):
        tuning = read_tuning(tuning)
    merged = {**keywords, "tuning": tuning}
    for keyword, value in tuning.build_keywords().items():
        group, name = KEYWORDS[keyword]
        default = getattr(GROUPS[group](), name)
        if keyword in keywords and keywords[keyword] not in (default, value):
            raise BuildError(f"{keyword}={keywords[keyword]!r} and the tuning file's "
                             f"{value!r} differ: give one of them")
        merged[keyword] = value
    return merged


def _given(options: BuildOptions | Sequence[StageOptions] | None
           ) -> tuple[BuildOptions, set[str]]:
    """The options to start from, and which stages' objects the caller gave."""
    if options is None:
        return BuildOptions(), set()
    if isinstance(options, BuildOptions):
        return options, set(GROUPS)
    by_kind = {kind: group for group, kind in GROUPS.items()}
    stages: dict[str, Any] = {}  # each group's own kind (by_kind), which a dict cannot say
    for option in options:
        group = by_kind.get(type(option))
        if group is None:
            raise TypeError(f"options: not a stage's options: {option!r}")
        stages[group] = option
    return BuildOptions(**stages), set(stages)


def _differs(option: Any, name: str) -> bool:
    return getattr(option, name) != getattr(type(option)(), name)


def _frozen(value: Any) -> Any:
    """Lists, sets and generators become tuples: the options are frozen."""
    if isinstance(value, (list, set, frozenset, types.GeneratorType)):
        return tuple(value)
    return value
