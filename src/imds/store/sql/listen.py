"""``FeedListener``: PostgreSQL ``LISTEN`` on the change-feed channel, on the primary, for ever.

Each group commit ends with ``pg_notify(CHANNEL, head)`` inside its transaction, so the
notification arrives only once the rows are visible. The listener holds one dedicated
connection (not from the pool), opened by the store's ``Connector``: a read-write server
only (a standby refuses ``LISTEN``, and notifications are not replicated), the last known
primary first. It leaves that connection, and listens again wherever the primary is, when

- the connection breaks (a killed or restarted server, a proxy cutting sessions);
- a timed round trip every ``PROBE_EVERY`` seconds gets no answer (a frozen server keeps
  its TCP connections open and answers nothing; keepalives cannot tell);
- the pool finds the primary elsewhere (``Connector.moved``): a switchover, a failover.

While it cannot listen it tries again as soon as the pool reaches a primary, or every
``RETRY`` seconds. Whenever it (re)joins it wakes its follower, which catches up from its
last sequence, so notifications missed meanwhile cost nothing but time; the feed table
stays the truth, and a follower also polls slowly in case a wake-up is lost. The task
that listens is restarted whenever it ends; an unexpected end is logged with its cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from imds import log
from imds.store.sql.connect import Connector, ImdsConnection, problem_of, server_of

CHANNEL = "imds_feed"
PROBE_EVERY = 2.0  # seconds between round trips on the listening connection
RETRY = 1.0  # seconds between attempts while no primary is reachable (sooner when the pool finds one)
LOG_EVERY = 30.0  # seconds between log lines while the listener cannot listen
_OWN_MAX = 4096  # own heads remembered until their notification comes (one that never comes is dropped)

_log = log.get("feed")


class ListenerLost(ConnectionError):
    """The listening connection broke, stopped answering, or is no longer on the primary."""


def _setter(event: asyncio.Event) -> Callable[[object], None]:
    return lambda _conn: event.set()


class FeedListener:
    """Wakes one waiter when any replica commits to the feed (or the listener rejoins)."""

    def __init__(self, connector: Connector) -> None:
        self._connector = connector
        self._probe_timeout = min(connector.connect_timeout, connector.statement_timeout)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._own: dict[int, None] = {}  # heads of this process's commits whose notification has not come
        self._down_since: float | None = None  # when listening last stopped
        self._failures = 0
        self._logged = -LOG_EVERY

    async def wait(self, within: float) -> None:
        """Return after a notification (or a rejoin), or after ``within`` seconds."""
        self._ensure()
        with contextlib.suppress(TimeoutError):  # asyncio.timeout, not wait_for: 3.11's may swallow a cancel
            async with asyncio.timeout(within):
                await self._wake.wait()
        self._wake.clear()

    def _ensure(self) -> None:
        """Start the listening task unless it runs (it is restarted if it ever ended)."""
        if self._closing or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="imds-feed-listener")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._closing:
            return
        exc = task.exception()
        _log.error("feed.listener_died", problem=problem_of(exc) if exc else "ended", exc_info=exc)
        asyncio.get_running_loop().call_soon(self._ensure)

    async def _run(self) -> None:
        while True:
            generation = self._connector.generation
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever ended it, the listener listens again
                self._lost(exc)
            # Rejoin as soon as the pool reaches (or loses) a primary; else try again after RETRY.
            await self._connector.moved(generation, RETRY)

    async def _listen(self) -> None:
        conn = await self._open()
        server = server_of(conn)
        broken = asyncio.Event()
        conn.add_termination_listener(_setter(broken))
        try:
            await conn.add_listener(CHANNEL, self._notified)
            self._joined(server)
            self._wake.set()  # catch up on whatever was committed while not listening
            while True:
                generation = self._connector.generation
                moved = asyncio.ensure_future(self._connector.moved(generation, PROBE_EVERY))
                closed = asyncio.ensure_future(broken.wait())
                try:
                    await asyncio.wait({moved, closed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    moved.cancel()
                    closed.cancel()
                if broken.is_set() or conn.is_closed():
                    raise ListenerLost(f"the listening connection to {server} closed")
                if self._connector.generation != generation and self._connector.primary != server:
                    raise ListenerLost(f"the primary is no longer {server}")
                await self._probe(conn, server)
        finally:
            conn.terminate()

    async def _probe(self, conn: ImdsConnection, server: object) -> None:
        try:
            await conn.fetchval("SELECT 1", timeout=self._probe_timeout)
        except Exception as exc:
            problem = problem_of(exc, self._probe_timeout)
            self._connector.lost(server_of(conn), problem)
            raise ListenerLost(f"{server}: {problem}") from exc

    async def _open(self) -> ImdsConnection:
        """A connection to the primary; given up for the primary the pool finds meanwhile, if it does."""
        while True:
            generation = self._connector.generation
            attempt = asyncio.ensure_future(self._connector.connect())
            moved = asyncio.ensure_future(self._connector.moved(generation, None))
            try:
                await asyncio.wait({attempt, moved}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
            if not attempt.done():  # the pool found (or lost) the primary while this attempt still waits
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
                if self._connector.primary is not None:
                    return await self._connector.connect()  # the new primary, first
                continue
            return attempt.result()

    def _lost(self, exc: BaseException) -> None:
        """Note that listening stopped; log it at once, then at most every LOG_EVERY seconds."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since, self._failures = now, 0
        self._failures += 1
        if now - self._logged >= LOG_EVERY:
            self._logged = now
            _log.warning("feed.listener_lost", problem=problem_of(exc, self._connector.connect_timeout),
                         failures=self._failures, retry="when the pool reaches a primary, or every "
                         f"{RETRY:g} s")

    def _joined(self, server: object) -> None:
        down = None if self._down_since is None else round(time.monotonic() - self._down_since, 2)
        _log.info("feed.listening", channel=CHANNEL, server=str(server), down_seconds=down, failures=self._failures)
        self._down_since, self._failures, self._logged = None, 0, -LOG_EVERY

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
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
