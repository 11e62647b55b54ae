"""The PostgreSQL pool's side of failover: a lost server empties the pool, a moved primary too.

SQLAlchemy's own pre-ping waits the whole statement timeout on every pooled connection to a
frozen server, one checkout after another, and a client-side timeout never counts as a
disconnect, so the pool keeps handing out connections to the dead server. Here instead:

- a statement that timed out or whose connection broke (``handle_error``) marks its server
  lost (``Connector.lost``) and invalidates every pooled connection made before it;
- a checkout (``checkout``) hands out a connection only if it reached the current primary and,
  unless it was just opened, answers a ping within ``ping_timeout`` (the shorter of the two
  timeouts); otherwise the pool is invalidated and a new connection opened through the
  ``Connector`` (last known primary first).
"""

from __future__ import annotations

from typing import Any

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DisconnectionError, InvalidatePoolError
from sqlalchemy.util import await_only

from imds.store.sql.connect import Connector, problem_of, server_of

# A server that stopped answering, went away or stopped taking writes (demoted): try the others.
GONE = (TimeoutError, ConnectionError, asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError,
        asyncpg.AdminShutdownError, asyncpg.CrashShutdownError, asyncpg.CannotConnectNowError,
        asyncpg.ReadOnlySQLTransactionError)


def watch_pool(engine: sa.Engine, connector: Connector) -> None:
    """Attach the failover rules above to ``engine``'s pool."""
    ping_timeout = min(connector.connect_timeout, connector.statement_timeout)

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        exc = gone(context.original_exception)
        if exc is None:
            return
        connector.lost(server_of(_driver(context.connection)), problem_of(exc, connector.client_timeout))
        context.is_disconnect = True  # this connection is dropped, and every one made before it

    @event.listens_for(engine, "connect")
    def _on_connect(_dbapi_connection: Any, record: Any) -> None:
        record.info["imds_fresh"] = True

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        raw = dbapi_connection.driver_connection
        server = server_of(raw)
        if connector.primary is not None and server != connector.primary:
            raise DisconnectionError(f"{server} is not the primary any more ({connector.primary} is)")
        if record.info.pop("imds_fresh", False):
            return
        try:
            await_only(raw.execute("SELECT 1", timeout=ping_timeout))
        except Exception as failed:
            exc = gone(failed)
            if exc is None:
                raise
            connector.lost(server, problem_of(exc, ping_timeout))
            raise InvalidatePoolError(f"{server}: {problem_of(exc, ping_timeout)}") from exc


def gone(exc: BaseException) -> BaseException | None:
    """The driver's error behind ``exc`` (SQLAlchemy wraps asyncpg's) when it says the server is gone, else None."""
    seen: BaseException | None = exc
    for _depth in range(4):
        if seen is None:
            return None
        if isinstance(seen, GONE):
            return seen
        seen = seen.__cause__
    return None


def _driver(connection: sa.Connection | None) -> object:
    """The asyncpg connection under a SQLAlchemy one, if it still has one (None once invalidated)."""
    if connection is None or connection.invalidated or connection.closed:
        return None
    try:
        return connection.connection.driver_connection
    except sa.exc.SQLAlchemyError:
        return None
