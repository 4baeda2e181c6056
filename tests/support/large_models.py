"""A model operator past protobuf's 2 GiB, with generated weights: issue 65's ``big_encoder``."""

from __future__ import annotations

import torch

ROWS, WIDTH = 600_000, 1_024
"""An embedding table of 600,000 x 1,024 float32: 2.46 GB (a big vocabulary's size)."""


class EmbeddingEncoder(torch.nn.Module):
    """The issue's ``big_encoder``: a 600,000 x 1,024 table, mean-pooled, then a projection."""

    def __init__(self, rows: int = ROWS) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(rows, WIDTH)
        self.projection = torch.nn.Linear(WIDTH, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.projection(self.table(ids).mean(dim=1))
