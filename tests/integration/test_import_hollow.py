"""``imds import --from-hollow DSN``: a hollow-metadataservice database, in hollow's own schema, into imds.

hollow's tables are made from its migrations (``tests/fixtures/hollow/schema.sql``) on the real
PostgreSQL server the tests start, and filled with a generated fleet (``tests/hollow_data.py``).

Addresses in interface notation (``10.70.17.9/31``: a host with its prefix) are taken or refused
by imds's own address rules, whichever they are; the test asks those rules which, and expects
exactly that: taken and stored as sent, or refused with the reason, one line per instance.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from hollow_data import HollowInstance, instance
from imds.errors import InvalidInput
from imds.services.records.wire import parse_metadata_write
from postgres_server import PostgresServer
from serve_process import IMDS, clean_env, free_port

pytestmark = pytest.mark.postgres
FLEET = 20_000
PROGRESS = re.compile(r"imds import: (\d+)/(\d+) items \((\d+) read, (\d+) written, \d+/s\)")


def imds(*args: str) -> subprocess.CompletedProcess[str]:
    """The real executable with a clean environment."""
    with tempfile.TemporaryDirectory(prefix="imds-hollow-") as home:
        return subprocess.run([str(IMDS), *args, "--log-level", "warning"], env=clean_env(Path(home)),
                              capture_output=True, text=True, timeout=300, check=False)


def interface_notation_taken() -> bool:
    """Whether imds's address rules take a host written with its prefix (they decide; the test follows)."""
    write = {"id": str(uuid.uuid4()), "ipAddresses": ["10.70.17.9/31", "2604:1380:4641:1f00::9/127"], "metadata": {}}
    try:
        parse_metadata_write(write)
    except InvalidInput:
        return False
    return True


def expect_stored(record: dict, generated: HollowInstance) -> None:
    """The exported record is the generated instance: document, addresses as sent, userdata byte for byte."""
    assert record.get("metadata") == generated.metadata
    assert sorted(record["ipAddresses"]) == sorted(generated.addresses)
    if not generated.has_userdata:
        assert "userdata" not in record
        return
    stored = record["userdata"]
    raw = base64.b64decode(stored) if record["userdata_encoding"] == "base64" else stored.encode()
    assert raw == (generated.userdata or b"")


def last_progress(stderr: str) -> tuple[int, ...]:
    """(done, total, read, written) of the last plain progress line."""
    found = [tuple(int(g) for g in m.groups()) for m in PROGRESS.finditer(stderr)]
    assert found, stderr
    return found[-1]


