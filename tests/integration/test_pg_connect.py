"""How imds connects to PostgreSQL, against a real server: every URL form, per-server timeouts, read-write only.

A closed port or a socket that accepts but never answers (a frozen server) comes first in the
URL; imds still reaches the real server, each server within its own connect timeout, and
tries the server that worked first next time. A read-only server is refused by name; TCP
connections carry keepalives and ``TCP_USER_TIMEOUT``; a COMMIT whose wait for a synchronous
standby was cancelled is not acknowledged.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from fault_tools import faulty_postgres
from helpers import admin_client, make_settings, running_app, wait_for_async
from imds.config.database import Server
from imds.errors import StoreUnavailable
from imds.store import open_store
from imds.store.sql import migrate
from imds.store.sql.connect import CommitNotConfirmed, NoWritableServer, confirm_commit, user_timeout_ms
from imds.store.sql.engine import connector_for
from imds.store.sql.store import PING_WAIT, SqlStore
from postgres_server import PostgresServer, _server_owner, in_thread
from serve_process import run_imds

pytestmark = pytest.mark.postgres


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (what a frozen server looks like)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def _forms(server: PostgresServer, database: str, dead: int) -> dict[str, str]:
    real, gone = f"127.0.0.1:{server.port}", f"127.0.0.1:{dead}"
    base = f"postgresql://{server.superuser}@"
    return {
        "netloc": f"{base}{gone},{real}/{database}?target_session_attrs=read-write",
        "query": f"{base}/{database}?host=127.0.0.1,127.0.0.1&port={dead},{server.port}",
        "repeated": f"{base}/{database}?host={gone}&host={real}",
        "socket": f"{base}/{database}?host={gone}&host={server.socket_dir}&port={dead},{server.port}",
    }


def test_every_multi_host_form_migrates_and_reads(postgres_server: PostgresServer, postgres_empty_url: str,
                                                  tmp_path: Path) -> None:
    """`imds db upgrade` / `current` take each form with a dead server first (the netloc form used to crash)."""
    database = postgres_empty_url.rsplit("/", 1)[1]
    forms = _forms(postgres_server, database, _closed_port())
    upgraded = run_imds(tmp_path, "db", "upgrade", "--db", forms["netloc"])
    assert upgraded.returncode == 0, upgraded.stderr
    for form, url in forms.items():
        current = run_imds(tmp_path, "db", "current", "--db", url)
        assert current.returncode == 0, (form, current.stderr)
        assert "(head)" in current.stdout, (form, current.stdout)


@pytest.mark.anyio
async def test_a_server_that_never_answers_costs_only_its_own_timeout(postgres_server: PostgresServer,
                                                                      black_hole: int) -> None:
    """A frozen first server: the real one is reached within the same connect timeout, then tried first."""
    url = f"postgresql://{postgres_server.superuser}@127.0.0.1:{black_hole},127.0.0.1:{postgres_server.port}/postgres"
    connector = connector_for(url, connect_timeout=3.0, statement_timeout=3.0, quiet=True)
    real = Server("127.0.0.1", postgres_server.port)
    first = await connector.connect()  # asyncpg's own host list spends its whole timeout on the first host
    try:
        assert await first.fetchval("SELECT NOT pg_is_in_recovery()")
        assert connector.primary == real
    finally:
        await first.close()
    tried: list[Server] = []
    attempt = connector.connect_to

    async def recorded(server: Server, within: float | None = None) -> object:
        tried.append(server)
        return await attempt(server, within)

    connector.connect_to = recorded  # type: ignore[method-assign]
    second = await connector.connect()  # the known primary first: the black hole is not even tried
    try:
        assert tried[0] == real  # (the black hole joins only if the real one took over HEAD_START)
        assert connector.primary == real
    finally:
        await second.close()


@pytest.mark.anyio
async def test_every_server_failing_is_one_error_naming_each(black_hole: int) -> None:
    """No server usable: one NoWritableServer naming each server and what it did."""
    dead = _closed_port()
    url = f"postgresql://imds@127.0.0.1:{black_hole},127.0.0.1:{dead}/imds"
    connector = connector_for(url, connect_timeout=1.0, statement_timeout=1.0, quiet=True)
    with pytest.raises(NoWritableServer) as raised:
        await connector.connect()
    text = str(raised.value)
    assert text.startswith("no read-write server: ")
    assert f"127.0.0.1:{black_hole} no answer within 1 s" in text
    assert f"127.0.0.1:{dead} connection refused" in text
    assert connector.health.problem == text.removeprefix("no read-write server: ")


@pytest.mark.anyio
async def test_a_ping_of_a_frozen_server_answers_within_its_wait_and_is_shared(black_hole: int) -> None:
    """/readyz's ping gives up after PING_WAIT (the attempt goes on); a second ping joins it, starts none."""
    store = open_store(f"postgresql://imds@127.0.0.1:{black_hole}/imds", connect_timeout=5.0)
    assert isinstance(store, SqlStore)
    attempts = 0
    connect = store._engine.sync_engine.pool._creator  # the pool's way to a new connection

    def counting() -> object:
        nonlocal attempts
        attempts += 1
        return connect()

    store._engine.sync_engine.pool._creator = counting
    try:
        for _ in range(2):
            waited = rf"no answer within {PING_WAIT:g} s \(still waiting\)"
            with pytest.raises(StoreUnavailable, match=waited) as raised:
                await store.ping()
            assert f"127.0.0.1:{black_hole}" in raised.value.message
        assert attempts == 1
    finally:
        await store.close()


