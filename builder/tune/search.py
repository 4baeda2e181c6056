"""The search: one knob at a time, from where the time goes, until a pass finds nothing better.

Why coordinate descent and not a product of every knob's values (Model Analyzer's brute force:
5^12 runs for twelve models, MA#805): the runs grow with the number of knobs, not with the
product of their values, and a time budget bounds them. The knobs are visited in the order the
baseline's statistics suggest (the model whose requests spend most time queued or computing
first: its instances, then its batch size, then queue delay and preferred batches), and each is
walked from its current value in the direction that pays while it pays. The batch knobs are
walked first toward what the setting's measurement points to: where the next load missed the
budget (latency-bound) toward smaller batches, which hold the model for less time each; where
the rate stopped rising within it (throughput-bound) toward larger ones.

Why ties are told apart by turns: two settings whose req/s differ by less than the run-to-run
spread (measured by serving the builder's defaults twice, widened whenever a setting measured
again differs more) are not told apart by one run each, and on a loaded machine a setting's own
runs drift by more than a 10% gain. Such a pair is served by turns, both back to back in each
(:mod:`builder.tune.turns`), and the one the turns show ahead wins; where neither leads, the one
with fewer resources wins (fewer instances, then less queue delay).

Why the time budget is checked before a run and not after: a run (or a turn, two runs) begun
just before the deadline ends well past it (the image example's 1.5-minute search took 1.9,
a turn begun at 1.4 minutes), so none is begun that the runs so far say cannot end in time.
And where the best setting found is, by then, within the spread of where the search began, the
walk stops early enough to leave the turns that can tell those two apart: the text example's
search moved to two instances on one run beyond the spread, the spread widened, and at the end,
with no time for turns, the move was undone for fewer resources.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from builder.tune.settings import (
    BATCH_SIZES,
    PREFERRED_BATCH_SIZES,
    QUEUE_DELAYS_US,
    ModelSetting,
    Setting,
)
from builder.tune.tuning_file import Trial
from builder.tune.turns import FEWEST_TURNS, Turns

BATCH_KNOBS = ("max_batch_size", "preferred_batch_size")
"""The knobs walked toward smaller batches first where a setting is latency-bound."""

MIN_SPREAD = 0.05
"""The spread assumed at least, however close the two baseline runs came."""


@dataclass(frozen=True)
class Knob:
    """One model's one setting, and the values it may take, in order."""

    model: str
    name: str
    values: tuple


@dataclass(frozen=True)
class Measured:
    """What serving one setting showed: its best load within the budget, and per model, the
    µs a request spent queued and computing (Triton's statistics) — where the time goes."""

    rate: float
    p99_ms: float
    concurrency: int
    within_budget: bool
    time_us: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    rates: Mapping[int, float] = field(default_factory=dict)
    """req/s at each load (requests in flight) measured within the budget."""
    latency_bound: bool = False
    """Whether the load stopped rising because the next one missed the budget (rather than
    because the rate stopped rising or the most requests in flight were reached)."""


Measure = Callable[[Setting, int], Measured]
"""Serve a setting and find its best load, starting the concurrency search at the int."""


def knobs(setting: Setting, time_us: Mapping[str, tuple[float, float]],
          minimum_instances: Mapping[str, int], maximum_instances: int) -> list[Knob]:
    """The knobs of ``setting``'s models, the busiest model's first (queue plus compute time per
    request in ``time_us``): each model's instances, then (the pipeline model's) batch size,
    then its queue delay, then preferred batch sizes."""
    order = sorted((name for name, _ in setting.models),
                   key=lambda name: -sum(time_us.get(name, (0.0, 0.0))))
    found = []
    for name in order:
        found.append(Knob(name, "instances", instance_counts(minimum_instances.get(name, 1),
                                                            maximum_instances)))
        if name == setting.pipeline:
            found.append(Knob(name, "max_batch_size", BATCH_SIZES))
        found.append(Knob(name, "max_queue_delay_us", QUEUE_DELAYS_US))
        found.append(Knob(name, "preferred_batch_size", PREFERRED_BATCH_SIZES))
    return found


