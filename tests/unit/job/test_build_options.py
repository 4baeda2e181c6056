"""The job's front door: flat keywords for users, one option object per stage underneath,
each option defined once."""

from __future__ import annotations

import dataclasses

import pytest

from builder import build_docker_image
from builder.base import BaseOptions
from builder.bridge import BridgeOptions
from builder.environment import EnvironmentOptions
from builder.errors import BuildError
from builder.image import ImageOptions
from builder.job import BuildOptions, RepositoryOptions, build_options
from builder.job.build_options import GROUPS, KEYWORDS
from builder.pipeline import pipe
from builder.verify import VerifyOptions

IDENTITY = pipe.input("x").output("x").with_example("a")


def test_keywords_make_each_stages_options():
    chosen = build_options(cuda="11.8", user="triton", requirements=["numpy"],
                           latency_budget_ms=50, export_tolerance=1e-3, tolerance=1e-2,
                           bridge=False, verify=False, verify_calls=[("a",)],
                           platforms=["linux/amd64"])
    assert chosen.base == BaseOptions(cuda="11.8")
    assert chosen.image == ImageOptions(user="triton")
    assert chosen.environment == EnvironmentOptions(requirements=("numpy",))
    assert chosen.repository == RepositoryOptions(latency_budget_ms=50, export_tolerance=1e-3)
    assert chosen.verify == VerifyOptions(enabled=False, calls=[("a",)], tolerance=1e-2)
    assert chosen.bridge == BridgeOptions(enabled=False)
    assert chosen.platforms == ("linux/amd64",)
    assert build_options() == BuildOptions()


def test_every_field_of_every_stage_is_one_keyword():
    """Options are defined once: each field is reachable by exactly one keyword (its name or
    its alias), except what the build sets itself."""
    reached = {(group, name) for group, name in KEYWORDS.values()}
    for group, kind in GROUPS.items():
        for each in dataclasses.fields(kind):
            internal = (group, each.name) in {("image", "environment"),
                                              ("image", "environment_python"),
                                              ("image", "platforms"), ("image", "signature")}
            assert ((group, each.name) in reached) != internal, (group, each.name)
    assert len(KEYWORDS) == len(reached)


def test_an_object_replaces_its_groups_keywords():
    image = ImageOptions(user="triton", labels={"team": "search"}, server_args=["--log-verbose=1"])
    chosen = build_options([image], cuda="12.4")
    assert chosen.image is image and image.server_args == ("--log-verbose=1",)
    assert chosen.base.cuda == "12.4"
    with pytest.raises(TypeError):
        image.labels["team"] = "other"  # frozen all the way down


def test_a_question_answered_twice_is_refused_naming_the_keyword():
    with pytest.raises(ValueError, match="cuda given both as a keyword and in BaseOptions"):
        build_options([BaseOptions(cuda="12.4")], cuda="11.8")
    shared = build_options(cuda="12.4")
    with pytest.raises(ValueError, match="cuda given both"):
        build_options(shared, cuda="11.8")
    assert build_options(shared, user="triton").base.cuda == "12.4"  # another question: fine
    with pytest.raises(TypeError, match="not a stage's options"):
        build_options(["cuda=11.8"])


def test_an_unknown_keyword_names_the_closest():
    with pytest.raises(TypeError, match=r"unknown keyword 'requirement'; did you mean "
                                        r"requirements"):
        build_options(requirement=["numpy"])


@pytest.mark.parametrize("keyword", ["target", "model_root"])
def test_what_the_build_chooses_per_platform_is_refused_by_name(keyword):
    with pytest.raises(BuildError, match=rf"chooses {keyword}= itself .*for each platform"):
        build_docker_image(IDENTITY, "x:1", client=object(), **{keyword: "anything"})


def test_build_docker_image_refuses_a_clash_before_touching_the_engine():
    """No engine is reached: the refusal comes before the base image (``client`` unused)."""
    calls = []
    for options, keywords in [([BridgeOptions(compile_stub=True)], {"bridge": False}),
                              ([EnvironmentOptions(requirements=("numpy",))],
                               {"requirements": ["scipy"]}),
                              ([VerifyOptions(tolerance=1e-3)], {"tolerance": 1e-2})]:
        with pytest.raises(ValueError, match="given both as a keyword"):
            build_docker_image(IDENTITY, "x:1", options=options,
                               client=object(), on_log=calls.append, **keywords)
    assert calls == []


def test_the_repositorys_options_are_the_repository_stages_own():
    """Defined in :mod:`builder.repository.options`, which ``build_pipeline_model`` takes as
    it is; the public names stay."""
    import builder
    import builder.repository

    assert GROUPS["repository"] is RepositoryOptions is builder.repository.RepositoryOptions
    assert builder.RepositoryOptions is RepositoryOptions
    assert RepositoryOptions.__module__ == "builder.repository.options"