def _read_only_database(server: PostgresServer, url: str) -> None:
    name = url.rsplit("/", 1)[1]

    async def run() -> None:
        conn = await asyncpg.connect(server.url("postgres"))
        try:
            await conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        finally:
            await conn.close()

    in_thread(lambda: asyncio.run(run()))


def test_a_read_only_server_is_refused_naming_it(postgres_server: PostgresServer, postgres_url: str,
                                                 tmp_path: Path) -> None:
    """Sessions that are read-only (a standby, default_transaction_read_only): one line, server named, exit 1."""
    _read_only_database(postgres_server, postgres_url)
    ran = run_imds(tmp_path, "db", "upgrade", "--db", postgres_url)
    assert ran.returncode == 1, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert f"postgresql server 127.0.0.1:{postgres_server.port}" in lines[0]
    assert "read-only (default_transaction_read_only is on)" in lines[0]


@pytest.mark.anyio
async def test_tcp_connections_carry_keepalives_and_a_user_timeout(postgres_server: PostgresServer) -> None:
    """SO_KEEPALIVE and TCP_USER_TIMEOUT are set, so a vanished server breaks the connection."""
    connector = connector_for(postgres_server.url(), connect_timeout=2.0, statement_timeout=3.0, quiet=True)
    conn = await connector.connect()
    try:
        sock = conn._transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == user_timeout_ms(2.0, 3.5)
    finally:
        await conn.close()


@pytest.mark.anyio
async def test_a_unix_socket_url_reaches_the_server_and_is_named(postgres_server: PostgresServer,
                                                                  postgres_url: str) -> None:
    """``?host=/dir`` connects over the socket; errors name the socket file, not localhost:5432."""
    database = postgres_url.rsplit("/", 1)[1]
    sockets = f"host={postgres_server.socket_dir}&port={postgres_server.port}"
    store = open_store(f"postgresql://{postgres_server.superuser}@/{database}?{sockets}", connect_timeout=2.0)
    try:
        await store.ping()
    finally:
        await store.close()
    missing = open_store(f"postgresql://nobody@/postgres?host={postgres_server.socket_dir}&port=1", connect_timeout=1.0)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            await missing.ping()
    finally:
        await missing.close()
    assert f"postgresql server {postgres_server.socket_dir}/.s.PGSQL.1" in raised.value.message
    assert "localhost" not in raised.value.message


