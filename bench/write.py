"""Benchmark the admin write path and cross-replica visibility (run on demand, never in CI).

For SQLite and PostgreSQL (started the way ``tests/postgres_server.py`` does) it starts two
``imds serve`` processes on one database, then measures:

* upserts/s through replica A with 1 and 16 concurrent writers (``POST /device-metadata``,
  a new instance with 2 addresses each);
* the time from A's 200 to the new value served by replica B (``GET /metadata`` from the
  instance's own loopback address), p50/p99 over ``--samples`` writes.

Appends one JSON line per figure and a Markdown table to ``bench/results.md``::

    .venv/bin/python bench/write.py --writes 2000 --samples 200

Only 127.x addresses are used; every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from postgres_server import _execute, _Server  # noqa: E402 - the tests' helpers, found through sys.path
from serve_process import ADMIN_TOKEN, serving  # noqa: E402

HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def address(n: int) -> str:
    """The n-th instance address (10.100.0.0 upwards)."""
    return f"10.{100 + n // 65536 % 100}.{n // 256 % 256}.{n % 256}"


async def upserts(url: str, writers: int, total: int, offset: int) -> float:
    """Upserts/s with ``writers`` concurrent clients writing ``total`` new instances."""
    numbers = iter(range(offset, offset + total))

    async def writer() -> None:
        async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60.0, trust_env=False) as client:
            for n in numbers:
                instance_id = str(uuid.uuid4())
                body = {"id": instance_id, "ipAddresses": [address(2 * n), address(2 * n + 1)],
                        "metadata": {"id": instance_id, "hostname": f"host-{n}", "tags": ["bench"] * 8}}
                answer = await client.post("/device-metadata", json=body)
                answer.raise_for_status()

    started = time.monotonic()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return total / (time.monotonic() - started)


def visibility(a: str, b: str, samples: int) -> list[float]:
    """Milliseconds from A's 200 to B serving the new value, per sample."""
    guest = "127.0.95.3"
    instance_id = str(uuid.uuid4())
    reader = httpx.Client(transport=httpx.HTTPTransport(local_address=guest), timeout=5.0, trust_env=False)
    times = []
    with httpx.Client(headers=HEADERS, timeout=10.0, trust_env=False) as admin, reader:
        for n in range(samples):
            body = {"id": instance_id, "ipAddresses": [guest], "metadata": {"id": instance_id, "write": n}}
            admin.post(f"{a}/device-metadata", json=body).raise_for_status()
            acked = time.monotonic()
            while True:
                answer = reader.get(f"{b}/metadata")
                if answer.status_code == 200 and answer.json().get("write") == n:
                    break
                if time.monotonic() - acked > 30:
                    raise SystemExit(f"replica B never served write {n}")
            times.append((time.monotonic() - acked) * 1000)
    return times


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(backend: str, db: str, tmp: Path, args: argparse.Namespace) -> list[dict[str, object]]:
    """Both measures on one database shared by two replicas."""
    poll = "1" if backend == "sqlite" else "30"
    figures: list[dict[str, object]] = []
    with serving(tmp, "--db", db, "--feed-poll-interval", poll) as a, \
            serving(tmp, "--db", db, "--feed-poll-interval", poll) as b:
        for offset, writers in enumerate((1, 16)):
            rate = asyncio.run(upserts(a.url, writers, args.writes, offset * args.writes))
            figures.append({"backend": backend, "measure": "upserts_per_s", "writers": writers, "value": round(rate)})
        times = visibility(a.url, b.url, args.samples)
        figures.extend({"backend": backend, "measure": f"visible_on_b_p{int(q * 100)}_ms",
                        "value": round(percentile(times, q), 1)} for q in (0.5, 0.99))
    return figures


def main() -> None:
    """Run every backend and record the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=2000, help="upserts per writer setting")
    parser.add_argument("--samples", type=int, default=200, help="writes timed to the second replica")
    args = parser.parse_args()
    figures: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="imds-bench-write-") as scratch:
        tmp = Path(scratch)
        figures += run("sqlite", f"sqlite:///{tmp / 'bench.db'}", tmp, args)
        server = _Server()
        try:
            pg = server.start()
            _execute(pg, 'CREATE DATABASE "bench"')
            figures += run("postgres", pg.url("bench"), tmp, args)
        finally:
            server.stop()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = f".venv/bin/python bench/write.py --writes {args.writes} --samples {args.samples}"
    lines = [f"\n## Write benchmark, {stamp}\n",
             f"Command: `{command}` (2 replicas on one database; visibility on replica B).\n",
             "| backend | measure | writers | value |", "|---|---|---|---|"]
    for f in figures:
        lines.append(f"| {f['backend']} | {f['measure']} | {f.get('writers', '')} | {f['value']} |")
        print(json.dumps({"stamp": stamp, **f}))
    lines += ["", "```json", *(json.dumps({"stamp": stamp, **f}) for f in figures), "```", ""]
    with (ROOT / "bench" / "results.md").open("a") as out:
        out.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
