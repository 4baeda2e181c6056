"""The job's front door: flat keywords for users, one option object per stage underneath."""

from __future__ import annotations

import pytest

from builder import build_docker_image
from builder.base import BaseOptions
from builder.bridge import BridgeOptions
from builder.environment import EnvironmentOptions
from builder.image import ImageOptions
from builder.job import _stage_options
from builder.pipeline import pipe
from builder.verify import VerifyOptions

DEFAULTS = {
    BaseOptions: {"cuda": None, "triton_version": None, "base_image": None, "base_python": None},
    ImageOptions: {"user": None},
    VerifyOptions: {"enabled": True, "calls": None, "tolerance": 1e-4},
}


def test_keywords_make_each_stages_options():
    chosen = _stage_options((), {**DEFAULTS, BaseOptions: {**DEFAULTS[BaseOptions],
                                                            "cuda": "11.8"},
                                 ImageOptions: {"user": "triton"}})
    assert chosen[BaseOptions] == BaseOptions(cuda="11.8")
    assert chosen[ImageOptions] == ImageOptions(user="triton")
    assert chosen[VerifyOptions] == VerifyOptions()


def test_an_object_replaces_its_groups_keywords():
    image = ImageOptions(user="triton", labels={"team": "search"}, server_args=["--log-verbose=1"])
    chosen = _stage_options([image], DEFAULTS)
    assert chosen[ImageOptions] is image and image.server_args == ("--log-verbose=1",)
    with pytest.raises(TypeError):
        image.labels["team"] = "other"  # frozen all the way down


def test_a_question_answered_twice_is_refused_naming_the_keyword():
    with pytest.raises(ValueError, match="cuda given both as keywords and in BaseOptions"):
        _stage_options([BaseOptions(cuda="12.4")],
                       {**DEFAULTS, BaseOptions: {**DEFAULTS[BaseOptions], "cuda": "11.8"}})
    with pytest.raises(TypeError, match="not a stage's options"):
        _stage_options(["cuda=11.8"], DEFAULTS)


def test_build_docker_image_refuses_a_clash_before_touching_the_engine():
    """No engine is reached: the refusal comes before the base image (``client`` unused)."""
    identity = pipe.input("x").output("x").with_example("a")
    calls = []
    for options, keywords in [([BridgeOptions(compile_stub=True)], {"bridge": False}),
                              ([EnvironmentOptions(requirements=("numpy",))],
                               {"requirements": ["scipy"]}),
                              ([VerifyOptions(tolerance=1e-3)], {"tolerance": 1e-2})]:
        with pytest.raises(ValueError, match="given both as keywords"):
            build_docker_image(identity, "x:1", options=options,
                               client=object(), on_log=calls.append, **keywords)
    assert calls == []


def test_images_that_extract_a_bridged_environment_at_start_run_as_root():
    """22.12 extracts its environment from an archive at every start, after the python backend
    has probed (and, as root only, chmod-ed) a bridged stub that cannot load yet: those images
    run as root unless the user says otherwise; every release that takes a directory does not."""
    from builder.base import resolve
    from builder.job import _user

    said = []
    assert _user(None, resolve("11.8"), True, said.append) == "root"
    assert "extracts its environment at every start" in said[0]
    assert _user("triton", resolve("11.8"), True, said.append) == "triton"
    assert _user(None, resolve("11.8"), False, said.append) is None, "the release's own stub"
    assert _user(None, resolve(None), True, said.append) is None, "an unpacked environment"


def test_the_export_tolerance_and_the_verification_tolerance_are_both_settable(monkeypatch):
    """``tolerance`` is the verification's; ``export_tolerance`` reaches the export's checks
    (the row-independence check comes first, before the engine: stopped there)."""
    from builder import job

    class Reached(Exception):
        pass

    seen = {}

    def row_check(pipeline, tolerance):
        seen["export"] = tolerance
        raise Reached

    monkeypatch.setattr(job, "check_row_independence", row_check)
    identity = pipe.input("x").output("x").with_example("a")
    with pytest.raises(Reached):
        build_docker_image(identity, "x:1", export_tolerance=1e-3, tolerance=1e-2,
                           client=object())
    assert seen == {"export": 1e-3}


@pytest.mark.parametrize("keyword", ["target", "model_root"])
def test_what_the_build_chooses_per_platform_is_refused_by_name(keyword):
    from builder.errors import BuildError

    identity = pipe.input("x").output("x").with_example("a")
    with pytest.raises(BuildError, match=rf"chooses {keyword}= itself, for each platform"):
        build_docker_image(identity, "x:1", client=object(), **{keyword: "anything"})
