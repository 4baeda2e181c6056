"""The supervisor's log lines, on stderr beside Triton's own."""

from __future__ import annotations

import sys
import time


def log(message: str) -> None:
    """One line on stderr, beside Triton's own log: UTC time, who speaks, what happened."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp}Z triton-builder supervisor: {message}", file=sys.stderr, flush=True)
