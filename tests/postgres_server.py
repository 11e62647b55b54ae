"""A real PostgreSQL server for the test session, and one fresh migrated database per test.

The server starts the first time a test asks for it (``postgres_server``) and stops at the
end of the session, by PID. PostgreSQL refuses to run as root, and CI runs as root, so the
server runs as the ``postgres`` account through ``runuser``. When PostgreSQL is missing or
does not start, the fixture fails: a missing database must turn CI red, never skip tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from helpers import wait_for

SUPERUSER = "postgres"
DEBIAN_ROOT = Path("/usr/lib/postgresql")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
_T = TypeVar("_T")


@dataclass(frozen=True)
class PostgresServer:
    """Where the session's server listens; trust authentication, so no password."""

    host: str
    port: int
    superuser: str
    socket_dir: Path

    def url(self, database: str = "postgres") -> str:
        """A plain ``postgresql://`` URL for ``database`` on this server."""
        return f"postgresql://{self.superuser}@{self.host}:{self.port}/{database}"


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (0,)


def find_binaries() -> Path:
    """The bin directory of the newest installed PostgreSQL (Debian layout, then PATH)."""
    candidates = sorted(DEBIAN_ROOT.glob("*/bin/postgres"), key=lambda p: _version_key(p.parent))
    for postgres in reversed(candidates):
        if (postgres.parent / "initdb").exists():
            return postgres.parent
    found = shutil.which("postgres")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    pytest.fail(
        f"PostgreSQL is not installed: no {DEBIAN_ROOT}/*/bin/postgres and no postgres/initdb on PATH "
        "(install the Debian 'postgresql' package)",
        pytrace=False,
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    """Run ``argv`` as the unprivileged ``postgres`` account when we are root."""
    if os.geteuid() != 0:
        return argv
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    return [runuser, "-u", "postgres", "--", *argv]


def _server_owner() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail("running as root but there is no 'postgres' account to run PostgreSQL as", pytrace=False)
    return account.pw_uid, account.pw_gid


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _postmaster_pid(data: Path) -> tuple[int, str] | None:
    """The postmaster's PID and status from ``postmaster.pid`` (status is "ready" once it accepts)."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 8 or not lines[0].strip().isdigit():
        return None
    return int(lines[0]), lines[7].strip()


def in_thread(action: Callable[[], _T]) -> _T:
    """Run ``action`` in a worker thread: it may start its own event loop (asyncio.run)."""
    result: list[_T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(action())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    worker = threading.Thread(target=target, name="imds-test-db")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return result[0]


def _execute(server: PostgresServer, statement: str) -> None:
    """Run one statement on the maintenance database over a short-lived connection."""
    import asyncpg  # noqa: PLC0415 - only the PostgreSQL tests need the driver

    async def run() -> None:
        conn = await asyncpg.connect(host=server.host, port=server.port, user=server.superuser, database="postgres")
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    in_thread(lambda: asyncio.run(run()))


class _Server:
    """One postgres process in a temporary directory; ``stop`` ends it by PID."""

    def __init__(self) -> None:
        self.bin = find_binaries()
        owner = _server_owner()
        self.root = Path(tempfile.mkdtemp(prefix="imds-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        if owner is not None:
            os.chown(self.root, *owner)

    def start(self) -> PostgresServer:
        init = subprocess.run(
            _as_server_user(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    SUPERUSER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
            timeout=START_TIMEOUT,
            cwd=self.root,
        )
        if init.returncode != 0:
            pytest.fail(f"initdb failed (exit {init.returncode}):\n{init.stdout}\n{init.stderr}", pytrace=False)
        for _attempt in range(3):
            server = self._run_postgres()
            if server is not None:
                return server
        pytest.fail(f"postgres could not bind a free port on 127.0.0.1:\n{_tail(self.log)}", pytrace=False)

    def _run_postgres(self, port: int | None = None) -> PostgresServer | None:
        """Start postgres and wait until it accepts connections; None when another process took the port."""
        self.port = port or _free_port()
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                _as_server_user(
                    [
                        str(self.bin / "postgres"),
                        "-D",
                        str(self.data),
                        "-p",
                        str(self.port),
                        "-c",
                        "listen_addresses=127.0.0.1",
                        "-c",
                        f"unix_socket_directories={self.root}",
                        "-c",
                        "max_connections=200",
                        "-c",
                        "timezone=UTC",
                    ]
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
            )

        def started() -> str | None:
            """"ready", "port taken" (the caller tries another port), or None while starting."""
            if self.process is not None and self.process.poll() is not None:
                if "could not bind" in _tail(self.log):
                    return "port taken"
                pytest.fail(
                    f"postgres exited with status {self.process.returncode} while starting:\n{_tail(self.log)}",
                    pytrace=False,
                )
            status = _postmaster_pid(self.data)
            return "ready" if status is not None and status[1] == "ready" else None

        outcome = wait_for(started, what="postgres to become ready", timeout=START_TIMEOUT,
                           explain=lambda: _tail(self.log))
        if outcome == "port taken":
            return None
        return PostgresServer("127.0.0.1", self.port, SUPERUSER, self.root)

    def stop(self, *, keep: bool = False) -> None:
        """Fast shutdown of the postmaster by its PID, then remove the temporary directory (unless ``keep``)."""
        try:
            if self.process is not None and self.process.poll() is None:
                found = _postmaster_pid(self.data)
                # The postmaster is runuser's child; signal it directly (runuser would SIGKILL it after 2s).
                pid = found[0] if found is not None else self.process.pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
                try:
                    self.process.wait(timeout=STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    self.process.wait(timeout=STOP_TIMEOUT)
        finally:
            if not keep:
                shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server on 127.0.0.1 for the whole session (fails, never skips, when unavailable)."""
    server = _Server()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def postgres_empty_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty (unmigrated) database on the session's server, dropped after the test."""
    name = f"imds_test_{uuid.uuid4().hex[:16]}"
    _execute(postgres_server, f'CREATE DATABASE "{name}"')
    try:
        yield postgres_server.url(name)
    finally:
        _execute(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url(postgres_empty_url: str) -> str:
    """A fresh database on the session's server, migrated to head, dropped after the test."""
    from imds.store.sql import migrate  # noqa: PLC0415 - keep SQLAlchemy off plain collection

    in_thread(lambda: migrate.upgrade(postgres_empty_url))
    return postgres_empty_url


@pytest.fixture
def hollow_db(postgres_server: PostgresServer) -> Iterator[Callable[[int], str]]:
    """Make a hollow database holding the first ``count`` generated instances; its URL. Dropped after the test."""
    from hollow_data import create_hollow  # noqa: PLC0415 - the hollow tests' own data

    made: list[str] = []

    def make(count: int) -> str:
        name = f"hollow_{uuid.uuid4().hex[:12]}"
        _execute(postgres_server, f'CREATE DATABASE "{name}"')
        made.append(name)

        async def fill() -> None:
            import asyncpg  # noqa: PLC0415 - only the PostgreSQL tests need the driver

            conn = await asyncpg.connect(postgres_server.url(name))
            try:
                await create_hollow(conn, count)
            finally:
                await conn.close()

        in_thread(lambda: asyncio.run(fill()))
        return postgres_server.url(name)

    yield make
    for name in made:
        _execute(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
