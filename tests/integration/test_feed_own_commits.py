"""A replica's own commits wake no follower of its own; another replica's do (PostgreSQL NOTIFY).

The writing process applies its own writes to its catalog as they commit
(``Catalog.written``); reading each of them back after its ``NOTIFY`` cost a busy writer
more than the write itself. ``FeedListener`` therefore drops the notifications of heads
the group commit said were its own, and wakes for every other one, and for a commit of
its own that failed.
"""

from __future__ import annotations

import asyncio

import pytest

from factories import new_id
from imds.store import open_store
from imds.store.sql.engine import connector_for
from imds.store.sql.listen import FeedListener
from imds.store.sql.store import SqlStore

pytestmark = pytest.mark.anyio
BOUND = 30.0  # seconds for what should happen about at once (a loaded machine is slow)


class CountingEvent(asyncio.Event):
    """An asyncio.Event that counts how often it was set."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


async def write_one(store: SqlStore) -> None:
    async with store.write() as tx:
        instance_id = new_id()
        await tx.put_records([(instance_id, {"id": instance_id})], [])
        await tx.mark_changed([instance_id])


@pytest.mark.postgres
async def test_own_commits_are_not_heard_and_another_replicas_are(postgres_url: str) -> None:
    a, b = open_store(postgres_url), open_store(postgres_url)
    assert isinstance(a, SqlStore)
    assert isinstance(b, SqlStore)
    try:
        listener = a._listener
        assert listener is not None
        await asyncio.wait_for(a.changed(BOUND), BOUND * 2)  # returns once listening (the connect wakes it)
        wakes = listener._wake = CountingEvent()
        for _ in range(3):
            await write_one(a)
        await write_one(b)  # notified after A's (PostgreSQL delivers notifications in commit order)
        await asyncio.wait_for(a.changed(BOUND), BOUND * 2)
        assert wakes.sets == 1  # B's commit woke A's follower; A's own three did not
        assert listener._own == {}  # and each of A's three was heard and recognised
    finally:
        await a.close()
        await b.close()


async def test_a_failed_own_commit_wakes_the_follower() -> None:
    listener = FeedListener(connector_for("postgresql://imds@127.0.0.1:1/unused"))  # never connects: the wake logic
    listener._wake = wakes = CountingEvent()
    listener.expect(41)
    listener.expect(42)
    listener._notified(None, 1, "imds_feed", "41")
    assert wakes.sets == 0
    listener.failed(42)  # another replica may have committed head 42 meanwhile: look
    assert wakes.sets == 1
    listener._notified(None, 1, "imds_feed", "42")  # that replica's notification
    assert wakes.sets == 2
    listener._notified(None, 1, "imds_feed", "not-a-head")
    assert wakes.sets == 3
