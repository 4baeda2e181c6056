"""tune on a GPU machine: the text-embedding example with its torch operator on ``KIND_GPU`` (as
``test_gpu_serving.py`` serves it), searched for two minutes under a 50 ms p99 budget, served by
the host Triton 2.51 and loaded by perf_analyzer (no Docker). What only a GPU machine shows: the
tuning file names the GPU it was measured on (what warns a build on another kind of machine),
and a rebuild with the tuning keeps the operator on the GPU with the instances chosen for it.
"""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from builder import build_pipeline_model, tune
from builder.repository.model_config import read_config
from builder.tune.perf_analyzer import PerfAnalyzerError, perf_analyzer
from builder.tune.tuning_file import read_tuning
from pipelines.text_embedding import pipeline
from tests.support.gpu_serving import OPERATOR

ON_THE_GPU = {"format_priority": ("python",), "op_defaults": {"device": "gpu"},
              "in_process": False}


def test_tune_names_the_gpu_and_its_tuning_rebuilds_the_operator_on_the_gpu(tmp_path):
    try:
        perf_analyzer()
    except PerfAnalyzerError as error:
        pytest.skip(f"perf_analyzer cannot run here: {error}")
    tuning = tune(pipeline, 50, minutes=2, output=tmp_path / "tuning.json",
                  report_dir=tmp_path / "report", queue_policy=False,
                  build_keywords=ON_THE_GPU, log=print)
    print(f"chosen: {tuning.chosen.setting.describe()}, {tuning.chosen.rate:.0f} req/s, "
          f"p99 {tuning.chosen.p99_ms:.1f} ms; defaults {tuning.default.rate:.0f} req/s; "
          f"{len(tuning.trials)} settings in {tuning.search_s:.0f} s on {tuning.machine}")
    assert any("NVIDIA" in gpu for gpu in tuning.machine.gpus), tuning.machine
    assert read_tuning(tmp_path / "tuning.json").machine == tuning.machine
    assert tuning.chosen.within_budget and tuning.chosen.rate > 0
    assert OPERATOR in dict(tuning.chosen.setting.models), "the GPU operator was not searched"

    rebuilt = tmp_path / "rebuilt"
    build_pipeline_model(pipeline, rebuilt, **ON_THE_GPU, **tuning.build_keywords())
    groups = read_config(rebuilt / OPERATOR).instance_group
    assert [(group.kind, group.count) for group in groups] == [
        (mc.ModelInstanceGroup.KIND_GPU, tuning.chosen.setting[OPERATOR].instances)]
