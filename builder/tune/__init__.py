"""Tuning: the settings a pipeline serves best with on this machine, searched under a latency
budget (``triton-builder tune``), kept in a tuning file that a later build applies."""

from builder.tune.settings import ModelSetting, Setting
from builder.tune.tuner import tune
from builder.tune.tuning_file import Machine, Trial, Tuning, read_tuning

__all__ = ["Machine", "ModelSetting", "Setting", "Trial", "Tuning", "read_tuning", "tune"]
