"""Deterministic example weights, written to disk once and loaded from there.

The example models stand in for trained ones: initialised from a fixed seed, saved as a
``state_dict`` under ``$TRITON_BUILDER_CACHE/weights`` (or the ``TRITON_BUILDER_WEIGHTS``
directory), and loaded from that file like any checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from builder.cache import cache_dir

M = TypeVar("M", bound=torch.nn.Module)


def weights_dir() -> Path:
    """Where example weights live."""
    configured = os.environ.get("TRITON_BUILDER_WEIGHTS")
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return cache_dir("weights")


def load_weights(factory: Callable[[], M], name: str, seed: int) -> M:
    """Build ``factory()``; load ``<name>-seed<seed>.pt``, first writing it from a seeded init."""
    path = weights_dir() / f"{name}-seed{seed}.pt"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = factory()
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(module.state_dict(), partial)
        os.replace(partial, path)
    module.load_state_dict(torch.load(path, weights_only=True))
    return module.eval()
