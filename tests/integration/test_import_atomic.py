"""``imds import``: all-or-nothing by default, bounded by a row cap, and no import race in the hollow reader.

A database error mid-import is made real: a trigger refuses one instance's metadata insert
(SQLite's ``RAISE(ABORT)``, PostgreSQL's ``RAISE EXCEPTION``), in the third of three batches.
Memory is measured as the ``imds`` process's own peak RSS (``/usr/bin/time``'s ``%M``),
compared with the same import without the oversized item: no timing is asserted.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from postgres_server import in_thread
from serve_process import IMDS, clean_env

COUNT = 2500
BATCH = 1000
FAILING = 2300  # the instance whose insert the trigger refuses: in the third batch
TIME = "/usr/bin/time"


def fleet(count: int = COUNT) -> list[dict[str, Any]]:
    """``count`` instances with metadata and userdata, one address each."""
    items = []
    for n in range(count):
        instance_id = str(uuid.UUID(int=0xA7 << 120 | n, version=4))
        items.append({"id": instance_id, "ipAddresses": [f"10.77.{n >> 8}.{n & 255}"],
                      "metadata": {"id": instance_id, "hostname": f"node-{n}"},
                      "userdata": f"#cloud-config\nhostname: node-{n}\n", "userdata_encoding": "text"})
    return items


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def imds(*args: str, measure: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real executable, clean environment; with ``measure``, GNU time writes its peak RSS (KiB) there."""
    command = [str(IMDS), *args, "--log-level", "warning"]
    if measure is not None:
        command = [TIME, "-f", "%M", "-o", str(measure), *command]
    with tempfile.TemporaryDirectory(prefix="imds-atomic-") as home:
        return subprocess.run(command, env=clean_env(Path(home)), capture_output=True, text=True, timeout=600,
                              check=False)


async def _pg(url: str, statement: str) -> Any:
    import asyncpg  # noqa: PLC0415 - only the PostgreSQL runs need the driver

    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