def instance_counts(lowest: int, highest: int) -> tuple[int, ...]:
    """The instance counts tried: doubling from ``lowest``, and ``highest`` last. On a machine of
    many cores one step at a time spent a two-minute search on its first knob (a 16-core GPU
    machine: 1, 2, 3, 4 instances and the time was up, the rate still rising)."""
    counts = [lowest]
    while counts[-1] * 2 < highest:
        counts.append(counts[-1] * 2)
    return tuple(counts + [highest]) if highest > lowest else (lowest,)


@dataclass
class Search:
    """Coordinate descent over :func:`knobs`, bounded by ``deadline`` (on ``clock``)."""

    measure: Measure
    deadline: float
    spread: float = MIN_SPREAD
    trials: dict[Setting, list[Measured]] = field(default_factory=dict)
    turns: dict[frozenset[Setting], Turns] = field(default_factory=dict)
    """The pairs told apart by turns, each pair's turns so far."""
    log: Callable[[str], None] = lambda line: None
    stopped_by_time: bool = False
    clock: Callable[[], float] = time.monotonic
    durations: list[float] = field(default_factory=list)
    """Seconds each run took, in order."""

    def run(self, start: Setting, knob_list: Sequence[Knob]) -> Setting:
        """The best setting found from ``start``: passes over every knob until one pass moves
        none, or the time is up; then held against ``start`` once more, with the spread the
        runs have shown by then (a move taken on a narrower spread is undone)."""
        best = start
        moved = True
        while moved:
            moved = False
            for knob in knob_list:
                keep = self._verdict_runs(best, start)
                if not self._time_for(1, keep):
                    break
                found = self._walk(best, knob, keep)
                if found != best:
                    best, moved = found, True
        if best != start and not self.better(best, start):
            self.log("the setting found is not better than where the search began, beyond the "
                     "spread its runs showed since: keeping that")
            return start
        return best

    def result(self, setting: Setting) -> Trial:
        """``setting`` as a :class:`Trial` (its median rate over its measurements)."""
        runs = self.trials[setting]
        middle = sorted(runs, key=lambda m: m.rate)[len(runs) // 2]
        return Trial(setting, statistics.median(m.rate for m in runs), middle.p99_ms,
                     middle.concurrency, middle.within_budget, len(runs))

    def measured(self, setting: Setting, start: int = 1) -> Measured:
        """Serve ``setting`` once more and keep what it showed."""
        began = self.clock()
        shown = self.measure(setting, start)
        self.durations.append(self.clock() - began)
        runs = self.trials.setdefault(setting, [])
        for earlier in runs:  # the spread is the widest any setting showed between two runs
            self.spread = max(self.spread, spread_of(earlier, shown))
        runs.append(shown)
        self.log(f"{setting.describe()}: {shown.rate:.0f} req/s, p99 {shown.p99_ms:.1f} ms at "
                 f"{shown.concurrency} in flight" + ("" if shown.within_budget else
                                                     " (over the budget)"))
        return shown

    def better(self, candidate: Setting, best: Setting, keep: int = 0) -> bool:
        """Whether ``candidate`` beats ``best``: by more than the spread; within it, ahead in the
        turns that tell them apart; where the turns show neither ahead, on fewer resources.
        ``keep``: runs' time the turns leave before the deadline."""
        verdict = self._tell(candidate, best)
        if verdict is not None:
            return verdict
        leader = self.by_turns(candidate, best, keep).leader()
        if leader is not None:
            return leader == candidate
        return candidate.resources() < best.resources()

    def by_turns(self, candidate: Setting, best: Setting, keep: int = 0) -> Turns:
        """``best`` and ``candidate`` served back to back, turn after turn (which goes first
        alternates), until the turns are settled or the time is up (``keep`` runs' time before
        the deadline); kept for the pair."""
        pair = frozenset((candidate, best))
        turns = self.turns.get(pair, Turns(best, candidate))
        while not turns.settled() and self._time_for(2, keep):
            order = ((turns.first, turns.second) if turns.count % 2 == 0
                     else (turns.second, turns.first))
            shown = {setting: self.measured(setting, self.result(setting).concurrency)
                     for setting in order}
            first, second = shown[turns.first], shown[turns.second]
            turns = self.turns[pair] = turns.added(_ahead(first, second), _ahead(second, first))
            self.log(f"by turns, {turns.first.describe()} against {turns.second.describe()}: "
                     f"ahead in {turns.first_ahead} and {turns.second_ahead} of {turns.count}")
        return turns

    def _tell(self, candidate: Setting, best: Setting) -> bool | None:
        """True/False where the two differ by more than the spread, ``None`` within it."""
        a, b = self.result(candidate), self.result(best)
        if a.within_budget != b.within_budget:
            return a.within_budget
        if not a.within_budget:
            a_value, b_value = 1 / a.p99_ms, 1 / b.p99_ms
        else:
            a_value, b_value = a.rate, b.rate
        if a_value > b_value * (1 + self.spread):
            return True
        if b_value > a_value * (1 + self.spread):
            return False
        return None

    def _walk(self, best: Setting, knob: Knob, keep: int = 0) -> Setting:
        """Move ``knob`` from ``best``'s value one way while that pays, else the other way while
        that pays; a batch knob of a latency-bound setting down first, every other knob up.
        ``keep``: runs' time left unspent before the deadline."""
        current = getattr(best[knob.model], knob.name)
        if current not in knob.values:
            return best
        index = knob.values.index(current)
        for step in ((-1, 1) if self._smaller_first(best, knob) else (1, -1)):
            moved = best
            position = index + step
            while 0 <= position < len(knob.values) and self._time_for(1, keep):
                candidate = _changed(moved, knob, knob.values[position])
                if candidate is None:
                    break
                if candidate not in self.trials:
                    self.measured(candidate, self.result(moved).concurrency)
                if not self.better(candidate, moved, keep):
                    break
                moved, position = candidate, position + step
            if moved != best:
                return moved
        return best

    def _smaller_first(self, setting: Setting, knob: Knob) -> bool:
        runs = self.trials.get(setting, [])
        return knob.name in BATCH_KNOBS and sum(m.latency_bound for m in runs) * 2 > len(runs)

    def _time_for(self, runs: int, keep: int = 0) -> bool:
        """Whether ``runs`` more runs, and ``keep`` after them, end by the deadline, each taking
        as long as the longest since the first (which searched the load from one request in
        flight; later runs start near their load)."""
        longest = max(self.durations[1:], default=0.0)
        fits = self.clock() + (runs + keep) * longest <= self.deadline
        self.stopped_by_time |= not fits
        return fits

    def _verdict_runs(self, best: Setting, start: Setting) -> int:
        """The runs to keep for the verdict between ``best`` and ``start`` at the end: the
        fewest turns that can decide them, where they are within the spread now and their turns
        are not settled; none otherwise."""
        if best == start or self._tell(best, start) is not None:
            return 0
        turns = self.turns.get(frozenset((best, start)))
        return 0 if turns is not None and turns.settled() else 2 * FEWEST_TURNS


def _ahead(one: Measured, other: Measured) -> bool:
    """Whether ``one`` served more than ``other`` in a turn: within the budget where the other
    is not; both within it, more req/s; both over it, a lower p99."""
    if one.within_budget != other.within_budget:
        return one.within_budget
    if one.within_budget:
        return one.rate > other.rate
    return one.p99_ms < other.p99_ms


def _changed(setting: Setting, knob: Knob, value: object) -> Setting | None:
    """``setting`` with ``knob`` at ``value``; ``None`` where that means nothing (preferred batch
    sizes without a queue delay to wait for them, or larger than the model's batch)."""
    model: ModelSetting = setting[knob.model]
    if knob.name == "preferred_batch_size" and isinstance(value, tuple) and value and (
            model.max_queue_delay_us == 0 or max(value) > model.max_batch_size):
        return None
    return setting.with_model(knob.model, **{knob.name: value})


def spread_of(first: Measured, second: Measured) -> float:
    """The run-to-run spread two runs of one setting show at the highest load both measured
    (at least :data:`MIN_SPREAD`): the same load, so the spread is the machine's and not the
    load's."""
    common = set(first.rates).intersection(second.rates)
    if not common:
        return MIN_SPREAD
    load = max(common)
    a, b = first.rates[load], second.rates[load]
    return max(MIN_SPREAD, abs(a - b) / max(a, b) if max(a, b) else 0.0)
