"""Engine creation: async drivers, SQLite pragmas and write locking."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}


def async_url(url: str) -> str:
    """Map a plain ``sqlite:///`` or ``postgresql://`` URL onto the async driver imds uses."""
    parsed = make_url(url)
    driver = _DRIVERS.get(parsed.drivername, parsed.drivername)
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def application_name() -> str:
    """The name this process's PostgreSQL sessions carry (``pg_stat_activity.application_name``)."""
    return f"imds-{os.getpid()}"


def is_sqlite(url: str) -> bool:
    """Whether the URL names an SQLite database."""
    return make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str, *, connect_timeout: float = 5.0, statement_timeout: float = 5.0) -> AsyncEngine:
    """An async engine. SQLite gets WAL, foreign keys, full fsync and BEGIN IMMEDIATE.

    Nothing waits on the database without a bound: PostgreSQL connections time out after
    ``connect_timeout`` (asyncpg's ``timeout``, and the pool checkout), every statement
    after ``statement_timeout`` (asyncpg's ``command_timeout`` on the client, so a frozen
    server cannot hold it, and ``statement_timeout`` on the server); SQLite waits for its
    write lock at most ``statement_timeout`` (the busy timeout).

    BEGIN IMMEDIATE takes SQLite's write lock when a transaction starts rather than at
    its first write, so two writers never both read and then fail to upgrade their lock.
    ``synchronous=FULL`` makes a commit durable before it returns, which WAL's default
    (NORMAL) does not promise on power loss.
    """
    full = async_url(url)
    if not is_sqlite(full):
        # The session name lets operators (and tests) find one process's connections.
        server_settings = {
            "application_name": application_name(),
            "statement_timeout": str(max(1, int(statement_timeout * 1000))),
        }
        full, ssl = _sslmode(full)
        return create_async_engine(
            full, pool_pre_ping=True, pool_timeout=connect_timeout,
            connect_args={"timeout": connect_timeout, "command_timeout": statement_timeout,
                          "server_settings": server_settings, **ssl},
        )
    private_database(make_url(full).database)
    engine = create_async_engine(full, connect_args={"timeout": statement_timeout})
    _sqlite_session(engine.sync_engine, statement_timeout)
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


def _sslmode(url: str) -> tuple[str, dict[str, str]]:
    """The URL without libpq's ``?sslmode=`` (as hollow's and most PostgreSQL URLs carry it), and asyncpg's ``ssl``.

    SQLAlchemy hands every query parameter to ``asyncpg.connect`` as a keyword, and asyncpg
    names it ``ssl`` (taking the same values: disable, prefer, require, verify-ca, verify-full).
    """
    parsed = make_url(url)
    mode = parsed.query.get("sslmode")
    if mode is None:
        return url, {}
    plain = parsed.difference_update_query(["sslmode"]).render_as_string(hide_password=False)
    return plain, {"ssl": mode if isinstance(mode, str) else mode[-1]}


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
