"""Memory and start-up time of ``imds serve`` holding N instances on SQLite (100k, 1M).

Run on demand (never in CI)::

    .venv/bin/python bench/scale.py --count 100000
    .venv/bin/python bench/scale.py --count 1000000 --keep /var/tmp/imds-1m   # reuse the database next time

Each instance has the Equinix-sized reference document (``tests/fixtures/metadata-example.json``
with its id, hostname and addresses made unique) and two addresses: a loopback IPv4
host (127.x.y.z, so this machine can read as that instance) and an IPv6 host. The
database is filled through the store's batch primitives (``fill``: the statements
``imds import`` runs, not the HTTP API). Then
``imds serve`` is started and timed from process start to ``/readyz`` 200; its VmRSS is
read once loaded, and again after a read sample (``--reads`` distinct instances each read
``/metadata`` from their own source address). Appends a JSON line to ``bench/results.jsonl`` and a Markdown row to
``bench/results.md``. Targets (issue 12): 1M instances ≤ 2 GiB RSS, start-up ≤ 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import ipaddress
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import free_port, stop

from imds.models import Network
from imds.store import open_store

BENCH = Path(__file__).parent
IMDS = Path(sys.executable).parent / "imds"
FIXTURE = BENCH.parent / "tests" / "fixtures" / "metadata-example.json"  # the reference document, kept with the tests
RESULTS = BENCH / "results.md"
TIMEOUT = 900.0


def loopback(n: int) -> str:
    """The n-th instance's IPv4 address: 127.x.y.z, skipping 127.0.0.0/16 (the server listens there)."""
    n += 1 << 16
    return f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def record(n: int, template: dict[str, Any]) -> tuple[str, tuple[Network, ...], dict[str, Any]]:
    """The n-th generated instance (up to ~16 million): id, addresses, document."""
    instance_id = str(uuid.UUID(int=n + 1, version=4))
    v4, v6 = loopback(n), f"2001:db8::{(n + 1) >> 16:x}:{(n + 1) & 0xFFFF:x}"
    document = {**template, "id": instance_id, "hostname": f"node-{n}.example"}
    document["network"] = {**template["network"], "addresses": [
        {"address": v4, "address_family": 4, "cidr": 32, "public": False, "management": True},
        {"address": v6, "address_family": 6, "cidr": 128, "public": True, "management": True},
    ]}
    return instance_id, (ipaddress.IPv4Network(v4), ipaddress.IPv6Network(v6)), document


