"""What a build decides before the engine is touched: tested without one."""

from __future__ import annotations

import pytest

from builder.base import UnsupportedCudaError
from builder.engine import DEFAULT_PLATFORM, UnknownPlatformError
from builder.engine.platforms import ARM64
from builder.errors import RowDependenceError
from builder.job import build_options, plan_build
from builder.pipeline import pipe, vectorized
from builder.verify import NothingToVerifyError


def _double(x):
    return 2 * x


DOUBLE = pipe.input("x").map("x", "y", _double).output("y").with_example(3.0).with_example(4.0)


def test_the_plan_holds_the_calls_and_the_answers_verification_compares_with():
    plan = plan_build(DOUBLE, "double:1", ["latest"], build_options())
    assert plan.calls == ((3.0,), (4.0,)) and plan.expected == (6.0, 8.0)
    assert plan.targets == (DEFAULT_PLATFORM,) and not plan.multi
    assert plan.references[0].endswith("double:1") and len(plan.references) == 2
    assert plan.python[DEFAULT_PLATFORM].release.gpu is False
    chosen = build_options(verify_calls=[(1.5,)], cuda="12.6")
    plan = plan_build(DOUBLE, "double:1", [], chosen)
    assert plan.expected == (3.0,) and plan.python[DEFAULT_PLATFORM].release.gpu


def test_two_platforms_and_the_unverified_one():
    plan = plan_build(DOUBLE, "double:1", [], build_options(
        platforms=["linux/amd64", "linux/arm64"], no_verify_platforms=["linux/arm64"]))
    assert plan.multi and plan.targets == (DEFAULT_PLATFORM, ARM64)
    assert plan.unverified == (ARM64,)
    assert plan.python[ARM64].release.platform == ARM64


def test_bad_input_is_refused_before_the_engine():
    with pytest.raises(NothingToVerifyError):
        plan_build(pipe.input("x").map("x", "y", _double).output("y"), "d:1", [],
                   build_options())
    with pytest.raises(UnsupportedCudaError):
        plan_build(DOUBLE, "d:1", [], build_options(cuda="7.5"))
    with pytest.raises(UnknownPlatformError, match="which this build is not for"):
        plan_build(DOUBLE, "d:1", [], build_options(no_verify_platforms=["linux/arm64"]))

    @vectorized
    def centre(x):
        return x - x.mean(axis=0)

    import numpy as np

    mixing = pipe.input("x").map("x", "y", centre).output("y").with_example(np.ones(3))
    with pytest.raises(RowDependenceError):
        plan_build(mixing, "d:1", [], build_options())
