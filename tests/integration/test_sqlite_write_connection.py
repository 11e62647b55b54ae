"""SQLite's write connection: on the event loop while the write lock is free, on the writer thread when it is not.

``InlineWrite`` hands a group commit's ``COMMIT`` (which waits for fsync) to the store's
writer thread and nothing else, unless another connection (another process, ``imds
import``) holds the write lock: then ``BEGIN IMMEDIATE`` waits for it on the thread, up
to the busy timeout, instead of on the event loop or not at all.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

from imds.store.sql.engine import create_sqlite_write_engine
from imds.store.sql.writeconn import InlineWrite

pytestmark = pytest.mark.anyio

BUSY_MS = 20_000  # the busy timeout under test: long, so a wait that ends is the lock's release, not a timeout
ROW = sa.text("INSERT INTO kv (k, v) VALUES (:k, :v)")


class CountingThread(ThreadPoolExecutor):
    """The writer thread, counting the calls handed to it."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="test-writer")
        self.calls = 0
        self.handed = asyncio.Event()  # set at each hand-off (submit runs on the event loop's thread)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        self.handed.set()
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
def database(tmp_path) -> Iterator[tuple[str, sa.Engine, CountingThread]]:
    path = tmp_path / "w.db"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")  # as every imds database is
        setup.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    engine = create_sqlite_write_engine(f"sqlite:///{path}", statement_timeout=BUSY_MS / 1000)
    thread = CountingThread()
    yield str(path), engine, thread
    thread.shutdown()
    engine.dispose()


def stored(path: str) -> dict[str, str]:
    with sqlite3.connect(path) as reader:
        return dict(reader.execute("SELECT k, v FROM kv").fetchall())


async def write_one(engine: sa.Engine, thread: CountingThread, key: str) -> None:
    conn = await InlineWrite.open(engine, thread)
    await conn.execute(ROW, {"k": key, "v": "x"})
    await conn.commit()
    await conn.close()


async def test_a_write_on_a_free_lock_hands_only_its_commit_to_the_thread(database) -> None:
    path, engine, thread = database
    await write_one(engine, thread, "k0")  # the first one opens the pool's connection on the thread
    assert thread.calls == 2
    for n in range(1, 4):  # then the pooled connection is reused: only COMMIT goes to the thread
        await write_one(engine, thread, f"k{n}")
        assert thread.calls == 2 + n
    assert stored(path) == {"k0": "x", "k1": "x", "k2": "x", "k3": "x"}


async def test_a_held_lock_is_waited_for_on_the_thread(database) -> None:
    path, engine, thread = database
    await write_one(engine, thread, "zero")
    calls = thread.calls
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO kv VALUES ('first', 'other process')")
        thread.handed.clear()
        opening = asyncio.ensure_future(InlineWrite.open(engine, thread))
        await asyncio.wait_for(thread.handed.wait(), BUSY_MS / 1000)  # the inline try failed: the wait went over
        assert thread.calls == calls + 1
        assert not opening.done()
        other.execute("COMMIT")
        conn = await asyncio.wait_for(opening, timeout=BUSY_MS / 1000)
    finally:
        other.close()
    await conn.execute(ROW, {"k": "second", "v": "imds"})
    await conn.commit()
    await conn.close()
    assert stored(path) == {"zero": "x", "first": "other process", "second": "imds"}
    with engine.connect() as check:  # the inline try's zero busy timeout did not stay on the pooled connection
        assert check.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == BUSY_MS


async def test_a_rolled_back_transaction_is_closed_on_the_thread(database) -> None:
    path, engine, thread = database
    await write_one(engine, thread, "zero")
    calls = thread.calls
    conn = await InlineWrite.open(engine, thread)
    await conn.execute(ROW, {"k": "gone", "v": "x"})
    await conn.close()  # without commit: rolled back
    assert thread.calls == calls + 1
    assert stored(path) == {"zero": "x"}
    again = await InlineWrite.open(engine, thread)  # the lock was released
    await again.execute(ROW, {"k": "kept", "v": "x"})
    await again.commit()
    await again.close()
    assert stored(path) == {"zero": "x", "kept": "x"}
