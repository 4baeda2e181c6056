"""What a built repository serves, read back from its configs: what ``tune --image`` tunes."""

from __future__ import annotations

import pytest

from builder import TuneError, build_pipeline_model, pipe
from builder.tune.image_serving import served_repository
from tests.support.tiny_models import affine_op


def _pipeline():
    return (pipe.input("v").map("v", "y", affine_op()).output("y")
            .with_example([1.0, 2.0, 3.0, 4.0]))


@pytest.mark.parametrize("in_process, served", [(True, ()), (False, ("affine",))])
def test_models_the_pipeline_model_runs_itself_are_not_served(tmp_path, in_process, served):
    built = build_pipeline_model(_pipeline(), tmp_path / "m", in_process=in_process)
    repository = served_repository(built.model_root)
    assert repository.pipeline_model == "pipeline" and repository.served == served
    assert not repository.queue_policy
    assert list(repository.signature["inputs"]) == ["v"]


def test_a_latency_budget_is_read_back_as_its_queue_policy(tmp_path):
    built = build_pipeline_model(_pipeline(), tmp_path / "m", latency_budget_ms=50)
    assert served_repository(built.model_root).queue_policy


def test_a_repository_without_a_pipeline_model_is_refused(tmp_path):
    built = build_pipeline_model(_pipeline(), tmp_path / "m")
    (built.model_root / "pipeline" / "config.pbtxt").unlink()
    with pytest.raises(TuneError, match="holds 0 pipeline models"):
        served_repository(built.model_root)
