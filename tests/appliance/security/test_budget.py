"""The request-memory budget through its public API: non-blocking reservations, released on every exit."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.core.errors import PayloadTooLarge, Unavailable
from appliance.security.budget import MemoryBudget


def test_reserve_and_release_on_exit():
    budget = MemoryBudget(100)
    with budget.account() as account:
        account.reserve(60)
        account.reserve(0)
        assert budget.used == account.held == 60
        account.release(20)
        assert budget.used == 40
    assert budget.used == 0


def test_beyond_the_budget_is_503_and_counts_nothing():
    budget = MemoryBudget(100)
    with budget.account() as first, budget.account() as second:
        first.reserve(70)
        with pytest.raises(Unavailable) as raised:
            second.reserve(40)
        assert raised.value.retry_after == 1 and "max_request_memory_bytes" in raised.value.message
        assert second.held == 0 and budget.used == 70
        second.reserve(30)  # exactly the rest fits
    assert budget.used == 0


def test_one_request_larger_than_the_whole_budget_is_413():
    budget = MemoryBudget(100)
    with budget.account() as account:
        account.reserve(90)
        with pytest.raises(PayloadTooLarge, match="smaller batch"):
            account.reserve(11)
    assert budget.used == 0


def test_a_failed_request_never_leaks_its_reservation():
    budget = MemoryBudget(100)
    with pytest.raises(RuntimeError), budget.account() as account:
        account.reserve(50)
        raise RuntimeError("the handler failed")
    assert budget.used == 0


def test_release_is_bounded_by_what_the_account_holds():
    budget = MemoryBudget(100)
    with budget.account() as other:
        other.reserve(30)
        with budget.account() as account:
            account.reserve(10)
            account.release(1000)  # cannot give back another request's bytes
        assert budget.used == 30


def test_threads_share_it_exactly():
    budget = MemoryBudget(10**9)

    def churn() -> None:
        for _ in range(2000):
            with budget.account() as account:
                account.reserve(7)
                account.release(3)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.used == 0


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["reserve", "release", "close"]), st.integers(0, 3),
                                st.integers(0, 700)), max_size=40))
def test_whatever_the_steps_the_budget_counts_what_the_accounts_hold(steps):
    """Reserve, release and close in any order on a few accounts: the budget's count is always what they
    hold together, never past its limit; a refused reserve counts nothing, and says 413 only for a request
    that alone would need more than the budget."""
    budget = MemoryBudget(1000)
    accounts = [budget.account() for _ in range(4)]
    for action, which, size in steps:
        account = accounts[which]
        if action == "reserve":
            before = account.held
            try:
                account.reserve(size)
            except PayloadTooLarge:
                assert before + size > 1000 and account.held == before
            except Unavailable:
                assert before + size <= 1000 < budget.used + size and account.held == before
        elif action == "release":
            account.release(size)
        else:
            account.close()
            assert account.held == 0
        assert budget.used == sum(a.held for a in accounts) <= 1000
