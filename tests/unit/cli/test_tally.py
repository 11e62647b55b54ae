"""The front's per-source connection counts (``imds.cli.tally``) and the warden's gate on them."""

from __future__ import annotations

import os
import socket
import time

import pytest

from helpers import wait_for
from imds.cli import tally as tally_module
from imds.cli.tally import Tally
from imds.cli.warden import Warden


def _tally(budget: int, rows: int = 1) -> Tally:
    counts = Tally(rows)
    counts.budget = budget
    return counts


def test_connections_are_counted_per_source_as_they_open_and_close():
    counts = _tally(4)
    for _ in range(3):
        counts.opened("10.0.0.1")
    counts.opened("10.0.0.2")
    assert (counts.count("10.0.0.1"), counts.count("10.0.0.2"), counts.count("10.0.0.3")) == (3, 1, 0)
    counts.closed("10.0.0.1")
    assert counts.count("10.0.0.1") == 2


@pytest.mark.parametrize("budget", [1, 4, 32])
def test_the_alarm_rises_at_budget_plus_one_and_not_before(budget):
    counts = _tally(budget)
    since = time.monotonic_ns()
    for _ in range(budget):
        counts.opened("10.0.0.1")
    counts.opened("10.0.0.2")  # another source's connection counts for it
    assert not counts.alarmed_since(since)
    counts.opened("10.0.0.1")
    assert counts.alarmed_since(since)
    assert not counts.alarmed_since(time.monotonic_ns())  # a later dump has seen it


def test_an_exempt_source_and_a_budget_of_zero_never_raise_it():
    counts = _tally(2)
    counts.exempt = lambda source: source == "10.9.0.1"
    off = _tally(0)
    since = time.monotonic_ns()
    for _ in range(10):
        counts.opened("10.9.0.1")
        off.opened("10.0.0.1")
    assert not counts.alarmed_since(since)
    assert not off.alarmed_since(since)


def test_a_closed_connection_lets_the_source_come_back_under_budget():
    counts = _tally(2)
    for _ in range(3):
        counts.opened("10.0.0.1")
    counts.closed("10.0.0.1")
    since = time.monotonic_ns()
    counts.opened("10.0.0.2")
    assert not counts.alarmed_since(since)  # 10.0.0.1 holds 2 again: at budget, not over
    counts.opened("10.0.0.1")
    assert counts.alarmed_since(since)


def test_forked_workers_count_into_one_table_and_see_each_others_alarm():
    """Each worker writes its own row; a source's count (and the alarm) is the sum over the workers."""
    counts = _tally(4, rows=2)
    since = time.monotonic_ns()
    for _ in range(3):
        counts.opened("10.0.0.1")  # row 0: this process
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        counts.adopt_row(1)
        counts.opened("10.0.0.1")
        counts.opened("10.0.0.1")  # 3 + 2 = 5 > 4, though this worker holds only 2
        os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert counts.count("10.0.0.1") == 5
    assert counts.alarmed_since(since)


def test_prepare_makes_the_table_every_worker_inherits(monkeypatch):
    monkeypatch.setattr(tally_module, "_prepared", [])
    alone = tally_module.shared()
    assert alone.rows == 1
    assert tally_module.shared() is not alone  # without prepare: one of its own each time
    tally_module.prepare(3)
    assert tally_module.shared() is tally_module.shared()
    assert tally_module.shared().rows == 3


def test_sources_sharing_a_column_only_add_up(monkeypatch):
    """Two addresses in one column: their sum may raise a false alarm (a dump), never hide an excess."""
    monkeypatch.setattr(tally_module, "COLUMNS", 1)  # every source in the one column
    counts = _tally(2)
    since = time.monotonic_ns()
    counts.opened("10.0.0.1")
    counts.opened("10.0.0.1")
    counts.opened("10.0.0.2")
    assert counts.count("10.0.0.2") == 3
    assert counts.alarmed_since(since)


# -- the warden's gate ----------------------------------------------------------------------


def _listening() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def test_with_a_tally_the_warden_dumps_only_after_an_alarm_and_while_an_excess_remains():
    counts = Tally()
    with _listening() as listener:
        warden = Warden([listener], 2, tally=counts)
        assert counts.budget == 2
        assert warden.exempt is not None
        assert not warden.due()  # nothing counted over budget: no dump at all
        clients, accepted = [], []
        try:
            for _ in range(3):
                clients.append(socket.create_connection(listener.getsockname(), timeout=5,
                                                        source_address=("127.0.0.2", 0)))
                accepted.append(listener.accept()[0])
                counts.opened("127.0.0.2")  # as the front's listener does on accept
            assert warden.due()
            assert warden.scan() == 1  # the excess shut; finding one raised the alarm again
            assert warden.due()
            counts.closed("127.0.0.2")  # the server saw the end of the one shut and closed it
            assert warden.scan() == 0
            assert not warden.due()  # a dump that found no excess: quiet until the next alarm
        finally:
            for sock in clients + accepted:
                sock.close()


def test_without_a_tally_every_period_dumps():
    with _listening() as listener:
        warden = Warden([listener], 2)
        assert warden.due()
        warden.scan()
        assert warden.due()


def test_the_thread_skips_the_dump_until_the_alarm(monkeypatch):
    counts = Tally()
    dumps: list[int] = []
    periods: list[bool] = []
    with _listening() as listener:
        warden = Warden([listener], 2, period=0.01, tally=counts)
        due = warden.due
        monkeypatch.setattr(warden, "due", lambda: periods.append(due()) or periods[-1])
        monkeypatch.setattr(warden, "connections", lambda: dumps.append(1) or [])
        warden.start()
        try:
            wait_for(lambda: len(periods) >= 5, what="five of the warden's periods", timeout=30)
            assert dumps == []  # five periods, not one dump
            for _ in range(3):
                counts.opened("127.0.0.2")
            wait_for(lambda: dumps, what="a dump once the alarm is raised", timeout=30)
        finally:
            warden.stop()
