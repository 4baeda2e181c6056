"""What the tuner moves: per served model, its instances, batch size and dynamic batching.

Why a setting is data apart from the repository: the search changes one knob at a time, a
tuning file stores the winner, and a later build applies it through its options
(:meth:`Setting.build_keywords`). Both ends must mean the same thing, so the setting is written
into a built repository's configs by one function here (:func:`apply_setting`, through Triton's
protobuf) and into a build's keywords by another, and a test holds the two to the same configs.

A model operator's ``max_batch_size`` is left as built: the pipeline model splits its calls by
the size its pickled plan was built with, so changing it means a rebuild, not a config edit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from builder.repository.batching import MAX_BATCH_SIZE
from builder.repository.model_config import read_config, write_config

MAX_CONCURRENCY = 128
"""The most requests in flight a setting is loaded with, unless told otherwise."""
QUEUE_DELAYS_US = (0, 100, 500, 2000)
"""The dynamic batcher's delays tried (µs): the sweep of BENCHMARKS.md's "Dynamic batching"."""
BATCH_SIZES = (8, 16, 32, 64, 128)
"""The pipeline model's ``max_batch_size`` values tried."""
PREFERRED_BATCH_SIZES: tuple[tuple[int, ...], ...] = ((), (4, 8), (8, 16, 32))
"""``preferred_batch_size`` lists tried (only with a queue delay: without one Triton does not wait
for them)."""


@dataclass(frozen=True)
class ModelSetting:
    """One served model's knobs."""

    instances: int = 1
    max_batch_size: int = MAX_BATCH_SIZE
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()

    def dynamic_batching(self) -> dict[str, Any]:
        """As ``build_pipeline_model(dynamic_batching=)`` and ``op_config`` take it."""
        batching: dict[str, Any] = {"max_queue_delay_microseconds": self.max_queue_delay_us}
        if self.preferred_batch_size:
            batching["preferred_batch_size"] = list(self.preferred_batch_size)
        return batching

    def describe(self) -> str:
        parts = [f"{self.instances} inst", f"batch {self.max_batch_size}",
                 f"delay {self.max_queue_delay_us} µs"]
        if self.preferred_batch_size:
            parts.append(f"preferred {list(self.preferred_batch_size)}")
        return ", ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "preferred_batch_size": list(self.preferred_batch_size)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelSetting:
        unknown = set(data).difference(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown model setting keys {sorted(unknown)}")
        return cls(**{**data, "preferred_batch_size": tuple(data.get("preferred_batch_size",
                                                                      ()))})


@dataclass(frozen=True)
class Setting:
    """Every tuned model's knobs, the pipeline model first; ``pipeline`` names it."""

    pipeline: str
    models: tuple[tuple[str, ModelSetting], ...]

    def __getitem__(self, model: str) -> ModelSetting:
        return dict(self.models)[model]

    def with_model(self, model: str, **changes: Any) -> Setting:
        """This setting with one model's knobs changed."""
        return replace(self, models=tuple(
            (name, replace(each, **changes) if name == model else each)
            for name, each in self.models))

    def resources(self) -> tuple[int, int]:
        """What a setting costs, to break ties toward the cheaper: instances (processes,
        memory), then queue delay (latency at low load). Batch sizes are no cost here: a tie
        keeps the batch size it had."""
        kept = [each for _, each in self.models]
        return (sum(m.instances for m in kept), sum(m.max_queue_delay_us for m in kept))

    def describe(self) -> str:
        return "; ".join(f"{name}: {each.describe()}" for name, each in self.models)

    def as_json(self) -> dict[str, Any]:
        return {name: each.as_json() for name, each in self.models}

    @classmethod
    def from_json(cls, pipeline: str, data: Mapping[str, Mapping[str, Any]]) -> Setting:
        if pipeline not in data:
            raise ValueError(f"the settings have no entry for the pipeline model {pipeline!r}")
        ordered = [pipeline, *sorted(name for name in data if name != pipeline)]
        return cls(pipeline, tuple((name, ModelSetting.from_json(data[name]))
                                   for name in ordered))

    def build_keywords(self) -> dict[str, Any]:
        """The ``build_docker_image`` / ``build_pipeline_model`` keywords that build this
        setting: the pipeline model's own, and ``model_settings`` for the model operators."""
        own = self[self.pipeline]
        return {
            "parallelism": own.instances,
            "max_batch_size": own.max_batch_size,
            "dynamic_batching": own.dynamic_batching(),
            "model_settings": {
                name: {"instance_count": each.instances,
                       "dynamic_batching": each.dynamic_batching()}
                for name, each in self.models if name != self.pipeline},
        }


def read_setting(model_root: Path, pipeline: str, models: Iterable[str]) -> Setting:
    """The setting a built repository holds for ``pipeline`` and ``models`` (the builder's
    defaults, when it was built without a tuning)."""
    settings = []
    for name in (pipeline, *models):
        config = read_config(Path(model_root) / name)
        batching = config.dynamic_batching
        settings.append((name, ModelSetting(
            instances=config.instance_group[0].count,
            max_batch_size=config.max_batch_size,
            max_queue_delay_us=batching.max_queue_delay_microseconds,
            preferred_batch_size=tuple(batching.preferred_batch_size))))
    return Setting(pipeline, tuple(settings))


def apply_setting(model_root: Path, setting: Setting) -> None:
    """Write ``setting`` into the configs of a built repository, in place. The queue policy a
    latency budget gave each model stays; so does a model operator's ``max_batch_size``."""
    for name, each in setting.models:
        directory = Path(model_root) / name
        config = read_config(directory)
        config.instance_group[0].count = each.instances
        if name == setting.pipeline:
            config.max_batch_size = each.max_batch_size
        elif each.max_batch_size != config.max_batch_size:
            raise ValueError(f"model {name!r}: its max_batch_size is fixed when it is built "
                             f"({config.max_batch_size}), not {each.max_batch_size}")
        config.dynamic_batching.max_queue_delay_microseconds = each.max_queue_delay_us
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(each.preferred_batch_size)
        write_config(config, directory)
