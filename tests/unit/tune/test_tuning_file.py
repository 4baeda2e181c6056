"""The tuning file: written whole, read back checked, applied by a build's options, and honest
about the machine it was measured on."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from builder import BuildError
from builder.job import build_options
from builder.tune.settings import ModelSetting, Setting
from builder.tune.tuning_file import Machine, Trial, Tuning, read_tuning
from builder.tune.tuning_report import write_report
from builder.tune.turns import Turns

SETTING = Setting("pipeline", (("pipeline", ModelSetting(instances=2)),
                               ("encoder", ModelSetting(instances=3, max_queue_delay_us=100))))
DEFAULT = Setting("pipeline", (("pipeline", ModelSetting()), ("encoder", ModelSetting())))
HERE = Machine.here()


def _tuning(**changes) -> Tuning:
    chosen = Trial(SETTING, 2800.0, 31.5, 32, True, 2)
    default = Trial(DEFAULT, 2300.0, 29.0, 32, True, 2)
    return replace(Tuning("pipeline", 50.0, True, chosen, default, HERE, "2.51.0",
                          "pipelines/x.py:pipeline", 95.0, 0.06,
                          (default, chosen, Trial(DEFAULT.with_model("pipeline",
                                                                     max_queue_delay_us=500),
                                                  0.0, 70.0, 1, False)),
                          turns=(Turns(DEFAULT, SETTING, 0, 3),)), **changes)


def test_a_tuning_file_reads_back_as_written(tmp_path):
    path = _tuning().write(tmp_path / "tuning.json")
    assert read_tuning(path) == _tuning()
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize("damage, named", [
    (lambda d: d.update(format=9), "format 9"),
    (lambda d: d.pop("chosen"), "'chosen'"),
    (lambda d: d["settings"]["pipeline"].update(instances=5), "differ from the chosen"),
])
def test_a_damaged_tuning_file_is_refused_naming_it(tmp_path, damage, named):
    path = _tuning().write(tmp_path / "tuning.json")
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    with pytest.raises(BuildError, match=f"tuning file {path}.*{named}"):
        read_tuning(path)


def test_a_build_applies_the_tuning_files_settings_and_budget(tmp_path):
    path = _tuning().write(tmp_path / "tuning.json")
    chosen = build_options(tuning=str(path))
    repository = chosen.repository
    assert repository.parallelism == 2 and repository.latency_budget_ms == 50.0
    assert repository.dynamic_batching == {"max_queue_delay_microseconds": 0}
    assert repository.model_settings == {"encoder": {
        "instance_count": 3, "dynamic_batching": {"max_queue_delay_microseconds": 100}}}
    assert chosen.tuning == _tuning()


def test_a_tuning_without_the_queue_policy_leaves_the_budget_to_the_build(tmp_path):
    path = _tuning(queue_policy=False).write(tmp_path / "tuning.json")
    assert build_options(tuning=path).repository.latency_budget_ms is None


def test_a_keyword_the_tuning_answers_otherwise_is_refused_but_its_default_is_not(tmp_path):
    path = _tuning().write(tmp_path / "tuning.json")
    with pytest.raises(BuildError, match="parallelism=4 and the tuning file's 2 differ"):
        build_options(tuning=path, parallelism=4)
    assert build_options(tuning=path, parallelism=1).repository.parallelism == 2  # the CLI's


def test_another_kind_of_machine_is_named_in_a_warning():
    assert _tuning().machine_warning(HERE) is None
    other = replace(HERE, cpus=HERE.cpus + 6, gpus=("NVIDIA H100 80GB HBM3",))
    warning = _tuning(machine=other).machine_warning(HERE)
    assert "another kind of machine" in warning and "cpus" in warning and "H100" in warning


def test_the_report_lists_every_setting_tried_best_first_and_draws_the_budget(tmp_path):
    written = write_report(_tuning(), tmp_path)
    table = (tmp_path / "tuning.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| pipeline")]
    assert len(rows) == 3
    assert "chosen" in rows[0] and "default" in rows[1] and "over the budget" in rows[2]
    assert f"- {DEFAULT.describe()} against {SETTING.describe()}: ahead in 0 and 3 of 3 turns" \
        in table
    assert tmp_path / "tuning.png" in written
    assert (tmp_path / "tuning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_streaming_pipelines_tuning_says_its_p99_is_the_first_items(tmp_path):
    tuning = _tuning(streams=True)
    path = tuning.write(tmp_path / "tuning.json")
    assert json.loads(path.read_text())["latency_of"] == "first item"
    assert read_tuning(path) == tuning
    assert json.loads(_tuning().write(tmp_path / "whole.json").read_text())[
        "latency_of"] == "answer"
