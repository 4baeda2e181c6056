"""A setting means one thing written into a built repository and built from its keywords."""

from __future__ import annotations

import pytest

from builder import BuildError, build_pipeline_model, pipe
from builder.repository.model_config import read_config
from builder.tune.settings import ModelSetting, Setting, apply_setting, read_setting
from tests.support.tiny_models import affine_op


def _pipeline():
    return (pipe.input("v").map("v", "y", affine_op()).output("y")
            .with_example([1.0, 2.0, 3.0, 4.0]))


def _configs(root):
    return {name: read_config(root / name) for name in ("pipeline", "affine")}


TUNED = Setting("pipeline", (
    ("pipeline", ModelSetting(instances=3, max_batch_size=16, max_queue_delay_us=500,
                              preferred_batch_size=(4, 8))),
    ("affine", ModelSetting(instances=2, max_batch_size=64, max_queue_delay_us=100)),
))


def test_a_setting_applied_to_a_built_repository_equals_the_build_with_its_keywords(tmp_path):
    edited, built = tmp_path / "edited", tmp_path / "built"
    build_pipeline_model(_pipeline(), edited, in_process=False)
    apply_setting(edited, TUNED)
    build_pipeline_model(_pipeline(), built, in_process=False, **TUNED.build_keywords())
    assert _configs(edited) == _configs(built)
    assert read_setting(built, "pipeline", ["affine"]) == TUNED


def test_the_builders_defaults_read_back_as_a_setting(tmp_path):
    build_pipeline_model(_pipeline(), tmp_path / "m")
    setting = read_setting(tmp_path / "m", "pipeline", ["affine"])
    assert setting["pipeline"] == ModelSetting(1, 64, 0, ())
    assert setting["affine"].instances == 1


def test_a_model_operators_batch_size_is_not_changed_by_editing_its_config(tmp_path):
    build_pipeline_model(_pipeline(), tmp_path / "m")
    with pytest.raises(ValueError, match="'affine'.*fixed when it is built"):
        apply_setting(tmp_path / "m", TUNED.with_model("affine", max_batch_size=8))


def test_model_settings_naming_no_model_operator_are_refused_before_writing(tmp_path):
    with pytest.raises(BuildError, match=r"\['encoder'\].*\['affine'\]"):
        build_pipeline_model(_pipeline(), tmp_path / "m",
                             model_settings={"encoder": {"instance_count": 2}})
    assert not (tmp_path / "m").exists()


def test_a_setting_round_trips_through_json_and_orders_the_pipeline_first():
    again = Setting.from_json("pipeline", TUNED.as_json())
    assert again == TUNED
    with pytest.raises(ValueError, match="unknown model setting keys"):
        ModelSetting.from_json({"instances": 1, "threads": 4})


def test_resources_rank_instances_before_delay_before_batch():
    base = Setting("pipeline", (("pipeline", ModelSetting()),))
    assert base.resources() < base.with_model("pipeline", instances=2).resources()
    assert (base.with_model("pipeline", max_queue_delay_us=2000).resources()
            < base.with_model("pipeline", instances=2).resources())
