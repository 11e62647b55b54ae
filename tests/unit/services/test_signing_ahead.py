"""Identity signatures made ahead of their reads on one worker thread (``imds.services.identity.ahead``)."""

from __future__ import annotations

import threading

import pytest

from helpers import wait_for_async
from imds.services.identity.ahead import SigningQueue
from imds.services.render.tree import Later, body

pytestmark = pytest.mark.anyio

TIMEOUT = 30.0  # seconds a worker-thread job may take on a loaded box


class Maker:
    """A leaf's ``make``: records the thread it ran on; blocks until ``go`` is set when ``gated``."""

    def __init__(self, text: str, *, gated: bool = False) -> None:
        self.text = text
        self.threads: list[str] = []
        self.go = threading.Event()
        if not gated:
            self.go.set()

    def __call__(self) -> str:
        self.threads.append(threading.current_thread().name)
        assert self.go.wait(TIMEOUT)
        return self.text


async def test_a_queued_leaf_is_made_on_the_signing_thread_before_it_is_read():
    """``ahead`` starts the job; the read then finds the text made, once, off the loop's thread."""
    queue = SigningQueue()
    make = Maker("p7")
    leaf = Later(make)
    queue.ahead(leaf)
    await wait_for_async(lambda: leaf.value is not None, what="the queued signature to be made", timeout=TIMEOUT)
    assert make.threads[0].startswith("imds-sign")
    assert await queue.made(leaf) == "p7"
    queue.ahead(leaf)  # made already: nothing queued again
    assert make.threads == [make.threads[0]]


async def test_a_leaf_read_before_it_was_queued_is_made_on_the_thread_and_awaited():
    """A read of a leaf nobody queued starts its job and waits for it; the event loop's thread never makes it."""
    queue = SigningQueue()
    make = Maker("sig")
    leaf = Later(make)
    assert await queue.made(leaf) == "sig"
    assert len(make.threads) == 1
    assert make.threads[0] != threading.current_thread().name


async def test_past_the_limit_nothing_more_is_queued_and_a_read_still_gets_its_leaf():
    """With ``ahead`` jobs waiting, another leaf is not queued (made when read); the count drops as jobs end."""
    queue = SigningQueue(ahead=1)
    first, second = Maker("one", gated=True), Maker("two")
    leaf_one, leaf_two = Later(first), Later(second)
    queue.ahead(leaf_one)
    queue.ahead(leaf_two)
    assert queue.queued == 1
    assert leaf_two.pending is None  # not queued: the queue was full
    first.go.set()
    assert await queue.made(leaf_one) == "one"
    await wait_for_async(lambda: queue.queued == 0, what="the finished job to leave the queue", timeout=TIMEOUT)
    assert await queue.made(leaf_two) == "two"


def test_body_makes_a_leaf_in_place_once():
    """Without a queue (a config drive, a unit test) ``body`` makes the leaf where it is, and keeps it."""
    make = Maker("text")
    leaf = Later(make)
    assert body(leaf) == b"text"
    assert body(leaf) == b"text"
    assert make.threads == [threading.current_thread().name]
