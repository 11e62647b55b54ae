"""What a held change-watch request costs: server memory per waiting ``wait_for_change`` read.

Starts ``imds serve`` (in-memory store, one process) on a loopback port, gives one
instance the addresses 127.0.1.0/24, and opens N connections (10,000 by default) from
those source addresses in batches. It reads the server's VmRSS from
``/proc/<pid>/status`` three times: before, with N idle connections open, and with a
``GET /metadata?wait_for_change=true`` held on each (``imds_watch_waiting`` = N). Then
one admin write wakes them all and it times how long until every one has its answer.
Results go to ``bench/change_watch.md``.

Run on demand (never in CI)::

    .venv/bin/python bench/change_watch.py --requests 10000

RLIMIT_NOFILE is raised to its hard limit here (the server inherits it). Every process it
starts is stopped by its PID; only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from instance_read import free_port, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]
IMDS = Path(sys.executable).with_name("imds")
TOKEN = "bench-token"  # noqa: S105 - a throwaway token for a loopback-only server
SOURCES = [f"127.0.1.{n}" for n in range(1, 255)]
BATCH = 500


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def gauge(base: str, name: str) -> float:
    """One unlabelled metric from /metrics (which asks for the admin token)."""
    request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})  # noqa: S310 - loopback URL built here
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback URL built here
        text = answer.read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} "))


def admin_post(base: str, body: dict[str, object]) -> None:
    """POST /device-metadata with the bench token; it must answer 200."""
    request = urllib.request.Request(  # noqa: S310 - loopback URL built here
        f"{base}/device-metadata", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback URL built here
        assert answer.status == 200  # noqa: S101 - a benchmark's sanity check


def settle(pid: int) -> int:
    """RSS once it stops moving (bounded): the server finished allocating for what it was given."""
    last, stable = rss_bytes(pid), 0
    for _ in range(50):
        time.sleep(0.2)
        now = rss_bytes(pid)
        stable = stable + 1 if abs(now - last) < 64 * 1024 else 0
        last = now
        if stable >= 3:  # three quiet readings in a row
            break
    return last


async def wait_until(check: Callable[[], bool], what: str, limit: float = 120.0) -> None:
    """Poll ``check`` until it holds, for at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {limit}s: {what}")
        await asyncio.sleep(0.2)


async def measure(base: str, port: int, pid: int, count: int, etag: str) -> dict[str, float]:
    """RSS before, with ``count`` idle connections, with a held request on each; then wake them all."""
    before = settle(pid)
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for start in range(0, count, BATCH):
        opened = await asyncio.gather(*(
            asyncio.open_connection("127.0.0.1", port, local_addr=(SOURCES[n % len(SOURCES)], 0))
            for n in range(start, min(count, start + BATCH))
        ))
        connections.extend(opened)
    idle = settle(pid)
    request = (
        f"GET /metadata?wait_for_change=true&last_etag={etag}&timeout_sec=600 HTTP/1.1\r\n"
        "Host: imds\r\n\r\n"
    ).encode()
    for start in range(0, count, BATCH):
        for _reader, writer in connections[start : start + BATCH]:
            writer.write(request)
        await asyncio.gather(*(w.drain() for _r, w in connections[start : start + BATCH]))
        await wait_until(lambda n=start: gauge(base, "imds_watch_waiting") >= min(count, n + BATCH), "held")
    held = settle(pid)
    woken_at = time.monotonic()
    admin_post(base, {"id": INSTANCE, "ipAddresses": ["127.0.1.0/24"], "metadata": {"hostname": "after"}})
    answers = await asyncio.gather(*(reader.readuntil(b"\r\n\r\n") for reader, _w in connections))
    woken = time.monotonic() - woken_at
    ok = sum(a.startswith(b"HTTP/1.1 200") for a in answers)
    for _reader, writer in connections:
        writer.close()
    return {
        "before": before, "idle": idle, "held": held, "woken_s": woken, "ok": ok,
        "per_connection": (idle - before) / count, "per_request": (held - idle) / count,
        "per_held": (held - before) / count,
    }


INSTANCE = str(uuid.uuid4())


def main() -> int:
    """Run the measurement and write ``bench/change_watch.md``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000, help="held requests to open")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.requests + 100:
        sys.exit(f"RLIMIT_NOFILE hard limit {hard} is below {args.requests + 100}")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="imds-bench-") as home:
        env = {"HOME": home, "PATH": "/usr/bin:/bin", "IMDS_ADMIN_TOKEN": TOKEN}
        server = subprocess.Popen(
            [str(IMDS), "serve", "--listen", f"127.0.0.1:{port}", "--db", "memory://", "--log-level", "warning",
             "--watch-max-timeout", "600",
             # ~40 connections per source address here: above the default per-source budget (32).
             "--max-connections-per-source", "0"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(f"{base}/healthz")
            admin_post(base, {"id": INSTANCE, "ipAddresses": ["127.0.1.0/24"], "metadata": {"hostname": "before"}})
        except Exception:
            stop(server)
            raise
        try:
            found = asyncio.run(run(base, port, server.pid, args.requests))
        finally:
            stop(server)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    write_results(args.requests, found)
    return 0


async def run(base: str, port: int, pid: int, count: int) -> dict[str, float]:
    """Read the current ETag as the instance, then measure."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(SOURCES[0], 0))
    writer.write(b"GET /metadata HTTP/1.1\r\nHost: imds\r\n\r\n")
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    writer.close()
    etag = next(line.split(":", 1)[1].strip() for line in head.splitlines() if line.lower().startswith("etag:"))
    return await measure(base, port, pid, count, etag.strip('"'))


def write_results(count: int, found: dict[str, float]) -> None:
    """Print the table and write it to ``bench/change_watch.md``."""
    kib = 1024
    lines = [
        "# Change watch: what a held `wait_for_change` request costs",
        "",
        (f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, Python {platform.python_version()}. "
         f"Command: `.venv/bin/python bench/change_watch.py --requests {count}`."),
        "",
        ("One `imds serve` process (uvicorn, in-memory store); the requests come from 127.0.1.1-254 (the "
         "instance's addresses) over loopback; VmRSS of the server from `/proc/<pid>/status`."),
        "",
        "| measure | value |",
        "|---|---|",
        f"| server RSS before | {found['before'] / kib / kib:.1f} MiB |",
        f"| with {count} idle connections | {found['idle'] / kib / kib:.1f} MiB |",
        f"| with {count} held requests | {found['held'] / kib / kib:.1f} MiB |",
        f"| **per held request (connection included)** | **{found['per_held'] / kib:.1f} KiB** |",
        f"| of which the open connection | {found['per_connection'] / kib:.1f} KiB |",
        f"| of which the request being held | {found['per_request'] / kib:.1f} KiB |",
        (f"| one write woke all {count}; all answered within | {found['woken_s']:.2f} s "
        f"({int(found['ok'])} answered 200) |"),
        "",
    ]
    out = ROOT / "bench" / "change_watch.md"
    out.write_text("\n".join(lines))
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
