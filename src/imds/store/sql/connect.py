"""``Connector``: how imds opens every PostgreSQL connection (the pool, the feed listener, migrations).

Failover must not depend on how the old primary died, so nothing here waits on one server
for the whole budget of the others (asyncpg's own host list does: its ``timeout`` covers the
list, and a frozen first host uses it up):

- the last server found read-write is tried first, alone for ``HEAD_START`` seconds; then every
  other server of the URL is tried at the same time, each within ``connect_timeout``;
- a session counts only once ``transaction_read_only`` is off (a standby, or a primary being
  demoted, is not one); a server that answers but cannot be used yet (read-only, starting,
  refusing) is asked again every ``REPOLL`` seconds until the deadline, so a standby promoted
  meanwhile is found within ``REPOLL``;
- TCP connections get keepalives and ``TCP_USER_TIMEOUT``, so a server that vanished from the
  network (power loss, partition) breaks its connections instead of leaving them hanging;
- ``lost(server)`` (a statement timed out, a connection broke) moves that server to the back
  and forgets it as the primary; ``moved()`` wakes whoever waits for a new primary (the feed
  listener rejoins as soon as the pool reaches one).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
from typing import Any

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information

from imds.config.database import Database, Server
from imds.store.sql.health import StoreHealth

HEAD_START = 0.5  # seconds the last known primary is tried alone
REPOLL = 0.25  # seconds between tries of a server that answered but cannot be used yet
CLIENT_GRACE = 0.5  # seconds the client waits for a statement beyond the server's own statement_timeout
_READ_ONLY = "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'"
# Worth asking again before the deadline: the server may be promoted, finish starting, or come back.
_RETRY = (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError,
          asyncpg.ConnectionDoesNotExistError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError,
          asyncpg.AdminShutdownError, asyncpg.CrashShutdownError)


class NoWritableServer(ConnectionError):
    """No server of the URL gave a read-write session in time; the message says why, per server."""


class ReadOnlyServer(ConnectionError):
    """The server answered, but its sessions are read-only (a standby, or ``default_transaction_read_only``)."""


class CommitNotConfirmed(ConnectionError):
    """A COMMIT returned only because its wait for the synchronous standby was cancelled.

    PostgreSQL then answers the COMMIT with success and a WARNING ("canceling wait for
    synchronous replication ... The transaction has already committed locally, but might not
    have been replicated to the standby"), on any cancel request (``pg_cancel_backend``, a
    tool's or operator's; statement_timeout is off by then). The write is on that server only
    and is lost if it fails over, so imds does not acknowledge it (503; the client may retry).
    """


class ImdsConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg's classes are untyped
    """An asyncpg connection that knows which server of the URL it reached, and any unconfirmed commit."""

    __slots__ = ("imds_server", "imds_unconfirmed")


def _heard(conn: ImdsConnection, message: object) -> None:
    """Note a cancelled wait for the synchronous standby (a server WARNING).

    asyncpg calls this before the COMMIT's own result is delivered, so ``confirm_commit`` sees it.
    """
    if "synchronous replication" in str(getattr(message, "message", "")):
        conn.imds_unconfirmed = True


def confirm_commit(conn: object) -> None:
    """Raise CommitNotConfirmed if the COMMIT just run on ``conn`` was not confirmed by the standby."""
    if getattr(conn, "imds_unconfirmed", False):
        conn.imds_unconfirmed = False  # type: ignore[attr-defined]  # an ImdsConnection
        server = server_of(conn)
        msg = (f"{server}: the commit was not confirmed by the synchronous standby (committed on this server "
               "only, lost if it fails over): not acknowledged")
        raise CommitNotConfirmed(msg)


def server_of(conn: object) -> Server | None:
    """The server an asyncpg connection made here reached (None for any other object)."""
    found = getattr(conn, "imds_server", None)
    return found if isinstance(found, Server) else None


def problem_of(exc: BaseException, timeout: float | None = None) -> str:
    """A failure in a few words: ``no answer within 2 s``, ``connection refused``, the driver's first line."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s" if timeout is not None else "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return next(iter(text.splitlines()), "").strip() or type(exc).__name__


