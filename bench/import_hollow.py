"""How fast ``imds import`` loads a fleet, and its peak memory: from a file and from a hollow database.

Run on demand (never in CI)::

    .venv/bin/python bench/import_hollow.py                        # 20,000 and 100,000 instances
    .venv/bin/python bench/import_hollow.py --counts 2000 --targets sqlite   # a smoke run

For each count it generates the fleet of ``tests/hollow_data.py`` (hollow's own schema on a
PostgreSQL server started the way ``tests/postgres_server.py`` does, filled with COPY; and
the same instances as a JSON-lines file in the import wire format), then runs ``imds import``
from each source into each target, always a new database (a fresh SQLite data directory, or a
new PostgreSQL database on the same server, migrated by the import itself), and once more from
the hollow database (every instance unchanged). Per run: wall seconds, instances/s (every
instance read, the refused ones included), and the peak RSS of the ``imds`` process (its own
``%M`` from ``/usr/bin/time``). Prints one JSON line per run and, with ``--markdown FILE``,
appends a table to FILE (``bench/results.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hollow_data import HollowInstance, create_hollow, instance  # noqa: E402 - the tests' helpers, via sys.path
from postgres_server import PostgresServer, _execute, _Server, in_thread  # noqa: E402

IMDS = Path(sys.executable).parent / "imds"
TIME = "/usr/bin/time"  # GNU time: the peak RSS of the process it runs (%M, KiB)


def wire(generated: HollowInstance) -> dict[str, Any]:
    """The instance in the import wire format (what ``imds export`` writes)."""
    obj: dict[str, Any] = {"id": generated.id, "ipAddresses": list(generated.addresses)}
    if generated.metadata is not None:
        obj["metadata"] = generated.metadata
    if generated.has_userdata:
        obj["userdata"] = base64.b64encode(generated.userdata or b"").decode()
        obj["userdata_encoding"] = "base64"
    return obj


def fill_hollow(server: PostgresServer, count: int) -> str:
    """A new hollow database holding ``count`` generated instances; its URL."""
    import asyncpg  # noqa: PLC0415 - a dependency of imds (PostgreSQL stores)

    name = f"hollow_{count}"
    _execute(server, f'CREATE DATABASE "{name}"')

    async def fill() -> None:
        conn = await asyncpg.connect(server.url(name))
        try:
            await create_hollow(conn, count)
        finally:
            await conn.close()

    in_thread(lambda: asyncio.run(fill()))
    return server.url(name)


def measure(args: list[str], env: dict[str, str], scratch: Path) -> dict[str, Any]:
    """Run ``imds ARGS``: wall seconds, peak RSS (MiB) of that process alone, and its summary line.

    The peak comes from ``/usr/bin/time`` (a small process forking imds): a child forked from
    this script would start its ``ru_maxrss`` at this script's own size, the fleet included.
    """
    report = scratch / "time.txt"
    started = time.monotonic()
    done = subprocess.run([TIME, "-f", "%M", "-o", str(report), str(IMDS), *args, "--log-level", "warning"],
                          env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    summary = done.stdout.splitlines()[0] if done.stdout else ""
    if done.returncode not in {0, 1} or " created, " not in summary:
        sys.exit(f"imds {' '.join(args)} failed ({done.returncode}):\n{done.stdout[:2000]}\n{done.stderr[-2000:]}")
    peak_kib = int(report.read_text().split()[-1])
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(peak_kib / 1024), "summary": summary}


def run(options: argparse.Namespace, server: PostgresServer, scratch: Path) -> list[dict[str, Any]]:
    """Every (count, source, target) run; one dict each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMDS_")}
    rows: list[dict[str, Any]] = []
    for count in options.counts:
        hollow = fill_hollow(server, count)
        source = scratch / f"fleet-{count}.jsonl"
        with source.open("w") as out:
            for n in range(count):
                out.write(json.dumps(wire(instance(n)), separators=(",", ":")) + "\n")
        for target in options.targets:
            for label, args in (("file", [str(source)]), ("hollow", ["--from-hollow", hollow]),
                                ("hollow, re-run", ["--from-hollow", hollow])):
                if label != "hollow, re-run":
                    db = f"sqlite:///{scratch / uuid.uuid4().hex}.db"
                    if target == "postgres":
                        name = f"imds_{uuid.uuid4().hex[:12]}"
                        _execute(server, f'CREATE DATABASE "{name}"')
                        db = server.url(name)
                figures = measure(["import", *args, "--db", db, "--batch-size", str(options.batch_size)], env, scratch)
                row = {"count": count, "source": label, "target": target, **figures,
                       "instances_per_s": round(count / figures["seconds"])}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], command: str, load: tuple[str, str]) -> str:
    """The results as a section of ``bench/results.md``."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## import from a file and from hollow: {when}", "",
        (f"{os.cpu_count()} cores, Python {platform.python_version()}, load average {load[0]} before / {load[1]} "
         f"after (a shared machine). Command: `{command}`. Each run a new database, migrated by `imds import`; "
         "instances/s counts every instance read (the refused ones too); peak RSS is the `imds` process's own "
         "(GNU time's `%M`)."), "",
        "| instances | source | target | seconds | instances/s | peak RSS MiB | imds's summary |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['count']:,} | {r['source']} | {r['target']} | {r['seconds']} | {r['instances_per_s']} | "
              f"{r['peak_rss_mib']} | {r['summary']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse the options, start PostgreSQL, run everything, print (and append) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--targets", nargs="+", choices=["sqlite", "postgres"], default=["sqlite", "postgres"])
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--markdown", type=Path, default=None, help="append a table to this file")
    options = parser.parse_args()
    before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    server = _Server()
    try:
        with tempfile.TemporaryDirectory(prefix="imds-bench-hollow-") as scratch:
            rows = run(options, server.start(), Path(scratch))
    finally:
        server.stop()
    after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if options.markdown is not None:
        command = "python bench/import_hollow.py " + " ".join(sys.argv[1:])
        with options.markdown.open("a") as out:
            out.write("\n" + markdown(rows, command, (before, after)))


if __name__ == "__main__":
    main()
