"""When to reload a model whose stub died, and when to give up on it."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    """Reload at once after a death; back off when a model keeps failing; give up when it fails
    more than ``max_failures`` times within ``window_s`` (a death and a failed load each count).
    """

    max_failures: int = 5
    window_s: float = 60.0
    first_delay_s: float = 1.0
    """The wait before the second reload within the window; it doubles with each failure."""
    max_delay_s: float = 16.0
    load_timeout_s: float = 300.0
    """A reload still running after this long gives up at once: Triton 2.51 never finishes a
    load whose stub cannot start at all (a model file gone), and queues later loads behind it."""

    def delay(self, failures: int) -> float:
        """Seconds to wait before reloading, after the ``failures``-th failure in the window."""
        if failures <= 1:
            return 0.0
        return min(self.max_delay_s, self.first_delay_s * 2 ** (failures - 2))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> RestartPolicy:
        default = cls()
        try:
            return cls(
                max_failures=int(environ.get("TRITON_BUILDER_HEAL_MAX_FAILURES",
                                             default.max_failures)),
                window_s=float(environ.get("TRITON_BUILDER_HEAL_WINDOW_S", default.window_s)),
                max_delay_s=float(environ.get("TRITON_BUILDER_HEAL_MAX_DELAY_S",
                                              default.max_delay_s)),
                load_timeout_s=float(environ.get("TRITON_BUILDER_HEAL_LOAD_TIMEOUT_S",
                                                 default.load_timeout_s)))
        except ValueError as error:
            raise SystemExit(f"triton-builder supervisor: bad TRITON_BUILDER_HEAL_* setting: "
                             f"{error}") from None


@dataclass
class ModelRecord:
    """One model's failures in the window and its next reload."""

    failures: deque = field(default_factory=deque)
    dead: list[tuple[int, int]] = field(default_factory=list)
    """Identities of its stubs that died since the last successful reload."""
    due: float | None = None
    """When to reload (monotonic seconds), None when nothing is pending."""
    loading: bool = False
    died_at: float | None = None
    """When the first death of the pending heal was seen (monotonic), for the log."""

    def fail(self, now: float, policy: RestartPolicy) -> float | None:
        """Count a failure at ``now``; the reload's due time, or None to give up."""
        self.failures.append(now)
        while self.failures and self.failures[0] < now - policy.window_s:
            self.failures.popleft()
        if len(self.failures) > policy.max_failures:
            return None
        return now + policy.delay(len(self.failures))
