"""``imds db upgrade|current|check`` run as the real command against SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from imds.store import open_store

IMDS = Path(sys.executable).with_name("imds")
TABLES = {"instances", "instance_metadata", "instance_userdata", "instance_ip_addresses", "changes", "feed_head",
          "instance_passwords", "instance_os", "instance_events", "instance_messages", "audit_log",
          "project_attributes", "notices", "notice_acks"}
HEAD = "0008"
NOT_MIGRATED = "(none: the database is not migrated)"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def imds_db(*commands: list[str], home: Path) -> list[Ran]:
    """Run ``imds db ARGS...`` for each argument list, in parallel, with no IMDS_* settings inherited."""
    assert IMDS.exists(), f"the imds console script is not installed next to {sys.executable}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMDS_")}
    env |= {"HOME": str(home), "XDG_DATA_HOME": str(home / "data")}
    running = [
        subprocess.Popen(
            [str(IMDS), "db", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=home
        )
        for args in commands
    ]
    results = []
    for process in running:
        stdout, stderr = process.communicate(timeout=60)
        results.append(Ran(process.returncode, stdout, stderr))
    return results


def one(args: list[str], home: Path) -> Ran:
    return imds_db(args, home=home)[0]


def assert_one_line_error(ran: Ran, *fragments: str) -> None:
    """A failed command: non-zero exit, one 'Error: ...' line on stderr, no traceback."""
    assert ran.returncode == 1, ran
    assert "Traceback" not in ran.stderr
    lines = ran.stderr.splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith("Error: "), ran.stderr
    for fragment in fragments:
        assert fragment in lines[0], ran.stderr


async def empty_snapshot(url: str) -> tuple[list[object], int]:
    store = open_store(url)
    try:
        return await store.snapshot()  # type: ignore[return-value]
    finally:
        await store.close()


async def postgres_tables(url: str) -> dict[str, object]:
    import asyncpg  # noqa: PLC0415 - only this test talks to PostgreSQL directly

    conn = await asyncpg.connect(url)
    try:
        tables = {
            r["table_name"]
            for r in await conn.fetch("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        }
        version = await conn.fetchval("SELECT version_num FROM alembic_version")
        head = [tuple(r) for r in await conn.fetch("SELECT id, seq FROM feed_head")]
        return {"tables": tables, "version": version, "feed_head": head}
    finally:
        await conn.close()


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_upgrade_current_check_on_fresh_sqlite(tmp_path: Path) -> None:
    """On a new SQLite file, upgrade creates the schema, current prints "<head> (head)" and check passes."""
    path = tmp_path / "nested" / "imds.db"
    url = f"sqlite:///{path}"
    upgraded = one(["upgrade", "--db", url], tmp_path)
    assert upgraded.returncode == 0, upgraded
    assert upgraded.stdout.strip() == "database upgraded to head"
    assert path.exists()

    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == TABLES | {"alembic_version"}
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]
        assert conn.execute("SELECT id, seq FROM feed_head").fetchall() == [(1, 0)]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()
    assert asyncio.run(empty_snapshot(url)) == ([], 0)

    current, check = imds_db(["current", "--db", url], ["check", "--db", url], home=tmp_path)
    assert (current.returncode, current.stdout.strip()) == (0, f"{HEAD} (head)"), current
    assert check.returncode == 0, check
    assert check.stdout.strip().splitlines()[-1] == "schema matches migrations"


def test_current_on_empty_sqlite_says_not_migrated(tmp_path: Path) -> None:
    """On an empty SQLite database, current says it is not migrated and check fails with one line."""
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    url = f"sqlite:///{path}"
    current, check = imds_db(["current", "--db", url], ["check", "--db", url], home=tmp_path)
    assert (current.returncode, current.stdout.strip()) == (0, NOT_MIGRATED), current
    assert_one_line_error(check, "not up to date")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall() == []
    conn.close()


@pytest.mark.postgres
def test_upgrade_current_check_on_fresh_postgres(postgres_empty_url: str, tmp_path: Path) -> None:
    """On a new PostgreSQL database, upgrade creates the schema, current prints "<head> (head)" and check passes."""
    url = postgres_empty_url
    upgraded = one(["upgrade", "--db", url], tmp_path)
    assert upgraded.returncode == 0, upgraded
    assert upgraded.stdout.strip() == "database upgraded to head"
    found = asyncio.run(postgres_tables(url))
    assert found["tables"] == TABLES | {"alembic_version"}
    assert found["version"] == HEAD
    assert found["feed_head"] == [(1, 0)]
    assert asyncio.run(empty_snapshot(url)) == ([], 0)

    current, check = imds_db(["current", "--db", url], ["check", "--db", url], home=tmp_path)
    assert (current.returncode, current.stdout.strip()) == (0, f"{HEAD} (head)"), current
    assert check.returncode == 0, check
    assert check.stdout.strip().splitlines()[-1] == "schema matches migrations"


@pytest.mark.postgres
def test_unreachable_or_missing_postgres_fails_with_one_line(postgres_server, tmp_path: Path) -> None:
    """A closed port fails upgrade and current, and a missing database fails upgrade: exit 1, one line, no traceback."""
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/imds"
    missing = postgres_server.url("imds_no_such_database")
    *unreachable, absent = imds_db(
        ["upgrade", "--db", url],
        ["current", "--db", url],
        ["upgrade", "--db", missing],
        home=tmp_path,
    )
    for ran in unreachable:
        assert_one_line_error(ran, "migration failed", "127.0.0.1")
        assert ran.stdout == ""
    assert_one_line_error(absent, "migration failed", "imds_no_such_database", "does not exist")
