"""The tuning file: what ``triton-builder tune`` found, kept for the next build to apply.

Why a file and not printed advice: the settings that serve best are a property of the machine
they were measured on, so the file says which machine (CPU count and model, GPUs, the Triton
release, the image) and every setting tried with its req/s and p99, and a build applies it
(``build_docker_image(..., tuning="tuning.json")``, ``image --tuning``) — warning when it runs
on another kind of machine, where the numbers no longer hold.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import BuildError
from builder.tune.settings import MAX_CONCURRENCY, Setting
from builder.tune.turns import Turns

FORMAT = 1


@dataclass(frozen=True)
class Machine:
    """What the measurements depend on, as far as this machine can tell."""

    architecture: str
    cpus: int
    cpu_model: str
    gpus: tuple[str, ...] = ()

    @classmethod
    def here(cls) -> Machine:
        return cls(platform.machine(), os.cpu_count() or 1, _cpu_model(), _gpus())

    def differences(self, other: Machine) -> list[str]:
        """How ``other`` differs in what changes which settings serve best."""
        found = []
        for name in ("architecture", "cpus", "cpu_model", "gpus"):
            if getattr(self, name) != getattr(other, name):
                found.append(f"{name} {getattr(self, name)!r} here, "
                             f"{getattr(other, name)!r} where it was tuned")
        return found


@dataclass(frozen=True)
class Trial:
    """One setting measured: its best load within the budget (``None``: none met it)."""

    setting: Setting
    rate: float
    p99_ms: float
    concurrency: int
    within_budget: bool
    measurements: int = 1
    """How many times it was measured (ties within the spread are measured again)."""

    def as_json(self) -> dict[str, Any]:
        return {"settings": self.setting.as_json(), "rate": round(self.rate, 1),
                "p99_ms": round(self.p99_ms, 3), "concurrency": self.concurrency,
                "within_budget": self.within_budget, "measurements": self.measurements}

    @classmethod
    def from_json(cls, pipeline: str, data: Mapping[str, Any]) -> Trial:
        return cls(Setting.from_json(pipeline, data["settings"]), float(data["rate"]),
                   float(data["p99_ms"]), int(data["concurrency"]),
                   bool(data["within_budget"]), int(data.get("measurements", 1)))


@dataclass(frozen=True)
class Tuning:
    """A tune's result: the chosen setting, the budget it was chosen under, where, and how."""

    pipeline: str
    latency_budget_ms: float
    queue_policy: bool
    chosen: Trial
    default: Trial
    machine: Machine
    triton: str
    subject: str
    """The pipeline (``file.py:attr``) or image that was tuned."""
    search_s: float
    spread: float
    trials: tuple[Trial, ...] = field(default=())
    max_concurrency: int = MAX_CONCURRENCY
    """The most requests in flight the search loaded it with."""
    streams: bool = False
    """The pipeline streams: each request is a stream, each p99 that of its first item."""
    turns: tuple[Turns, ...] = field(default=())
    """The pairs within the spread of each other, told apart by turns."""

    @property
    def latency_of(self) -> str:
        """What each p99 is the latency of."""
        return "first item" if self.streams else "answer"

    def build_keywords(self) -> dict[str, Any]:
        """The build keywords that apply the chosen setting (and the budget's queue policy,
        when the search ran under it)."""
        keywords = self.chosen.setting.build_keywords()
        if self.queue_policy:
            keywords["latency_budget_ms"] = self.latency_budget_ms
        return keywords

    def machine_warning(self, here: Machine | None = None) -> str | None:
        """A line for the build's log when this machine is not the kind it was tuned on."""
        differences = self.machine.differences(here or Machine.here())
        if not differences:
            return None
        return ("warning: the tuning was measured on another kind of machine ("
                + "; ".join(differences) + "): its settings may not serve best here; "
                "run triton-builder tune here")

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "pipeline_model": self.pipeline, "subject": self.subject,
            "latency_budget_ms": self.latency_budget_ms, "latency_of": self.latency_of,
            "queue_policy": self.queue_policy,
            "measured_on": {"architecture": self.machine.architecture,
                            "cpus": self.machine.cpus, "cpu_model": self.machine.cpu_model,
                            "gpus": list(self.machine.gpus), "triton": self.triton},
            "settings": self.chosen.setting.as_json(),
            "chosen": self.chosen.as_json(), "default": self.default.as_json(),
            "search_s": round(self.search_s, 1), "spread": round(self.spread, 4),
            "max_concurrency": self.max_concurrency,
            "trials": [trial.as_json() for trial in self.trials],
            "turns": [turns.as_json() for turns in self.turns],
        }

    def write(self, path: str | os.PathLike) -> Path:
        """Write the file whole or not at all."""
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(self.as_json(), indent=2) + "\n")
        partial.replace(path)
        return path


def read_tuning(path: str | os.PathLike) -> Tuning:
    """A tuning file, checked: a wrong or unreadable one is refused naming the file."""
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this builder reads {FORMAT}")
        pipeline = data["pipeline_model"]
        measured = data["measured_on"]
        chosen = Trial.from_json(pipeline, data["chosen"])
        if chosen.setting != Setting.from_json(pipeline, data["settings"]):
            raise ValueError("'settings' differ from the chosen trial's")
        return Tuning(
            pipeline=pipeline, latency_budget_ms=float(data["latency_budget_ms"]),
            queue_policy=bool(data["queue_policy"]), chosen=chosen,
            default=Trial.from_json(pipeline, data["default"]),
            machine=Machine(measured["architecture"], int(measured["cpus"]),
                            measured["cpu_model"], tuple(measured.get("gpus", ()))),
            triton=measured.get("triton", ""), subject=data.get("subject", ""),
            search_s=float(data.get("search_s", 0)), spread=float(data.get("spread", 0)),
            trials=tuple(Trial.from_json(pipeline, t) for t in data.get("trials", ())),
            max_concurrency=int(data.get("max_concurrency", MAX_CONCURRENCY)),
            streams=data.get("latency_of", "answer") == "first item",
            turns=tuple(Turns.from_json(pipeline, t) for t in data.get("turns", ())))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise BuildError(f"tuning file {path}: {error}") from None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "CPU part")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> tuple[str, ...]:
    """The NVIDIA GPUs' names from the driver's procfs (no library needed; none: none)."""
    root = Path("/proc/driver/nvidia/gpus")
    names = []
    for information in sorted(root.glob("*/information")) if root.is_dir() else ():
        for line in information.read_text().splitlines():
            if line.startswith("Model:"):
                names.append(line.split(":", 1)[1].strip())
    return tuple(names)