def test_a_hollow_fleet_lands_whole_in_a_new_postgres_database_and_a_rerun_changes_nothing(
    hollow_db: Callable[[int], str], postgres_empty_url: str,
) -> None:
    """20,000 instances: counts, every record read back, binary userdata exact, then all unchanged."""
    source = hollow_db(FLEET)
    fleet = [instance(n) for n in range(FLEET)]
    taken = interface_notation_taken()
    refused = {i.id for i in fleet if i.interface_notation and not taken}
    stored = [i for i in fleet if i.id not in refused]
    assert len(refused) in {0, FLEET * 2 // 25}  # the generated fleet has 8% of them
    args = ("import", "--from-hollow", source, "--db", postgres_empty_url, "--progress-interval", "0")

    first = imds(*args)
    assert first.returncode == (1 if refused else 0), first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith(f"{len(stored)} created, 0 updated, 0 unchanged, 0 stale, {len(refused)} rejected in ")
    rejected = [re.fullmatch(r"rejected instance \d+ \(([0-9a-f-]{36})\): ipAddresses\[\d\]: (.*)", line)
                for line in lines[1:]]
    assert all(match is not None and "has host bits set" in match[2] for match in rejected), lines[1:4]
    assert {match[1] for match in rejected if match is not None} == refused
    assert last_progress(first.stderr) == (FLEET, FLEET, FLEET, len(stored))

    exported = imds("export", "--db", postgres_empty_url)
    assert exported.returncode == 0, exported.stderr
    records = {r["id"]: r for r in map(json.loads, exported.stdout.splitlines())}
    assert sorted(records) == sorted(i.id for i in stored)
    for generated in stored:
        expect_stored(records[generated.id], generated)
    binary = next(i for i in stored if i.userdata is not None and i.userdata.startswith(b"\x1f\x8b"))
    shown = imds("get", binary.id, "--db", postgres_empty_url, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert base64.b64decode(json.loads(shown.stdout)["userdata"]) == binary.userdata

    again = imds(*args)
    assert again.returncode == first.returncode
    assert again.stdout.splitlines()[0].startswith(
        f"0 created, 0 updated, {len(stored)} unchanged, 0 stale, {len(refused)} rejected in ")
    assert last_progress(again.stderr) == (FLEET, FLEET, FLEET, 0)


def test_a_new_sqlite_data_dir_is_created_and_migrated(hollow_db: Callable[[int], str], tmp_path: Path) -> None:
    """Into a data directory that does not exist yet: every instance read back as generated."""
    source = hollow_db(120)
    data = tmp_path / "new-data"
    ran = imds("import", "--from-hollow", source, "--data-dir", str(data), "--batch-size", "50")
    taken = interface_notation_taken()
    fleet = [instance(n) for n in range(120)]
    stored = [i for i in fleet if taken or not i.interface_notation]
    assert ran.stdout.startswith(f"{len(stored)} created, 0 updated, 0 unchanged, 0 stale, {120 - len(stored)} "), (
        ran.stdout, ran.stderr)
    exported = imds("export", "--data-dir", str(data))
    records = {r["id"]: r for r in map(json.loads, exported.stdout.splitlines())}
    assert sorted(records) == sorted(i.id for i in stored)
    for generated in stored:
        expect_stored(records[generated.id], generated)


def test_a_database_that_is_not_hollows_or_not_there_is_one_line(postgres_server: PostgresServer,
                                                                 tmp_path: Path) -> None:
    """No hollow tables, or no server: one error line naming the database (no traceback), nothing created."""
    target = ("--data-dir", str(tmp_path / "data"))
    not_hollow = imds("import", "--from-hollow", postgres_server.url("postgres"), *target)
    assert not_hollow.returncode == 1
    assert "has no hollow tables" in not_hollow.stderr
    assert "Traceback" not in not_hollow.stderr
    closed = free_port()
    absent = imds("import", "--from-hollow", f"postgresql://hollow:secret@127.0.0.1:{closed}/hollow", *target)
    assert absent.returncode == 1
    assert f"hollow database: postgresql server 127.0.0.1:{closed}" in absent.stderr
    assert "connection refused" in absent.stderr
    assert "secret" not in absent.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("args", [(), ("fleet.jsonl", "--from-hollow", "postgresql://h@127.0.0.1/h")])
def test_source_or_hollow_but_one_of_them(args: tuple[str, ...], tmp_path: Path) -> None:
    """Neither SOURCE nor --from-hollow, or both: a usage error."""
    (tmp_path / "fleet.jsonl").write_text("")
    ran = imds("import", *(str(tmp_path / a) if a.endswith(".jsonl") else a for a in args),
               "--data-dir", str(tmp_path / "data"))
    assert ran.returncode == 2
    assert "give SOURCE or --from-hollow DSN" in ran.stderr


def test_every_server_of_a_repeated_host_is_tried(hollow_db: Callable[[int], str], postgres_server: PostgresServer,
                                                  tmp_path: Path) -> None:
    """?host=REAL&host=CLOSED: the real server is read (asyncpg's own parse kept only the last host, refused)."""
    database = hollow_db(5).rsplit("/", 1)[1]
    real, closed = f"{postgres_server.host}:{postgres_server.port}", f"127.0.0.1:{free_port()}"
    source = f"postgresql://{postgres_server.superuser}@/{database}?host={real}&host={closed}"
    data = tmp_path / "data"
    ran = imds("import", "--from-hollow", source, "--data-dir", str(data))
    stored = [i for i in (instance(n) for n in range(5)) if interface_notation_taken() or not i.interface_notation]
    assert ran.stdout.startswith(f"{len(stored)} created, "), (ran.stdout, ran.stderr)


@pytest.mark.parametrize(("dsn", "says"), [
    ("postgresql://hollow:secret@h1:26257,h2:x/hollow", "port 'x' is not a number"),
    ("postgresql://hollow:secret@[::1/hollow", "host '[::1': write an IPv6 address as [ADDRESS]"),
    ("postgresql://hollow:secret@h1/hollow?sslmode=bogus", "sslmode='bogus' is not one of"),
])
def test_a_malformed_dsn_is_one_line_and_exit_2(dsn: str, says: str, tmp_path: Path) -> None:
    """A DSN that cannot be read: a usage error naming the problem (asyncpg's parser raised a traceback)."""
    ran = imds("import", "--from-hollow", dsn, "--data-dir", str(tmp_path / "data"))
    assert ran.returncode == 2, ran.stderr
    assert f"Invalid value for '--from-hollow': {says}" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert "secret" not in ran.stderr
    assert not (tmp_path / "data").exists()