def _certificates(directory: Path, owner: tuple[int, int] | None) -> Path:
    """A CA and a server certificate for 127.0.0.1 signed by it (server.crt, server.key); the CA's path."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the openssl binary is not installed (apt-get install openssl)", pytrace=False)

    def run(*args: str) -> None:
        done = subprocess.run([openssl, *args], cwd=directory, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=imds-test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
        "-out", "server.csr")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "san.ext", "-out", "server.crt")
    for name in ("server.crt", "server.key"):
        (directory / name).chmod(0o600)
        if owner is not None:
            os.chown(directory / name, *owner)
    return directory / "ca.pem"


@pytest.mark.anyio
async def test_tls_options_are_honoured(tmp_path: Path) -> None:
    """sslmode=verify-full with sslrootcert connects over TLS; a CA that did not sign the server is refused."""
    with faulty_postgres() as pg:
        url = pg.database()
        in_thread(lambda: migrate.upgrade(url))
        ca = _certificates(pg.info.socket_dir, _server_owner())
        await _set_system(pg.info, "ssl_cert_file", f"'{pg.info.socket_dir / 'server.crt'}'")
        await _set_system(pg.info, "ssl_key_file", f"'{pg.info.socket_dir / 'server.key'}'")
        await _set_system(pg.info, "ssl", "on")
        verified = f"{url}?sslmode=verify-full&sslrootcert={ca}"

        async def over_tls(target: str) -> bool:
            conn = await connector_for(target, connect_timeout=5.0, quiet=True).connect()
            try:
                return bool(await conn.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))
            finally:
                await conn.close()

        await wait_for_async(lambda: over_tls(verified), what="a verified TLS session", timeout=30)
        assert not await over_tls(f"{url}?sslmode=disable")
        other_ca = tmp_path / "other"
        other_ca.mkdir()
        wrong = f"{url}?sslmode=verify-full&sslrootcert={_certificates(other_ca, None)}"
        store = open_store(wrong, connect_timeout=5.0)
        try:
            with pytest.raises(StoreUnavailable, match="certificate verify failed") as raised:
                await store.ping()
        finally:
            await store.close()
        assert f"postgresql server 127.0.0.1:{pg.info.port}" in raised.value.message


@pytest.mark.anyio
async def test_a_commit_the_synchronous_standby_never_confirmed_is_not_acknowledged() -> None:
    """A COMMIT waiting for a standby that never comes, then cancelled: PostgreSQL says success; imds answers 503."""
    with faulty_postgres() as pg:
        url = pg.database()
        in_thread(lambda: migrate.upgrade(url))
        await _set_system(pg.info, "synchronous_standby_names", "'ghost'")
        # The driver's view: the cancelled wait ends in a WARNING and a COMMIT that reports success.
        connector = connector_for(url, connect_timeout=2.0, statement_timeout=10.0, quiet=True)
        conn = await connector.connect()
        try:
            committing = asyncio.ensure_future(conn.execute("BEGIN; CREATE TABLE t (x int); COMMIT"))
            await _cancel_commit_wait(pg.info)
            await committing
            with pytest.raises(CommitNotConfirmed, match="not confirmed by the synchronous standby"):
                confirm_commit(conn)
            confirm_commit(conn)  # told once
        finally:
            conn.terminate()
        # Through the admin API: that write is answered 503 (its outcome unknown), never acknowledged.
        settings = make_settings(db=url, db_statement_timeout=10.0, db_connect_timeout=2.0)
        async with running_app(settings) as app, admin_client(app) as admin:
            body = {"id": "5b0c4a38-6a3e-4c4e-9f51-2f0a7a0000c1", "ipAddresses": ["10.9.9.9"], "metadata": {}}
            posting = asyncio.ensure_future(admin.post("/device-metadata", json=body))
            await _cancel_commit_wait(pg.info)
            answer = await posting
            assert answer.status_code == 503, answer.text
            assert "not confirmed by the synchronous standby" in answer.json()["message"]
            await _set_system(pg.info, "synchronous_standby_names", "''")

            async def written() -> bool:
                again = await admin.post("/device-metadata", json={**body, "metadata": {"again": 1}})
                return again.status_code == 200

            await wait_for_async(written, what="writes to be acknowledged again", timeout=30)


async def _cancel_commit_wait(server: PostgresServer) -> None:
    """pg_cancel_backend the session waiting for the synchronous standby (bounded wait for it to wait)."""
    conn = await asyncpg.connect(server.url("postgres"))
    try:

        async def cancelled() -> bool:
            return bool(await conn.fetchval(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"))

        await wait_for_async(cancelled, what="a COMMIT waiting for the standby", timeout=30)
    finally:
        await conn.close()


async def _set_system(server: PostgresServer, name: str, value: str) -> None:
    conn = await asyncpg.connect(server.url("postgres"))
    try:
        await conn.execute(f"ALTER SYSTEM SET {name} = {value}")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()
