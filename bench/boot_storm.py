"""Boot storm: N instances crawl the EC2 tree at once, as cloud-init's EC2 datasource does (IMDSv2).

Run on demand (never in CI)::

    .venv/bin/python bench/boot_storm.py --record          # once: record the real client's requests
    .venv/bin/python bench/boot_storm.py --count 1000
    .venv/bin/python bench/boot_storm.py --count 10000 --concurrency 256

``--record`` runs Debian's cloud-init (``DataSourceEc2._get_data`` under /usr/bin/python3,
cloud "aws", never a boot stage, every connection forced to 127.0.0.1 from a loopback
source) against a fresh ``imds serve`` and saves each request it made (method, path,
whether it sent the token / the TTL header, the status it got) to
``bench/cloud_init_ec2_sequence.json``. A storm fills SQLite with N instances through
``imds import`` (``bench/scale.py``'s generator: instance n at 127.x.y.z), starts
``imds serve`` and replays that sequence once per instance from its own source address,
a new connection per request like cloud-init, at most ``--concurrency`` crawls at a time.
Reports total seconds, p50/p99/max per request and per crawl, and errors (a status other
than the recorded one, or a failed connection); appends a JSON line and a Markdown row to
``bench/results.md``. Target (issue 12): 10k crawls, 0 errors, no request over 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import free_port
from scale import RESULTS, generate, loopback, rss_mib, serve, wait_ready

BENCH = Path(__file__).parent
SEQUENCE = BENCH / "cloud_init_ec2_sequence.json"
SYSTEM_PYTHON = "/usr/bin/python3"
TOKEN = "X-aws-ec2-metadata-token"  # noqa: S105 - a header name, not a secret
TTL = "X-aws-ec2-metadata-token-ttl-seconds"
RECORDER = r"""
import json, sys, tempfile
cfg = json.loads(sys.argv[1])
import urllib3.util.connection as _connection
_create = _connection.create_connection
def _from_guest(address, *args, **kwargs):
    if address[0] != "127.0.0.1":
        raise OSError(f"bench guard: refusing to connect to {address[0]}")
    kwargs["source_address"] = (cfg["source"], 0)
    return _create(address, *args, **kwargs)
_connection.create_connection = _from_guest
import requests
seen = []
_request = requests.Session.request
def _recording(self, method, url, *args, **kwargs):
    headers = {k.lower(): v for k, v in (kwargs.get("headers") or {}).items()}
    reply = _request(self, method, url, *args, **kwargs)
    seen.append({"method": method.upper(), "path": url.split("127.0.0.1", 1)[1].split("/", 1)[1],
                 "token": cfg["token"].lower() in headers, "ttl": headers.get(cfg["ttl"].lower()),
                 "status": reply.status_code})
    return reply
requests.Session.request = _recording
from cloudinit import distros, helpers, util
from cloudinit.sources import DataSourceEc2
util._DNS_REDIRECT_IP = set()
tmp = tempfile.mkdtemp()
paths = helpers.Paths({"cloud_dir": tmp + "/cloud", "run_dir": tmp + "/run", "docs_dir": tmp + "/docs",
                       "templates_dir": tmp + "/templates"})
distro = distros.fetch("debian")("debian", {}, paths)
ds = DataSourceEc2.DataSourceEc2({"datasource": {"Ec2": {"metadata_urls": [cfg["url"]], "timeout": 2,
                                                         "max_wait": 5}}}, distro, paths)
