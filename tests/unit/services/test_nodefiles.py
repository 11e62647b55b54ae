"""Node files' calls run on their own daemon thread, each with a deadline: a stuck call costs only that file."""

from __future__ import annotations

import threading

import pytest

from imds.errors import UpstreamUnavailable
from imds.services.ganeti import nodefiles

pytestmark = pytest.mark.anyio


async def test_a_call_past_its_deadline_gives_up_and_the_file_stays_given_up():
    """A call that never returns: UpstreamUnavailable at the deadline; the next call is refused at once."""
    release = threading.Event()
    worker = nodefiles._Worker("test-stuck")  # the worker itself is the unit here
    try:
        with pytest.raises(UpstreamUnavailable, match=r"no answer from the node.s filesystem within 0\.2 s"):
            await worker.call(release.wait, 30, seconds=0.2, what="os-image: reading")
        assert worker.stuck
        with pytest.raises(UpstreamUnavailable, match="an earlier call is still stuck"):
            await worker.call(len, "x", seconds=5, what="os-image: reading")
        stuck = [thread for thread in threading.enumerate() if thread.name == "test-stuck"]
        assert [thread.daemon for thread in stuck] == [True]  # never keeps the process from exiting
    finally:
        release.set()
        worker.stop()


async def test_calls_run_in_order_and_errors_come_back():
    """Results and exceptions of the function reach the awaiting task as they are."""
    worker = nodefiles._Worker("test-order")  # the worker itself is the unit here
    try:
        assert await worker.call(sum, [1, 2, 3], seconds=10, what="x") == 6
        with pytest.raises(ZeroDivisionError):
            await worker.call(divmod, 1, 0, seconds=10, what="x")
    finally:
        worker.stop()
