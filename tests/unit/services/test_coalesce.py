"""``Coalescer``: concurrent single requests carried out as batches, each caller answered for its own item."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from imds.errors import StoreUnavailable
from imds.services.records.coalesce import Coalescer

pytestmark = pytest.mark.anyio


class Recorder:
    """A batch function that records each batch and can be held open or made to fail."""

    def __init__(self, *, bad: int | None = None, outage: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.bad = bad
        self.outage = outage
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def run(self, items: Sequence[int]) -> list[str]:
        self.batches.append(list(items))
        self.entered.set()
        await self.gate.wait()
        if self.outage:
            raise StoreUnavailable("database write failed: down")
        if self.bad in items:
            raise ValueError(f"item {self.bad} is bad")
        return [f"done {n}" for n in items]


async def held_batch() -> tuple[Recorder, Coalescer[int, str], asyncio.Task[str]]:
    """A coalescer whose first batch, item 0, is running and held at the recorder's gate."""
    recorder = Recorder()
    recorder.gate.clear()
    coalescer = Coalescer(recorder.run, max_batch=64)
    first = asyncio.create_task(coalescer.submit(0))
    await recorder.entered.wait()
    return recorder, coalescer, first


async def test_items_submitted_together_run_as_one_batch_and_each_gets_its_own_result():
    """Ten submits in one loop pass: one batch of ten, in order; each caller gets the result for its item."""
    recorder = Recorder()
    coalescer = Coalescer(recorder.run, max_batch=64)
    results = await asyncio.gather(*(coalescer.submit(n) for n in range(10)))
    assert results == [f"done {n}" for n in range(10)]
    assert recorder.batches == [list(range(10))]


async def test_what_arrives_during_a_batch_waits_for_the_next_one():
    """While batch [0] runs, 1..4 queue up; they run together as the second batch."""
    recorder, coalescer, first = await held_batch()
    later = [asyncio.create_task(coalescer.submit(n)) for n in range(1, 5)]
    await asyncio.sleep(0)
    recorder.gate.set()
    assert await first == "done 0"
    assert [await task for task in later] == [f"done {n}" for n in range(1, 5)]
    assert recorder.batches == [[0], [1, 2, 3, 4]]


async def test_batches_are_capped_at_max_batch():
    """Seven items with max_batch 3: batches of 3, 3 and 1, in submission order."""
    recorder = Recorder()
    coalescer = Coalescer(recorder.run, max_batch=3)
    assert await asyncio.gather(*(coalescer.submit(n) for n in range(7))) == [f"done {n}" for n in range(7)]
    assert recorder.batches == [[0, 1, 2], [3, 4, 5], [6]]


async def test_a_bad_item_fails_alone_after_the_batch_is_retried_item_by_item():
    """Item 2 makes the batch raise: every other item still succeeds (retried alone); item 2's caller gets the error."""
    recorder = Recorder(bad=2)
    coalescer = Coalescer(recorder.run, max_batch=64)
    outcomes = await asyncio.gather(*(coalescer.submit(n) for n in range(4)), return_exceptions=True)
    assert outcomes[:2] + outcomes[3:] == ["done 0", "done 1", "done 3"]
    assert isinstance(outcomes[2], ValueError)
    assert str(outcomes[2]) == "item 2 is bad"
    assert recorder.batches == [[0, 1, 2, 3], [0], [1], [2], [3]]


async def test_a_store_outage_fails_the_whole_batch_at_once():
    """StoreUnavailable is not retried item by item: every caller gets it, after one attempt."""
    recorder = Recorder(outage=True)
    coalescer = Coalescer(recorder.run, max_batch=64)
    outcomes = await asyncio.gather(*(coalescer.submit(n) for n in range(3)), return_exceptions=True)
    assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
    assert recorder.batches == [[0, 1, 2]]


async def test_an_item_whose_caller_left_before_its_batch_is_dropped():
    """Item 1's caller is cancelled while batch [0] runs: the next batch carries only item 2."""
    recorder, coalescer, first = await held_batch()
    gone = asyncio.create_task(coalescer.submit(1))
    kept = asyncio.create_task(coalescer.submit(2))
    await asyncio.sleep(0)
    gone.cancel()
    recorder.gate.set()
    assert (await first, await kept) == ("done 0", "done 2")
    assert gone.cancelled()
    assert recorder.batches == [[0], [2]]


async def test_callers_waiting_when_the_drain_is_cancelled_are_told_the_service_stops():
    """Cancelling the drain task (shutdown) answers the running batch's and the queued callers with StoreUnavailable."""
    recorder, coalescer, running = await held_batch()
    queued = asyncio.create_task(coalescer.submit(1))
    await asyncio.sleep(0)
    drain = next(t for t in asyncio.all_tasks() if t.get_name() == "imds-coalesce")
    drain.cancel()
    for task in (running, queued):
        with pytest.raises(StoreUnavailable, match="stopping"):
            await task
    recorder.gate.set()
    assert await coalescer.submit(3) == "done 3"  # a new drain starts for the next item
