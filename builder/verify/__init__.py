"""Verification: a built image run as users run it and compared with the pipeline."""
from builder.verify.concurrent import concurrent_check, distinct_calls, short_call
from builder.verify.container import ContainerEndpoint, docker_run_command
from builder.verify.equality import check_same
from builder.verify.verification import (
    Check,
    InferenceCheck,
    NothingToVerifyError,
    Verification,
    VerifyOptions,
    verify_image,
)

__all__ = [
    "Check",
    "ContainerEndpoint",
    "InferenceCheck",
    "NothingToVerifyError",
    "Verification",
    "VerifyOptions",
    "check_same",
    "concurrent_check",
    "distinct_calls",
    "docker_run_command",
    "short_call",
    "verify_image",
]
