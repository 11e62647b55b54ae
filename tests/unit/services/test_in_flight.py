"""The per-address in-flight counter behind ``--max-requests-per-source``."""

from __future__ import annotations

from imds.services.admission.ratelimit import InFlight


def test_an_address_gets_at_most_limit_slots_and_others_are_not_affected():
    """Two slots for 10.0.0.1, the third refused (nothing taken); 10.0.0.2 still gets one."""
    counter = InFlight(2)
    assert [counter.enter("10.0.0.1") for _ in range(3)] == [True, True, False]
    assert counter.held("10.0.0.1") == 2
    assert counter.enter("10.0.0.2")
    counter.leave("10.0.0.1")
    assert counter.enter("10.0.0.1")


def test_keys_are_dropped_at_zero_so_the_table_holds_only_open_requests():
    """After every leave the table is empty again."""
    counter = InFlight(5)
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.1"):
        assert counter.enter(address)
    assert len(counter) == 2
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.1"):
        counter.leave(address)
    assert (len(counter), counter.held("10.0.0.1")) == (0, 0)


def test_zero_means_no_cap():
    """Limit 0: every enter succeeds (the count is still kept)."""
    counter = InFlight(0)
    assert all(counter.enter("10.0.0.1") for _ in range(1000))
    assert counter.held("10.0.0.1") == 1000