async def fill(url: str, count: int, batch: int) -> None:
    """Write ``count`` instances through the store's batch primitives, one transaction per ``batch``.

    The fast path for a benchmark fleet: the statements ``imds import`` runs, without its
    per-item comparison and validation (the documents are generated, known valid).
    """
    template = json.loads(FIXTURE.read_text())
    store = open_store(url, statement_timeout=600.0)
    try:
        for start in range(0, count, batch):
            rows = [record(n, template) for n in range(start, min(start + batch, count))]
            async with store.write() as tx:
                await tx.put_records([(instance_id, document) for instance_id, _, document in rows], [])
                await tx.replace_addresses_many([(instance_id, addresses) for instance_id, addresses, _ in rows])
                await tx.mark_changed(instance_id for instance_id, _, _ in rows)
            if (start // batch) % 20 == 0:
                print(f"generated {start + len(rows):,} / {count:,}", file=sys.stderr, flush=True)
    finally:
        await store.close()


def generate(data_dir: Path, count: int) -> float:
    """Fill a fresh SQLite data dir with ``count`` instances (``fill``); seconds."""
    subprocess.run([str(IMDS), "db", "upgrade", "--data-dir", str(data_dir)], check=True, capture_output=True)
    started = time.monotonic()
    asyncio.run(fill(f"sqlite:///{data_dir / 'imds.db'}", count, 10_000))
    return time.monotonic() - started


def rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` and its children (server workers), MiB."""
    total = 0
    for proc in [pid, *children(pid)]:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{proc}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def children(pid: int) -> list[int]:
    """Every descendant process of ``pid``."""
    found = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            found += [int(child) for child in text]
    return found + [grandchild for child in found for grandchild in children(child)]


def get(port: int, path: str, source: str = "127.0.0.1") -> tuple[int, bytes]:
    """One GET from ``source`` (a loopback address): (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def built_ahead(port: int, timeout: float = 600.0) -> tuple[int, float]:
    """Wait until ``imds serve`` (with ``--metrics-public``) has built every instance ahead: (how many, seconds).

    The storms start after it, so what the server does meanwhile does not run beside nginx's storm.
    """
    started = time.monotonic()
    while True:
        status, text = get(port, "/metrics")
        values = {line.split()[0]: float(line.split()[1]) for line in text.decode().splitlines()
                  if line.startswith("imds_render_ahead_")}
        if status == 200 and values.get("imds_render_ahead_pending") == 0:
            return int(values.get("imds_render_ahead_built", 0)), time.monotonic() - started
        if time.monotonic() - started > timeout:
            sys.exit(f"imds did not finish building ahead in {timeout} s: {values}")
        time.sleep(0.5)


@contextlib.contextmanager
def serve(data_dir: Path, port: int, log: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``imds serve`` on ``data_dir`` (with ``extra`` flags), stopped by PID on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(IMDS), "serve", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}", *extra],
            stdout=out, stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            stop(proc)


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Poll ``/readyz`` until it answers 200; exit with the server's log if it dies or takes over ``TIMEOUT``."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        if proc.poll() is not None:
            sys.exit(f"imds serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        # HTTPException too: before the server binds, a connect from an ephemeral port that happens to be
        # ``port`` is a TCP self-connect, and the "answer" is the request itself (BadStatusLine: "GET /readyz...").
        with contextlib.suppress(OSError, http.client.HTTPException):
            if get(port, "/readyz")[0] == 200:
                return
        if time.monotonic() > deadline:
            sys.exit("not ready in time")
        time.sleep(0.2)


def measure(data_dir: Path, count: int, reads: int) -> dict[str, Any]:
    """Start ``imds serve`` on ``data_dir``: start-up seconds, RSS loaded and after a read sample."""
    port = free_port()
    log = data_dir.parent / "serve.log"
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    started = time.monotonic()
    with serve(data_dir, port, log, "--log-level", "info") as proc:
        wait_ready(proc, port, log)
        ready = time.monotonic() - started
        loaded = rss_mib(proc.pid)
        step = max(count // reads, 1)
        latencies, errors = [], 0
        for n in range(0, count, step)[:reads]:
            begin = time.perf_counter()
            status, body = get(port, "/metadata", loopback(n))
            latencies.append(time.perf_counter() - begin)
            errors += status != 200 or json.loads(body)["hostname"] != f"node-{n}.example"
        latencies.sort()
        return {
            "bench": "scale", "instances": count, "startup_s": round(ready, 1), "rss_loaded_mib": round(loaded),
            "reads": len(latencies), "read_errors": errors,
            "read_p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
            "read_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
            "rss_after_reads_mib": round(rss_mib(proc.pid)),
            "at": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "load_before": load_before,
        }


SECTION = "## scale (`bench/scale.py`)"
HEADER = (f"\n{SECTION}\n\n"
          "| at | instances | fill s | start-up s (→ /readyz 200) | start-up ÷ 60 s | RSS loaded MiB "
          "| RSS ÷ 2 GiB | RSS after reads MiB | reads | errors | read p50 / p99 ms | load avg |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
STARTUP_TARGET_S, RSS_TARGET_MIB = 60.0, 2048.0


def append(result: dict[str, Any], generate_s: float | None) -> None:
    """Print the JSON line and append it to results.jsonl; add the Markdown row (and the line) to results.md."""
    result = {**result, "fill_s": None if generate_s is None else round(generate_s, 1)}
    line = json.dumps(result)
    print(line)
    with RESULTS.with_suffix(".jsonl").open("a") as jsonl:
        jsonl.write(line + "\n")
    fill = "reused" if result["fill_s"] is None else result["fill_s"]
    row = (f"| {result['at']} | {result['instances']:,} | {fill} | {result['startup_s']} "
           f"| **{result['startup_s'] / STARTUP_TARGET_S:.2f}** | {result['rss_loaded_mib']} "
           f"| **{result['rss_loaded_mib'] / RSS_TARGET_MIB:.2f}** | {result['rss_after_reads_mib']} "
           f"| {result['reads']} | {result['read_errors']} | {result['read_p50_ms']} / {result['read_p99_ms']} "
           f"| {result['load_before']} |")
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if SECTION not in text:
        text = text.rstrip("\n") + "\n" + HEADER
    start = text.index(SECTION)
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    section = text[start:end].rstrip("\n")
    table_end = section.find("\n\n", section.index("|---"))
    table_end = len(section) if table_end < 0 else table_end
    section = section[:table_end] + "\n" + row + section[table_end:] + f"\n<!-- {line} -->\n"
    RESULTS.write_text(text[:start] + section + ("\n" + text[end:] if end < len(text) else ""))


def main() -> None:
    """Generate (or reuse) the database, then measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--keep", type=Path, help="keep the database here (reused when it exists)")
    options = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="imds-bench-scale-"))
    try:
        root = options.keep or scratch
        data_dir = root / "data"
        generate_s = None
        if not data_dir.exists():
            root.mkdir(parents=True, exist_ok=True)
            generate_s = generate(data_dir, options.count)
        append(measure(data_dir, options.count, options.reads), generate_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