class Connector:
    """Opens read-write asyncpg connections to the servers of one parsed ``--db``."""

    def __init__(self, database: Database, *, connect_timeout: float, statement_timeout: float,
                 server_settings: dict[str, str], health: StoreHealth | None = None) -> None:
        self.database = database
        self.connect_timeout = connect_timeout
        self.statement_timeout = statement_timeout
        # The client waits a little longer than the server's statement_timeout: a live server
        # cancels its own statement first (its connection stays usable); only a server that
        # answers nothing times out here, which marks it lost.
        self.client_timeout = statement_timeout + CLIENT_GRACE
        self._server_settings = server_settings
        self.health = health or StoreHealth(database.where)
        self._order = list(database.servers)
        self.primary: Server | None = None
        self.generation = 0  # moves whenever the primary is found or lost
        self._moved = asyncio.Event()

    # --- what is known about the servers ------------------------------------------------------

    def _announce(self) -> None:
        self.generation += 1
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def moved(self, generation: int, within: float | None) -> bool:
        """Wait until the primary is found or lost after ``generation`` (True), or ``within`` seconds (False)."""
        if self.generation != generation:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._moved.wait()
                return True
        return False

    def _found(self, server: Server) -> None:
        self._order.remove(server)
        self._order.insert(0, server)
        self.health.succeeded(server)
        if self.primary != server:
            self.primary = server
            self._announce()

    def lost(self, server: Server | None, problem: str) -> None:
        """A connection to ``server`` timed out or broke: try it last, and it is the primary no more."""
        self.health.failed(problem, server)
        if server is not None:
            self._demote(server)

    def _demote(self, server: Server) -> None:
        if server in self._order:
            self._order.remove(server)
            self._order.append(server)
        if self.primary == server:
            self.primary = None
            self._announce()

    # --- connecting -----------------------------------------------------------------------------

    async def connect(self) -> ImdsConnection:
        """A new connection to a read-write server; NoWritableServer (or the driver's error) when none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout
        order = list(self._order)
        tasks = {asyncio.ensure_future(self._try(order[0], deadline)): order[0]}
        later = order[1:]
        failures: dict[Server, BaseException] = {}
        try:
            while tasks:
                wait = HEAD_START if later else None
                done, _ = await asyncio.wait(tasks, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    server = tasks.pop(task)
                    if task.exception() is None:
                        self._found(server)
                        return task.result()
                    failures[server] = task.exception()  # type: ignore[assignment]  # done, not cancelled
                if later and (not done or failures):  # the head start is over, or the first server failed
                    tasks.update({asyncio.ensure_future(self._try(each, deadline)): each for each in later})
                    later = []
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:  # a loser that connected meanwhile is closed by its own _try
                with contextlib.suppress(BaseException):
                    await task
        raise self._failed(order, failures)

    def _failed(self, order: list[Server], failures: dict[Server, BaseException]) -> BaseException:
        """Every server failed: the unreachable ones go to the back; the error to raise, naming each."""
        problems = [f"{server} {problem_of(failures[server], self.connect_timeout)}"
                    for server in order if server in failures]
        for server, exc in failures.items():
            if not isinstance(exc, ReadOnlyServer) or server == self.primary:
                self._demote(server)
        text = "; ".join(problems)
        self.health.failed(text)
        only = failures.get(order[0]) if len(order) == 1 else None
        if only is not None and not isinstance(only, (TimeoutError, ReadOnlyServer, *_RETRY)):
            return only  # one server and a failure of its own (a password, a database name): the driver's words
        return NoWritableServer(text if len(order) == 1 else f"no read-write server: {text}")

    async def _try(self, server: Server, deadline: float) -> ImdsConnection:
        """Connect to ``server`` until ``deadline``, asking again while it answers but cannot be used yet."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return await self.connect_to(server, max(0.01, deadline - loop.time()))
            except (*_RETRY, ReadOnlyServer):
                if loop.time() + REPOLL >= deadline:
                    raise
            await asyncio.sleep(REPOLL)

    async def connect_to(self, server: Server, within: float | None = None) -> ImdsConnection:
        """One attempt on ``server``: a connection whose sessions are read-write, within ``within`` seconds."""
        within = self.connect_timeout if within is None else within
        conn: ImdsConnection | None = None
        try:
            async with asyncio.timeout(within):
                conn = await asyncpg.connect(**self._arguments(server, within))
                _refuse_read_only(*await conn.fetchrow(_READ_ONLY))
        except BaseException:
            if conn is not None:
                conn.terminate()
            raise
        conn.imds_server = server
        conn.imds_unconfirmed = False
        conn.add_log_listener(_heard)
        self._keepalive(conn)
        return conn

    def _arguments(self, server: Server, within: float) -> dict[str, Any]:
        tls = self.database.params_dsn()
        arguments: dict[str, Any] = {
            "host": server.host, "port": server.port, "user": self.database.user,
            "password": self.database.password, "database": self.database.name, "timeout": within,
            "command_timeout": self.client_timeout, "server_settings": self._server_settings,
            "connection_class": ImdsConnection,
        }
        if tls is not None:
            arguments["dsn"] = tls  # asyncpg reads sslmode, sslrootcert, sslcert, sslkey as libpq does
        return arguments

    def _keepalive(self, conn: ImdsConnection) -> None:
        """Keepalives and TCP_USER_TIMEOUT on a TCP connection: a vanished server breaks it within seconds."""
        transport = getattr(conn, "_transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or sock.family not in {socket.AF_INET, socket.AF_INET6}:
            return
        idle = max(1, math.ceil(self.connect_timeout))
        options: list[tuple[int, int, int]] = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
        for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", max(1, idle // 3)), ("TCP_KEEPCNT", 3),
                            ("TCP_USER_TIMEOUT", user_timeout_ms(self.connect_timeout, self.client_timeout))):
            if hasattr(socket, name):
                options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
        for level, option, value in options:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)


def _refuse_read_only(standby: bool, read_only: bool) -> None:
    if read_only:
        raise ReadOnlyServer("read-only (a standby)" if standby else "read-only (default_transaction_read_only is on)")


def user_timeout_ms(connect_timeout: float, statement_timeout: float) -> int:
    """``TCP_USER_TIMEOUT``: sent data unacknowledged this long (ms) breaks the connection."""
    return int((connect_timeout + statement_timeout) * 1000)
