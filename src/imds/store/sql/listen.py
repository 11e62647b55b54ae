"""``FeedListener``: PostgreSQL ``LISTEN`` on the change-feed channel, reconnecting for ever.

Each group commit ends with ``pg_notify(CHANNEL, head)`` inside its transaction, so the
notification arrives only once the rows are visible. The listener holds one dedicated
asyncpg connection (not from the pool). When that connection is lost it reconnects with
a short backoff and wakes its follower once connected again: the follower then catches
up from its last sequence, so notifications missed meanwhile cost nothing but time. The
feed table stays the truth; a follower also polls slowly in case a wake-up is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
from sqlalchemy.engine import make_url

from imds import log
from imds.store.sql.engine import application_name

CHANNEL = "imds_feed"
_BACKOFF = (0.5, 5.0)  # first and longest wait before reconnecting
_CHECK = 5.0  # seconds between liveness checks of an idle listening connection
_OWN_MAX = 4096  # own heads remembered until their notification comes (one that never comes is dropped)

_log = log.get("feed")


def plain_dsn(url: str) -> str:
    """The URL as asyncpg's ``connect`` takes it (no SQLAlchemy driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _setter(event: asyncio.Event) -> Callable[[object], None]:
    return lambda _conn: event.set()


class FeedListener:
    """Wakes one waiter when any replica commits to the feed (or the listener reconnects)."""

    def __init__(self, url: str) -> None:
        self._dsn = plain_dsn(url)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._own: dict[int, None] = {}  # heads of this process's commits whose notification has not come

    async def wait(self, within: float) -> None:
        """Return after a notification (or a reconnect), or after ``within`` seconds."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="imds-feed-listener")
        with contextlib.suppress(TimeoutError):  # asyncio.timeout, not wait_for: 3.11's may swallow a cancel
            async with asyncio.timeout(within):
                await self._wake.wait()
        self._wake.clear()

    async def _run(self) -> None:
        delay = _BACKOFF[0]
        while True:
            try:
                conn = await asyncpg.connect(self._dsn, server_settings={"application_name": application_name()})
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                _log.warning("feed.listen_failed", problem=str(exc) or type(exc).__name__, retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF[1])
                continue
            self._conn = conn
            lost = asyncio.Event()
            conn.add_termination_listener(_setter(lost))
            try:
                await conn.add_listener(CHANNEL, self._notified)
                _log.info("feed.listening", channel=CHANNEL)
                delay = _BACKOFF[0]
                self._wake.set()  # catch up on whatever was committed while not listening
                while not lost.is_set() and not conn.is_closed():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(_CHECK):
                            await lost.wait()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                _log.warning("feed.listen_failed", problem=str(exc) or type(exc).__name__, retry_in=delay)
            finally:
                self._conn = None
                with contextlib.suppress(Exception):
                    conn.terminate()
            _log.warning("feed.listener_lost", retry_in=delay)
            await asyncio.sleep(delay)

    def expect(self, head: int) -> None:
        """This process is committing a group that moves the feed head to ``head``."""
        self._own[head] = None
        if len(self._own) > _OWN_MAX:
            del self._own[next(iter(self._own))]

    def failed(self, head: int) -> None:
        """That commit failed: forget the head and wake the follower."""
        self._own.pop(head, None)
        self._wake.set()

    def _notified(self, _conn: object, _pid: object, _channel: object, payload: object) -> None:
        head = int(payload) if isinstance(payload, str) and payload.isdigit() else None
        if head is not None and head in self._own:
            del self._own[head]  # our own commit: already applied here
            return
        self._wake.set()

    async def close(self) -> None:
        """Stop listening and close the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