def sql(url: str, statement: str) -> Any:
    """Run one statement on the database at ``url`` (SQLite file or PostgreSQL); the first value it returns."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            row = conn.execute(statement).fetchone()
        return None if row is None else row[0]
    return in_thread(lambda: asyncio.run(_pg(url.replace("postgresql+asyncpg://", "postgresql://"), statement)))


def refuse_one(url: str, instance_id: str) -> None:
    """A trigger that makes the database refuse ``instance_id``'s metadata row: a real error mid-import."""
    if url.startswith("sqlite"):
        sql(url, f"CREATE TRIGGER refuse BEFORE INSERT ON instance_metadata WHEN NEW.instance_id = '{instance_id}' "
                 "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        return
    sql(url, "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
             f"IF NEW.instance_id = '{instance_id}' THEN RAISE EXCEPTION 'refused by the test'; END IF; "
             "RETURN NEW; END $$")
    sql(url, "CREATE TRIGGER refuse BEFORE INSERT ON instance_metadata FOR EACH ROW EXECUTE FUNCTION refuse()")


def stored(url: str) -> tuple[int, int, int]:
    """(instances, change-feed rows, audit rows) in the database."""
    return (int(sql(url, "SELECT count(*) FROM instances")), int(sql(url, "SELECT count(*) FROM changes")),
            int(sql(url, "SELECT count(*) FROM audit_log")))


@pytest.mark.stores("sqlite", "postgres")
def test_a_database_error_mid_import_leaves_nothing_written(tmp_path, db_url):
    """Default: one transaction. The third batch fails: no instance, feed row or audit row is left; a clear error."""
    items = fleet()
    refuse_one(db_url, items[FAILING]["id"])
    done = imds("import", str(write_jsonl(tmp_path / "fleet.jsonl", items)), "--db", db_url,
                "--batch-size", str(BATCH))
    assert done.returncode != 0
    assert "refused by the test" in done.stderr
    assert "nothing was written" in done.stderr
    assert "Traceback" not in done.stderr
    assert stored(db_url) == (0, 0, 0)


@pytest.mark.stores("sqlite", "postgres")
def test_partial_says_it_may_leave_earlier_batches_written(tmp_path, db_url):
    """--partial commits batch by batch: the two batches before the failing one stay, and the error says so."""
    items = fleet()
    refuse_one(db_url, items[FAILING]["id"])
    done = imds("import", str(write_jsonl(tmp_path / "fleet.jsonl", items)), "--db", db_url,
                "--batch-size", str(BATCH), "--partial")
    assert done.returncode != 0
    assert "--partial: the batches before this one are written" in done.stderr
    assert stored(db_url)[0] == 2 * BATCH


@pytest.mark.stores("sqlite", "postgres")
def test_without_an_error_every_batch_commits_together(tmp_path, db_url):
    """One transaction over three batches: every instance, its feed row and two audit rows; a re-run writes nothing."""
    source = write_jsonl(tmp_path / "fleet.jsonl", fleet())
    done = imds("import", str(source), "--db", db_url, "--batch-size", str(BATCH))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{COUNT} created, 0 updated, 0 unchanged, 0 stale, 0 rejected")
    assert stored(db_url) == (COUNT, COUNT, 2 * COUNT)  # more than SPILL_ROWS: some were sent before the commit
    again = imds("import", str(source), "--db", db_url, "--batch-size", str(BATCH))
    assert again.stdout.startswith(f"0 created, 0 updated, {COUNT} unchanged")


def test_an_id_in_two_batches_is_created_once_then_updated(tmp_path, sqlite_url):
    """Within the one transaction a later batch does not read the earlier one's rows: it still says ``updated``."""
    items = fleet(3)
    again = {**items[0], "metadata": {**items[0]["metadata"], "plan": "c3"}}
    done = imds("import", str(write_jsonl(tmp_path / "twice.jsonl", [*items, again])), "--db", sqlite_url,
                "--batch-size", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("3 created, 1 updated, 0 unchanged")


def _peak_mib(report: Path) -> float:
    return int(report.read_text().split()[-1]) / 1024


@pytest.mark.parametrize("shape", ["line", "file"])
def test_an_item_over_the_row_cap_is_rejected_unread_in_bounded_memory(tmp_path, sqlite_url, shape):
    """A 200 MiB item (cap: 16 x 64 KiB) is rejected by its size; the others are written; memory stays flat."""
    items = fleet(50)
    huge = {**items[10], "userdata": "x" * (200 * 1024 * 1024)}
    if shape == "line":
        small = write_jsonl(tmp_path / "small.jsonl", items[:10] + items[11:])
        big = write_jsonl(tmp_path / "big.jsonl", [*items[:10], huge, *items[11:]])
    else:
        small, big = tmp_path / "small", tmp_path / "big"
        for folder in (small, big):
            folder.mkdir()
            for n, item in enumerate(items):
                if n != 10:
                    (folder / f"{n:03d}.json").write_text(json.dumps(item))
        (big / "010.json").write_text(json.dumps(huge))
    del huge
    limits = ["--max-body-bytes", str(64 * 1024)]
    without = imds("import", str(small), "--db", sqlite_url, *limits, measure=tmp_path / "small.rss")
    assert without.returncode == 0, without.stderr
    other = tmp_path / "other.db"
    sql(f"sqlite:///{other}", "SELECT 1")
    done = imds("import", str(big), "--db", f"sqlite:///{other}", *limits, measure=tmp_path / "big.rss")
    assert done.returncode == 1
    assert done.stdout.startswith("49 created, 0 updated, 0 unchanged, 0 stale, 1 rejected")
    label = "line 11" if shape == "line" else "010.json"
    assert f"rejected {label}: item: is longer than {16 * 64 * 1024} bytes" in done.stdout
    grown = _peak_mib(tmp_path / "big.rss") - _peak_mib(tmp_path / "small.rss")
    assert grown < 40, f"peak RSS grew by {grown:.0f} MiB for an item refused unread"


def test_a_json_array_element_over_the_row_cap_stops_the_import_before_writing(tmp_path, sqlite_url):
    """An array cannot skip an element it does not parse: the import stops, naming it, with nothing written."""
    items = fleet(5)
    items[2] = {**items[2], "userdata": "x" * (3 * 1024 * 1024)}
    source = tmp_path / "fleet.json"
    source.write_text(json.dumps(items))
    done = imds("import", str(source), "--db", sqlite_url, "--max-body-bytes", str(64 * 1024))
    assert done.returncode != 0
    assert "item 3 is longer than" in done.stderr
    assert "nothing was written" in done.stderr
    assert sql(sqlite_url, "SELECT count(*) FROM instances") == 0


@pytest.mark.postgres
def test_hollow_rows_over_the_caps_are_rejected_by_their_size_unread(tmp_path, hollow_db):
    """Hollow rows with 64 MiB of userdata or 40 MiB of metadata are refused by the sizes the database measures.

    The values never reach imds: its peak RSS stays near the same import's without them.
    """
    url = hollow_db(30)
    plain = imds("import", "--from-hollow", url, "--db", f"sqlite:///{tmp_path / 'plain.db'}",
                 "--max-body-bytes", str(64 * 1024), measure=tmp_path / "plain.rss")
    assert plain.returncode == 0, plain.stderr
    userdata_id = sql(url, "SELECT id::text FROM instance_userdata ORDER BY id LIMIT 1")
    metadata_id = sql(url, "SELECT id::text FROM instance_metadata ORDER BY id DESC LIMIT 1")
    sql(url, "UPDATE instance_userdata SET userdata = decode(repeat('00', 64 * 1024 * 1024), 'hex') "  # noqa: S608 - the test's own ids
             f"WHERE id = '{userdata_id}'")
    sql(url, "UPDATE instance_metadata SET metadata = json_build_object('pad', repeat('x', 40 * 1024 * 1024)) "  # noqa: S608
             f"WHERE id = '{metadata_id}'")
    done = imds("import", "--from-hollow", url, "--db", f"sqlite:///{tmp_path / 'big.db'}",
                "--max-body-bytes", str(64 * 1024), measure=tmp_path / "big.rss")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert any(f"({userdata_id}): userdata: is {64 * 1024 * 1024} bytes; at most 65536" in line for line in lines)
    assert any(f"({metadata_id}): metadata: is " in line and "at most 1048576 are read" in line for line in lines)
    grown = _peak_mib(tmp_path / "big.rss") - _peak_mib(tmp_path / "plain.rss")
    assert grown < 40, f"peak RSS grew by {grown:.0f} MiB for rows refused unread"


SPY = """
import json, sys, threading
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if threading.current_thread() is not threading.main_thread():
            seen.append([threading.current_thread().name, name])
        return None
sys.meta_path.insert(0, Spy())
from imds.cli import cli
try:
    cli(sys.argv[1:])
except SystemExit:
    pass
finally:
    print("SPY " + json.dumps(seen))
"""


def test_the_hollow_reader_thread_imports_no_sqlalchemy(tmp_path):
    """The hollow reader thread never imports SQLAlchemy (or imds): what it may need is imported before it starts.

    Two threads importing SQLAlchemy at once raised ImportError once in a few runs. The
    reader's failure path, which explains the error with the database diagnostics, is taken here.
    """
    dsn = "postgresql://nobody@127.0.0.1:9/hollow"  # port 9: nothing listens, so the reader explains a failure
    with tempfile.TemporaryDirectory(prefix="imds-spy-") as home:
        done = subprocess.run([sys.executable, "-c", SPY, "import", "--from-hollow", dsn,
                               "--db", f"sqlite:///{tmp_path / 'x.db'}"],
                              env=clean_env(Path(home)), capture_output=True, text=True, timeout=120, check=False)
    line = next(line for line in done.stdout.splitlines() if line.startswith("SPY "))
    imported = [name for thread, name in json.loads(line[4:]) if thread == "imds-hollow-reader"]
    assert "hollow database" in done.stderr, done.stderr  # the reader's failure was explained
    assert [name for name in imported if name.split(".")[0] in {"sqlalchemy", "imds", "alembic", "asyncpg"}] == []
