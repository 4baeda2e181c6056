"""Two settings told apart by turns: the sign test's arithmetic, when a lead counts, when more
turns can change nothing, and the record a tuning file keeps."""

from __future__ import annotations

import pytest

from builder.tune.settings import ModelSetting, Setting
from builder.tune.turns import DECIDED_P, MOST_TURNS, Turns, sign_test_p

ONE = Setting("pipeline", (("pipeline", ModelSetting()),))
TWO = ONE.with_model("pipeline", instances=2)


def _turns(first_ahead: int, second_ahead: int, even: int = 0) -> Turns:
    return Turns(ONE, TWO, first_ahead, second_ahead, even)


def test_the_sign_test_counts_the_turns_at_least_as_lopsided():
    assert sign_test_p(3, 0) == pytest.approx(1 / 8)
    assert sign_test_p(4, 1) == pytest.approx(6 / 32)
    assert sign_test_p(0, 3) == 1.0
    assert sign_test_p(2, 2) == pytest.approx(11 / 16)
    assert sign_test_p(0, 0) == 1.0


@pytest.mark.parametrize("first, second, leader", [
    (3, 0, ONE), (0, 3, TWO), (4, 1, ONE), (1, 4, TWO), (2, 0, None), (3, 1, None),
    (3, 2, None), (2, 2, None)])
def test_a_lead_counts_where_the_sign_test_says_so(first, second, leader):
    assert _turns(first, second).leader() == leader
    assert (leader is not None) == (min(sign_test_p(first, second),
                                        sign_test_p(second, first)) <= DECIDED_P)


def test_turns_that_do_not_count_toward_either_setting_leave_the_pair_even():
    assert _turns(3, 0, even=2).leader() == ONE
    assert _turns(2, 0, even=1).leader() is None


@pytest.mark.parametrize("first, second, even, settled", [
    (0, 0, 0, False), (1, 1, 0, False), (2, 1, 0, False), (3, 0, 0, True), (2, 2, 0, True),
    (1, 1, 1, True), (3, 1, 1, True), (4, 1, 0, True)])
def test_turns_stop_once_one_leads_or_neither_can_within_the_turns_left(first, second, even,
                                                                        settled):
    turns = _turns(first, second, even)
    assert turns.count <= MOST_TURNS
    assert turns.settled() == settled


def test_a_turn_is_added_to_the_side_that_served_more_or_to_neither():
    turns = Turns(ONE, TWO).added(True, False).added(False, True).added(False, False)
    assert (turns.first_ahead, turns.second_ahead, turns.even, turns.count) == (1, 1, 1, 3)


def test_turns_survive_the_tuning_file():
    turns = _turns(1, 3, even=1)
    assert Turns.from_json("pipeline", turns.as_json()) == turns
