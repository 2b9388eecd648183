"""``gateway.limits.ByteBudget``: one bound over every request's buffered bytes."""

from __future__ import annotations

import pytest

from gateway.limits import ByteBudget
from naiad.errors import Overloaded


def test_reservations_share_the_bound_and_give_back_everything():
    budget = ByteBudget(100)
    with budget.reservation() as first, budget.reservation() as second:
        first.add(60)
        second.add(40)
        with pytest.raises(Overloaded, match="max-buffered-bytes"):
            second.add(1)
        assert (budget.used, second.held) == (100, 40)  # a refused add holds nothing more
        first.resize(10)  # a message that arrived smaller than the largest size
        second.add(50)
        assert budget.used == 100
    assert budget.used == 0


def test_resize_up_is_bounded_too():
    budget = ByteBudget(10)
    reservation = budget.reservation()
    reservation.resize(10)
    with pytest.raises(Overloaded):
        reservation.resize(11)
    reservation.release()
    assert budget.used == 0 and reservation.held == 0
