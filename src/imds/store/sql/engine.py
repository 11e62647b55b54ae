"""Engine creation: PostgreSQL through a ``Connector``, SQLite with its pragmas and write locking."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from imds.config.database import parse_database
from imds.store.sql.connect import Connector
from imds.store.sql.health import StoreHealth
from imds.store.sql.pool import watch_pool


def application_name() -> str:
    """The name this process's PostgreSQL sessions carry (``pg_stat_activity.application_name``)."""
    return f"imds-{os.getpid()}"


def is_sqlite(url: str) -> bool:
    """Whether the URL names an SQLite database."""
    return parse_database(url).kind == "sqlite"


def connector_for(url: str, *, connect_timeout: float = 5.0, statement_timeout: float = 5.0,
                  quiet: bool = False) -> Connector:
    """The ``Connector`` for a PostgreSQL URL: its servers, and the session every connection starts.

    The session name lets operators (and tests) find one process's connections;
    ``statement_timeout`` bounds every statement on the server as ``command_timeout`` does
    on the client, so a frozen server cannot hold one either. ``quiet``: no ``store.*`` log
    lines (one-shot commands such as migrations, whose error line says it all). The URL's own
    ``connect_timeout`` (libpq's, seconds per server) replaces ``connect_timeout``.
    """
    server_settings = {"application_name": application_name(),
                       "statement_timeout": str(max(1, int(statement_timeout * 1000)))}
    database = parse_database(url)
    connect_timeout = database.connect_timeout or connect_timeout
    return Connector(database, connect_timeout=connect_timeout, statement_timeout=statement_timeout,
                     server_settings=server_settings, health=StoreHealth(database.where, quiet=quiet))


def create_engine(url: str, *, connect_timeout: float = 5.0, statement_timeout: float = 5.0) -> AsyncEngine:
    """An async engine. SQLite gets WAL, foreign keys, full fsync and BEGIN IMMEDIATE.

    Nothing waits on the database without a bound: PostgreSQL connections are opened by a
    ``Connector`` (``connect_timeout`` per server, a read-write server only; see ``connect``)
    and checked out of the pool within ``connect_timeout``, every statement ends after
    ``statement_timeout``; SQLite waits for its write lock at most ``statement_timeout`` (the
    busy timeout).

    BEGIN IMMEDIATE takes SQLite's write lock when a transaction starts rather than at
    its first write, so two writers never both read and then fail to upgrade their lock.
    ``synchronous=FULL`` makes a commit durable before it returns, which WAL's default
    (NORMAL) does not promise on power loss.
    """
    if not is_sqlite(url):
        return postgresql_engine(connector_for(url, connect_timeout=connect_timeout,
                                               statement_timeout=statement_timeout, quiet=True))
    plain = make_url(url).set(drivername="sqlite+aiosqlite")
    private_database(plain.database)
    engine = create_async_engine(plain, connect_args={"timeout": statement_timeout})
    _sqlite_session(engine.sync_engine, statement_timeout)
    return engine


def postgresql_engine(connector: Connector) -> AsyncEngine:
    """An async engine whose pool opens its connections through ``connector`` (see ``pool``)."""
    engine = create_async_engine("postgresql+asyncpg://", async_creator=connector.connect,
                                 pool_timeout=connector.connect_timeout)
    watch_pool(engine.sync_engine, connector)
    return engine


def private_database(database: str | None) -> None:
    """Create an SQLite database file that does not exist yet mode 0600, in a directory made 0700.

    SQLite gives its ``-wal`` and ``-shm`` files the database file's mode, so they are
    private too. An existing file or directory keeps the mode it has (the operator's).
    """
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # an empty file is an empty database


def create_sqlite_write_engine(url: str, *, statement_timeout: float = 5.0) -> sa.Engine:
    """A synchronous SQLite engine for the write path (see ``writeconn``), set up like ``create_engine``'s.

    Its connections are opened and committed on the store's writer thread and run their
    statements on the event loop's, one user at a time, hence ``check_same_thread=False``.
    """
    plain = make_url(url).set(drivername="sqlite+pysqlite")
    private_database(plain.database)
    engine = sa.create_engine(plain, connect_args={"timeout": statement_timeout, "check_same_thread": False})
    _sqlite_session(engine, statement_timeout)
    return engine


def _sqlite_session(engine: sa.Engine, statement_timeout: float) -> None:
    """WAL, foreign keys, full fsync and the busy timeout on every connection; BEGIN IMMEDIATE for writers."""
    busy = f"busy_timeout={max(1, int(statement_timeout * 1000))}"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, not the driver, open transactions.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=FULL", busy):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Readers (marked with the imds_read execution option) take no write lock.
        read_only = conn.get_execution_options().get("imds_read", False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
