"""The bench's turn-by-turn comparison of tune's setting with Model Analyzer's."""

from __future__ import annotations

from argparse import Namespace

import pytest

from benchmarks.bench_tune import (
    CHART,
    SECTION,
    Row,
    by_turns,
    chart_path,
    heading,
    section,
)
from builder.tune.search import Measured


def _row(*rates: float, setting: str = "s") -> Row:
    return Row(setting, "d", runs=[Measured(rate, 10.0, 8, True) for rate in rates])


def test_a_setting_ahead_in_every_one_of_ten_turns_is_told_apart():
    turns = by_turns(_row(*[110.0] * 10), _row(*[100.0] * 10))
    assert (turns.ahead, turns.turns, turns.median_ratio) == (10, 10, 1.1)
    assert turns.sign_test_p == pytest.approx(2 / 1024)


def test_turns_split_evenly_are_not():
    turns = by_turns(_row(110, 90, 110, 90), _row(100, 100, 100, 100))
    assert turns.ahead == 2 and turns.sign_test_p == 1.0


def test_the_test_follows_the_turns_not_the_medians():
    """Tune behind in most turns though its median would read higher: drift between turns
    would hide that in the medians alone."""
    turns = by_turns(_row(99, 99, 99, 99, 99, 99, 99, 200, 200),
                     _row(100, 100, 100, 100, 100, 100, 100, 50, 50))
    assert turns.ahead == 2 and turns.median_ratio == pytest.approx(0.99)
    assert turns.sign_test_p == pytest.approx(2 * (1 + 9 + 36) / 512)


def test_ties_are_left_out_of_the_sign_test():
    turns = by_turns(_row(100, 100, 110, 110), _row(100, 100, 100, 100))
    assert turns.ahead == 2 and turns.sign_test_p == pytest.approx(0.5)


def test_a_part_of_the_workloads_gets_a_section_and_a_chart_of_its_own():
    assert heading("text,image,model-bound") == SECTION
    assert heading("model-bound,text,image") == SECTION
    assert chart_path("text,image,model-bound") == CHART
    assert heading("text") == f"{SECTION}: text embedding"
    assert chart_path("text").name == "tuning_throughput_text.png"


def test_without_model_analyzer_the_section_says_nothing_of_turns_against_it():
    rows = {"text": [_row(100, 100, setting="builder's defaults"),
                     _row(110, 120, setting="tune")]}
    rows["text"][1].search_s, rows["text"][1].searched = 60.0, 5
    args = Namespace(budget_ms=None, only="text", minutes=1.0, runs=2, measurement_ms=2000)
    text = section(rows, args, "0.10", "0.20")
    assert "By turns" not in text and "| tune |" in text
    rows["text"].append(_row(105, 130, setting="Model Analyzer (quick)"))
    assert "served more in 1 of 2 turns" in section(rows, args, "0.10", "0.20")
