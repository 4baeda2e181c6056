"""Model Analyzer's chosen model config, read as the setting our tuner serves side by side."""

from __future__ import annotations

from benchmarks.bench_tune import analyzer_setting
from benchmarks.model_analyzer_run import key_settings
from builder.tune.settings import ModelSetting, Setting

BASELINE = Setting("pipeline", (("pipeline", ModelSetting()), ("encoder", ModelSetting())))


def test_its_protobuf_json_becomes_our_setting_camel_case_and_strings_included():
    recorded = {"name": "pipeline", "maxBatchSize": 8,
                "instanceGroup": [{"count": 2, "kind": "KIND_CPU"}],
                "dynamicBatching": {"maxQueueDelayMicroseconds": "100",
                                    "preferredBatchSize": [4, 8]}}
    chosen = {"pipeline": key_settings(recorded),
              "encoder": key_settings({"max_batch_size": 32, "instance_group": [{"count": 3}]})}
    setting = analyzer_setting(chosen, BASELINE)
    assert setting["pipeline"] == ModelSetting(2, 8, 100, (4, 8))
    assert setting["encoder"] == ModelSetting(3, 64, 0, ()), (
        "a model operator keeps the batch size it was built with")


def test_a_model_it_did_not_search_keeps_its_setting():
    assert analyzer_setting({"other": {"instance_count": 4}}, BASELINE) == BASELINE
