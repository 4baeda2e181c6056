"""What a model operator's module returns, as tensors with names.

A module written for this builder returns a tensor or a tuple of them; a Hugging Face model
returns a ``ModelOutput`` (an ordered mapping whose ``None`` fields are absent, some of them
``ModelOutput``\\ s again, such as CLIP's ``vision_model_output``), other code a ``dict`` or a
named tuple. Users name what they want by the field — ``last_hidden_state``, ``pooler_output``,
``logits`` — so every tensor reachable in the result gets a name and a *path*: the keys and
indices that lead to it. Nested fields are named with dots (``vision_model_output.pooler_output``),
positional results ``output_0``, ``output_1``… as before. The exported model returns the chosen
tensors in order (:func:`selecting_module`), so in process and served they are the same ones.

This module is captured by value into ``pipe.pickle`` with the operators: it imports torch only
inside :func:`selecting_module`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from builder.errors import PipelineError

Path = tuple[Any, ...]
"""The keys (fields) and indices (tuple positions) that lead to one tensor of a result."""


@dataclass(frozen=True)
class ModuleOutputs:
    """The tensors a module's result holds: ``names[i]`` is reached by ``paths[i]``.

    ``named``: whether the result names them itself (a mapping or a named tuple at the top);
    a positional result's names are the builder's defaults, which ``output_names`` may replace.
    """

    names: tuple[str, ...]
    paths: tuple[Path, ...]
    named: bool


def describe_outputs(result: Any) -> ModuleOutputs:
    """Every tensor of ``result`` (``None`` fields dropped), depth first, with its name and path."""
    named = isinstance(result, Mapping) or _is_named_tuple(result)
    found: list[tuple[str, Path]] = []

    def visit(value: Any, path: Path, name: str) -> None:
        if value is None:
            return
        if isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, (*path, key), f"{name}.{key}" if name else str(key))
        elif _is_named_tuple(value):
            for key, item in zip(value._fields, value):
                visit(item, (*path, key), f"{name}.{key}" if name else key)
        elif isinstance(value, (tuple, list)):
            for index, item in enumerate(value):
                visit(item, (*path, index), f"{name}.{index}" if name else f"output_{index}")
        else:
            found.append((name or "output_0", path))

    visit(result, (), "")
    return ModuleOutputs(tuple(n for n, _ in found), tuple(p for _, p in found), named)


def choose_outputs(owner: str, result: Any,
                   output_names: Sequence[str] | None) -> tuple[tuple[str, ...] | None,
                                                                tuple[Path, ...]]:
    """The outputs a model operator returns, in order: their names and paths.

    A result with named fields: ``output_names`` choose among them (default: all of them). A
    positional result: ``output_names`` name its tensors (``None``: the builder's defaults).
    """
    outputs = describe_outputs(result)
    if not outputs.named:
        if output_names and len(output_names) != len(outputs.paths):
            raise PipelineError(
                f"model operator {owner!r}: {len(output_names)} output names for the "
                f"{len(outputs.paths)} tensors the module returns")
        return (tuple(output_names) if output_names else None), outputs.paths
    if not output_names:
        return outputs.names, outputs.paths
    by_name = dict(zip(outputs.names, outputs.paths, strict=True))
    unknown = [n for n in output_names if n not in by_name]
    if unknown:
        raise PipelineError(
            f"model operator {owner!r}: output_names {unknown} are not fields of what the module "
            f"returns ({type(result).__name__}: {', '.join(outputs.names)})")
    return tuple(output_names), tuple(by_name[n] for n in output_names)


def pick(result: Any, paths: Sequence[Path]) -> tuple[Any, ...]:
    """The tensors at ``paths`` in a module's ``result``."""
    picked = []
    for path in paths:
        value = result
        for key in path:
            value = value[key] if isinstance(key, int) or isinstance(value, Mapping) else (
                getattr(value, key))
        picked.append(value)
    return tuple(picked)


def selecting_module(module: Any, paths: Sequence[Path]) -> Any:
    """``module`` wrapped to return the tensors at ``paths`` (a tuple of them, or the one
    tensor), its inputs positional.

    What every export format exports (and the ``python`` format pickles): ONNX and TorchScript
    take tensors and tuples of tensors, and a positional ``forward`` keeps exporters from
    passing keywords that a model's own ``forward`` takes otherwise (under transformers 5 the
    TorchScript-based ONNX exporter fails on ``BertModel`` itself: "got multiple values for
    argument 'use_cache'"). The class is made here, in a function, so that cloudpickle carries
    it by value into the ``python`` format's pickle.
    """
    import torch

    class SelectedOutputs(torch.nn.Module):
        def __init__(self, inner: Any, chosen: tuple[Path, ...]) -> None:
            super().__init__()
            self.inner = inner
            self.chosen = chosen

        def forward(self, *inputs: Any) -> Any:
            result = self.inner(*inputs)
            picked = []
            for path in self.chosen:
                value = result
                for key in path:
                    value = value[key] if isinstance(key, int) or isinstance(value, Mapping) \
                        else getattr(value, key)
                picked.append(value)
            return picked[0] if len(picked) == 1 else tuple(picked)

    return SelectedOutputs(module, tuple(tuple(p) for p in paths)).eval()


def _is_named_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")