ds._get_cloud_name = lambda: "aws"
ok = ds._get_data()
print(json.dumps({"ok": ok, "requests": seen}))
"""


def record() -> None:
    """Run cloud-init's EC2 datasource once against a fresh server and save its requests."""
    scratch = Path(tempfile.mkdtemp(prefix="imds-bench-record-"))
    try:
        data_dir = scratch / "data"
        generate(data_dir, 1)
        port = free_port()
        with serving(data_dir, port, scratch / "serve.log"):
            done = subprocess.run(
                [SYSTEM_PYTHON, "-c", RECORDER, json.dumps({"url": f"http://127.0.0.1:{port}", "source": loopback(0),
                                                            "token": TOKEN, "ttl": TTL})],
                capture_output=True, text=True, timeout=120, check=False, env={"PATH": "/usr/bin:/bin"},
            )
        if done.returncode != 0:
            sys.exit(done.stderr)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        if not got["ok"]:
            sys.exit(f"cloud-init found no datasource: {got}")
        SEQUENCE.write_text(json.dumps(got["requests"], indent=1) + "\n")
        print(f"recorded {len(got['requests'])} requests to {SEQUENCE}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def serving(data_dir: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``imds serve`` on ``data_dir`` (IMDSv2 optional), yielded once ``/readyz`` is 200; stopped by PID."""
    with serve(data_dir, port, log, "--imdsv2", "optional", "--log-level", "warning") as proc:
        wait_ready(proc, port, log)
        yield proc


async def request(port: int, source: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """One HTTP/1.1 request on a new connection from ``source`` (as cloud-init's requests does)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        lines = [f"{method} /{path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", "Content-Length: 0",
                 *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def crawl(port: int, n: int, sequence: list[dict[str, Any]], latencies: list[float]) -> tuple[float, int]:
    """Replay the sequence as instance ``n``: (seconds, errors)."""
    source, token, errors = loopback(n), "", 0
    started = time.perf_counter()
    for step in sequence:
        headers = {}
        if step["ttl"]:
            headers[TTL] = step["ttl"]
        if step["token"]:
            headers[TOKEN] = token
        begin = time.perf_counter()
        try:
            status, body = await request(port, source, step["method"], step["path"], headers)
        except OSError:
            status, body = 0, b""
        latencies.append(time.perf_counter() - begin)
        if step["method"] == "PUT" and status == 200:
            token = body.decode()
        errors += status != step["status"]
    return time.perf_counter() - started, errors


async def storm(port: int, count: int, concurrency: int, sequence: list[dict[str, Any]]) -> dict[str, Any]:
    """Run ``count`` crawls, at most ``concurrency`` at once; the figures."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(n: int) -> tuple[float, int]:
        async with gate:
            return await crawl(port, n, sequence, latencies)

    started = time.perf_counter()
    results = await asyncio.gather(*(one(n) for n in range(count)))
    total = time.perf_counter() - started
    crawls = sorted(seconds for seconds, _ in results)
    latencies.sort()

    def pct(values: list[float], q: float) -> float:
        return round(values[min(int(len(values) * q), len(values) - 1)] * 1000, 1)

    return {
        "bench": "boot-storm", "crawls": count, "concurrency": concurrency, "requests_per_crawl": len(sequence),
        "total_s": round(total, 1), "requests": len(latencies), "errors": sum(e for _, e in results),
        "request_p50_ms": pct(latencies, 0.5), "request_p99_ms": pct(latencies, 0.99),
        "request_max_ms": pct(latencies, 1.0), "over_1s": sum(v > 1.0 for v in latencies),
        "crawl_p50_ms": pct(crawls, 0.5), "crawl_p99_ms": pct(crawls, 0.99),
    }


def append(result: dict[str, Any]) -> None:
    """Print the JSON line; add the Markdown row (and the line as a comment) to results.md."""
    line = json.dumps(result)
    print(line)
    title = "## boot-storm (`bench/boot_storm.py`)"
    row = (f"| {result['at']} | {result['crawls']:,} | {result['concurrency']} | {result['requests_per_crawl']} "
           f"| {result['total_s']} | {result['errors']} | {result['request_p50_ms']} / {result['request_p99_ms']} "
           f"/ {result['request_max_ms']} | {result['over_1s']} | {result['crawl_p50_ms']} / {result['crawl_p99_ms']} "
           f"| {result['rss_mib']} |")
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if title not in text:
        text = text.rstrip("\n") + (f"\n\n{title}\n\n| at | crawls | concurrency | requests/crawl | total s | errors "
                                    "| request p50 / p99 / max ms | requests > 1 s | crawl p50 / p99 ms | RSS MiB |\n"
                                    "|---|---|---|---|---|---|---|---|---|---|\n")
    marker = text.index(title)
    table_end = text.find("\n\n", text.index("|---", marker))
    table_end = len(text.rstrip("\n")) if table_end < 0 else table_end
    text = text[:table_end].rstrip("\n") + "\n" + row + text[table_end:]
    RESULTS.write_text(text.rstrip("\n") + "\n" + f"<!-- {line} -->\n")


def main() -> None:
    """Record, or run one storm."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="record cloud-init's request sequence and stop")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--keep", type=Path, help="keep the database here (reused when it exists)")
    options = parser.parse_args()
    if options.record:
        record()
        return
    sequence = json.loads(SEQUENCE.read_text())
    scratch = Path(tempfile.mkdtemp(prefix="imds-bench-storm-"))
    try:
        root = options.keep or scratch
        data_dir = root / "data"
        if not data_dir.exists():
            root.mkdir(parents=True, exist_ok=True)
            generate(data_dir, options.count)
        port = free_port()
        with serving(data_dir, port, scratch / "serve.log") as proc:
            result = asyncio.run(storm(port, options.count, options.concurrency, sequence))
            result["rss_mib"] = round(rss_mib(proc.pid))
        result["at"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
        append(result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
