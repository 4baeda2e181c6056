"""Retrying calls that failed because the server was not there, with exponential backoff.

A server that restarts, a pod that is rescheduled, a client started before its server: these
fail with UNAVAILABLE for a few seconds and then work. Retrying exactly that (never a wrong
input, a model error or a timeout, which would fail the same way again or run twice) hides the
gap; the backoff keeps a crowd of clients from hammering a server that is coming up, and the
jitter keeps them from coming back in lockstep.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from builder.client.errors import ServerUnavailableError

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` more attempts after the first, waiting ``initial_delay`` then ``multiplier``
    times longer each time, never more than ``max_delay``; ``jitter`` is the fraction of each
    wait drawn at random. ``deadline``: no retry starts later than this many seconds after the
    first attempt (None: the count alone bounds them)."""

    retries: int = 5
    initial_delay: float = 0.1
    multiplier: float = 2.0
    max_delay: float = 5.0
    jitter: float = 0.2
    deadline: float | None = 10.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.initial_delay < 0 or self.multiplier < 1 or self.max_delay < 0 \
                or (self.deadline is not None and self.deadline < 0):
            raise ValueError(f"invalid retry policy: {self}")

    def delays(self) -> Iterator[float]:
        """The waits before each retry."""
        delay = self.initial_delay
        for _ in range(self.retries):
            capped = min(delay, self.max_delay)
            yield capped * (1 - self.jitter * random.random())
            delay *= self.multiplier


def as_policy(retries: int | RetryPolicy) -> RetryPolicy:
    """Accept a plain count where a policy is expected."""
    return retries if isinstance(retries, RetryPolicy) else RetryPolicy(retries=retries)


def call_with_retry(call: Callable[[], T], policy: RetryPolicy) -> T:
    """Run ``call``; on :class:`ServerUnavailableError` wait and run it again, up to the policy."""
    attempts = _Attempts(policy)
    while True:
        try:
            return call()
        except ServerUnavailableError as error:
            delay = attempts.next_delay(error)
            log.info("%s; retrying in %.2fs", error, delay)
            time.sleep(delay)


async def acall_with_retry(call: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """The asyncio twin of :func:`call_with_retry`: the waits do not block the event loop."""
    attempts = _Attempts(policy)
    while True:
        try:
            return await call()
        except ServerUnavailableError as error:
            delay = attempts.next_delay(error)
            log.info("%s; retrying in %.2fs", error, delay)
            await asyncio.sleep(delay)


class _Attempts:
    """One call's attempts under a policy: the next wait, or the error that ends them."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.delays = policy.delays()
        self.started = time.monotonic()
        self.count = 0

    def next_delay(self, error: ServerUnavailableError) -> float:
        self.count += 1
        delay = next(self.delays, None)
        elapsed = time.monotonic() - self.started
        deadline = self.policy.deadline
        if delay is not None and (deadline is None or elapsed + delay <= deadline):
            return delay
        plural = "s" if self.count > 1 else ""
        why = (f"the retry deadline of {deadline:g}s" if delay is not None
               else f"{self.policy.retries} retr{'ies' if self.policy.retries != 1 else 'y'}")
        raise ServerUnavailableError(
            f"{error} (gave up after {self.count} attempt{plural} in {elapsed:.1f}s: "
            f"UNAVAILABLE is retried with backoff, up to {why})") from error
