"""Whether the GPU tier can run here: an NVIDIA GPU the driver lists, and a torch that uses it."""

from __future__ import annotations

from pathlib import Path

DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


def gpu_missing() -> str | None:
    """Why tests marked ``gpu`` cannot run on this machine; None when they can.

    torch is imported only where the driver lists a GPU: collecting the suite on a machine
    without one costs nothing."""
    if not (DRIVER_GPUS.is_dir() and any(DRIVER_GPUS.iterdir())):
        return f"no NVIDIA GPU: the driver lists none in {DRIVER_GPUS}"
    import torch

    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} sees no CUDA device (a CPU build, or a CUDA "
                f"runtime this driver cannot run)")
    return None
