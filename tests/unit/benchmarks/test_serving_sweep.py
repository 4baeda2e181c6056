"""The serving benchmark's reading of its batching sweep: the rule the CPU default follows.

``BENCHMARKS.md`` states that the builder's CPU default is what this rule picks from the
measured table; here the rule itself is checked on tables made up to put each of its branches
to work (no server: the figures are inputs, the choice is the output).
"""

from __future__ import annotations

from benchmarks import bench_serving
from benchmarks.bench_serving import Measure, Results, SweepRow
from builder.repository.batching import default_batching

DELAY_100 = {"max_queue_delay_microseconds": 100}


def _row(setting: dict, p50_at_1: float, rate_at_32: float, instances: int = 1) -> SweepRow:
    return SweepRow("text embedding", setting, instances,
                    {1: Measure(1000.0, p50_at_1, 1.0), 8: Measure(3000.0, 2.0, 3.0),
                     32: Measure(rate_at_32, 5.0, 9.0)})


def _results(overhead_ms: float, served_at_32: float) -> Results:
    results = Results(bench_serving.WORKLOADS["text"](2))
    results.overhead = [(0.6 + overhead_ms, 0.6, 0.6)]
    results.rows[bench_serving.SERVED] = {32: Measure(served_at_32, 5.0, 9.0)}
    return results


def test_a_delay_that_fits_the_overhead_goal_is_chosen_and_a_default_without_it_is_flagged():
    rows = [_row({}, 0.76, 5000), _row(DELAY_100, 0.80, 6000)]
    (line,) = bench_serving.sweep_choice(rows, [_results(0.10, 5100)],
                                         default_batching(None, "pipeline"))
    assert "the rule chooses `max_queue_delay_microseconds 100; 1 instance`" in line
    assert "it differs" in line and "1.20x Triton's defaults" in line


def test_a_delay_costing_more_than_the_room_left_is_not_chosen():
    rows = [_row({}, 0.76, 5580), _row(DELAY_100, 0.88, 6584), _row({}, 0.76, 6180, 2)]
    (line,) = bench_serving.sweep_choice(rows, [_results(0.131, 6658)],
                                         default_batching(None, "pipeline"))
    assert "most req/s at 32 in flight is `max_queue_delay_microseconds 100; 1 instance`" in line
    assert "leaves 0.069 ms" in line
    assert "chooses `Triton's defaults (no delay); 1 instance`: the builder's CPU default" in line
    assert "6658 req/s at 32 in flight, this table at 5580" in line and "19%" in line


def test_two_instances_are_the_pipelines_choice_not_a_batching_setting():
    rows = [_row({}, 0.90, 2230), _row({}, 0.94, 2701, 2)]
    (line,) = bench_serving.sweep_choice(rows, [_results(0.35, 2608)],
                                         default_batching(None, "pipeline"))
    assert "chooses `Triton's defaults (no delay); 1 instance`" in line
