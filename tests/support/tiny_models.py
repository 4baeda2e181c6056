"""Tiny torch modules for export and build tests, each exercising one behaviour of an exporter."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from builder import ModelOp


class Affine(nn.Module):
    """``tanh(x W + b)``: exports everywhere, agrees with torch."""

    def __init__(self, inputs: int = 4, outputs: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(inputs, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class TwoHeads(nn.Module):
    """Two inputs (float features, int64 ids) and two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.linear = nn.Linear(4, 2)

    def forward(self, features: torch.Tensor, ids: torch.Tensor):
        mixed = features + self.embed(ids).sum(dim=1)
        return self.linear(mixed), ids.sum(dim=1)


class Centered(nn.Module):
    """``h - h.mean(0)`` after a Linear: a statistic across the batch axis, the row-mixing
    mistake users make (each row's answer moved by the others of its batch)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return h - h.mean(0)


class Noisy(nn.Module):
    """Adds fresh random noise: exports fine, but no export can agree with torch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


class Unscriptable(nn.Module):
    """Returns a text beside its tensor: no Triton model has such an output, so ``ModelOp``
    refuses it (a dict of tensors is fine: its fields are the outputs)."""

    def forward(self, x: torch.Tensor):
        return {"y": x * 2, "note": "doubled"}


class Doubler(nn.Module):
    """Complex arithmetic through FFT, which the ONNX exporter cannot express."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.ifft(torch.fft.fft(x) * 2).real


def affine_op(**options) -> ModelOp:
    torch.manual_seed(0)
    defaults = dict(
        example_inputs=torch.zeros(1, 4),
        pre=lambda v: np.asarray(v, dtype=np.float32)[None],
        post=lambda y: y[0],
        name="affine",
    )
    defaults.update(options)
    module = defaults.pop("module", None) or Affine()
    return ModelOp(module, **defaults)
