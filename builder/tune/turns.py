"""Two settings told apart by turns: each turn serves both, back to back, and notes which served
more.

Why turns and not a spread: on a loaded machine one setting's runs drift by more than two good
settings differ (the text example on two cores: its defaults read 5897 and 5009 req/s, a 15%
spread, while two instances served 9 to 11% more in 12 to 14 turns of 15). A spread taken as
the widest any setting has shown only grows, and it swallowed that gain. Measured back to back,
both settings meet the same drift, so the count of turns each was ahead says which serves more
where single runs cannot.

The rule is the sign test's, one-sided each way: a setting that led in so many turns that the
chance of it, were neither better, is at most :data:`DECIDED_P`, serves more. Turns stop as soon
as one does, or as soon as neither can within :data:`MOST_TURNS`; then the two are even.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from builder.tune.settings import Setting

MOST_TURNS = 5
"""The most turns two settings are measured by: at 9 in 10 turns ahead (a 10% gain here) one is
found within five turns nine times in ten."""
DECIDED_P = 0.2
"""The sign test's one-sided p at which a lead counts: 3 of 3 turns, 4 of 4, 4 of 5."""


def sign_test_p(ahead: int, behind: int) -> float:
    """One-sided: how likely at least ``ahead`` turns of ``ahead + behind`` are, were neither
    setting better (each turn a coin's toss; a turn neither led is no evidence, and left out)."""
    turns = ahead + behind
    return sum(math.comb(turns, k) for k in range(ahead, turns + 1)) / 2 ** turns


FEWEST_TURNS = next(n for n in range(1, MOST_TURNS + 1) if sign_test_p(n, 0) <= DECIDED_P)
"""The fewest turns that can decide a pair (3: ahead in 3 of 3)."""


@dataclass(frozen=True)
class Turns:
    """Which of ``first`` and ``second`` served more, turn by turn."""

    first: Setting
    second: Setting
    first_ahead: int = 0
    second_ahead: int = 0
    even: int = 0
    """Turns in which neither served more."""

    @property
    def count(self) -> int:
        return self.first_ahead + self.second_ahead + self.even

    def added(self, first_ahead: bool, second_ahead: bool) -> Turns:
        """These turns and one more."""
        return Turns(self.first, self.second, self.first_ahead + first_ahead,
                     self.second_ahead + second_ahead,
                     self.even + (not first_ahead and not second_ahead))

    def leader(self) -> Setting | None:
        """The setting whose lead the sign test accepts, if either."""
        if sign_test_p(self.first_ahead, self.second_ahead) <= DECIDED_P:
            return self.first
        if sign_test_p(self.second_ahead, self.first_ahead) <= DECIDED_P:
            return self.second
        return None

    def settled(self) -> bool:
        """Whether more turns can change nothing: one leads, no turn is left, or neither could
        lead after all the turns left."""
        left = MOST_TURNS - self.count
        if self.leader() is not None or left <= 0:
            return True
        return (sign_test_p(self.first_ahead + left, self.second_ahead) > DECIDED_P
                and sign_test_p(self.second_ahead + left, self.first_ahead) > DECIDED_P)

    def as_json(self) -> dict:
        return {"settings": [self.first.as_json(), self.second.as_json()],
                "ahead": [self.first_ahead, self.second_ahead], "even": self.even}

    @classmethod
    def from_json(cls, pipeline: str, data: dict) -> Turns:
        first, second = (Setting.from_json(pipeline, s) for s in data["settings"])
        return cls(first, second, int(data["ahead"][0]), int(data["ahead"][1]),
                   int(data.get("even", 0)))
