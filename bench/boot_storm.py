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
The client is as cheap as it can be made in Python, since it shares the cores with the
server and its own delays are in every latency it records: ``--clients`` processes (2)
on uvloop, each request bytes built once (the token spliced in) and sent on a bare
non-blocking socket, read until the server closes. Reports total seconds, p50/p99/max per
request and per crawl, errors (a status other than the recorded one, or a failed
connection), the clients' CPU per request and which steps of the sequence the slowest 1 %
of requests were (``slowest_1pct_by_step``: where a storm's tail comes from); appends a
JSON line and a Markdown row to ``bench/results.md``. ``bench/instance_read.py --boot-storm N`` runs the same storm
against nginx too (the floor of this client and kernel on the box). Target (issue 12):
10k crawls, 0 errors, no request over 1 s; issue 34: request p99 under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import uvloop
from benchlib import free_port
from scale import RESULTS, built_ahead, generate, loopback, rss_mib, serve, wait_ready

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
    with serve(data_dir, port, log, "--imdsv2", "optional", "--log-level", "warning", "--metrics-public") as proc:
        wait_ready(proc, port, log)
        built, seconds = built_ahead(port)
        print(f"imds built {built} instances ahead of their first read in {seconds:.1f} s")
        yield proc


CLIENTS = 2  # client processes: one asyncio loop alone on a 2-core box is the storm's bottleneck and its noise


def prebuilt(sequence: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    """Each step's request bytes, split where the instance's token goes (the rest is the same for everyone).

    The head is the one the client always sent (``Host``, ``Connection: close``,
    ``Content-Length: 0``, then the IMDSv2 headers), as bytes built once.
    """
    built = []
    for step in sequence:
        head = (f"{step['method']} /{step['path']} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                "Content-Length: 0\r\n")
        if step["ttl"]:
            head += f"{TTL}: {step['ttl']}\r\n"
        if step["token"]:
            built.append(((head + f"{TOKEN}: ").encode(), b"\r\n\r\n"))
        else:
            built.append(((head + "\r\n").encode(), b""))
    return built


async def request(port: int, source: str, data: bytes) -> tuple[int, bytes]:
    """One request on a new connection from ``source`` (as cloud-init's requests does), read to the server's close.

    A bare non-blocking socket on the loop (connect, one send, recv until EOF): the client's
    own cost per request is a few loop callbacks, not a stream reader and writer.
    """
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)  # noqa: FBT003 - socket's own API
        sock.bind((source, 0))
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, data)
        chunks = []
        while chunk := await loop.sock_recv(sock, 65536):
            chunks.append(chunk)
    finally:
        sock.close()
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def crawl(port: int, n: int, steps: list[tuple[dict[str, Any], bytes, bytes]],
                latencies: list[float], at: list[int]) -> tuple[float, int]:
    """Replay the sequence as instance ``n``: (seconds, errors); each request's step index goes to ``at``."""
    source, token, errors = loopback(n), b"", 0
    clock = time.perf_counter
    started = clock()
    for index, (step, head, tail) in enumerate(steps):
        data = head + token + tail if tail else head
        begin = clock()
        try:
            status, body = await request(port, source, data)
        except (OSError, ValueError, IndexError):  # refused, reset, or not an HTTP answer
            status, body = 0, b""
        latencies.append(clock() - begin)
        at.append(index)
        if step["method"] == "PUT" and status == 200:
            token = body
        errors += status != step["status"]
    return clock() - started, errors


async def _part(port: int, crawls: range, concurrency: int, sequence: list[dict[str, Any]]) -> tuple[
        list[float], list[int], list[float], int]:
    """The crawls ``crawls``, at most ``concurrency`` at once: latencies, their step indexes, crawl times, errors."""
    steps = [(step, head, tail) for step, (head, tail) in zip(sequence, prebuilt(sequence), strict=True)]
    latencies: list[float] = []
    at: list[int] = []
    crawled: list[float] = []
    errors = 0
    numbers = iter(crawls)

    async def worker() -> None:  # a fixed set of crawlers, each taking the next instance: no task per crawl
        nonlocal errors
        for n in numbers:
            seconds, failed = await crawl(port, n, steps, latencies, at)
            crawled.append(seconds)
            errors += failed

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(crawls)))))
    return latencies, at, crawled, errors


def _client(port: int, crawls: range, concurrency: int, sequence: list[dict[str, Any]], out: Connection) -> None:
    """One client process: its crawls on uvloop; its figures and CPU seconds sent back on ``out``."""
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    with runner:
        latencies, at, crawled, errors = runner.run(_part(port, crawls, concurrency, sequence))
    used = resource.getrusage(resource.RUSAGE_SELF)
    out.send_bytes(array("d", latencies).tobytes())
    out.send_bytes(array("H", at).tobytes())
    out.send_bytes(array("d", crawled).tobytes())
    out.send((errors, used.ru_utime + used.ru_stime))
    out.close()


def storm(port: int, count: int, concurrency: int, sequence: list[dict[str, Any]], clients: int = CLIENTS) -> dict[
        str, Any]:
    """Run ``count`` crawls, at most ``concurrency`` at once, from ``clients`` processes; the figures.

    Instance n goes to client n mod ``clients``; each client runs its share of the
    concurrency. ``client_cpu_us_per_request``: the clients' own CPU (user + system), which
    shares the cores with the server.
    """
    context = multiprocessing.get_context("fork")
    pipes, processes = [], []
    started = time.perf_counter()
    for index in range(clients):
        receive, send = context.Pipe(duplex=False)
        share = range(index, count, clients)
        process = context.Process(target=_client, args=(port, share, max(1, concurrency // clients), sequence, send))
        process.start()
        send.close()
        pipes.append(receive)
        processes.append(process)
    latencies: list[float] = []
    at: list[int] = []
    crawls: list[float] = []
    errors, client_cpu = 0, 0.0
    for receive in pipes:
        latencies += array("d", receive.recv_bytes())
        at += array("H", receive.recv_bytes())
        crawls += array("d", receive.recv_bytes())
        failed, cpu = receive.recv()
        errors += failed
        client_cpu += cpu
    total = time.perf_counter() - started
    for process in processes:
        process.join(timeout=60)
    crawls.sort()
    slowest = sorted(zip(latencies, at, strict=True), reverse=True)[:max(len(latencies) // 100, 1)]
    latencies.sort()

    def pct(values: list[float], q: float) -> float:
        return round(values[min(int(len(values) * q), len(values) - 1)] * 1000, 1)

    return {
        "bench": "boot-storm", "crawls": count, "concurrency": concurrency, "requests_per_crawl": len(sequence),
        "clients": clients, "total_s": round(total, 1), "requests": len(latencies), "errors": errors,
        "request_p50_ms": pct(latencies, 0.5), "request_p99_ms": pct(latencies, 0.99),
        "request_max_ms": pct(latencies, 1.0), "over_1s": sum(v > 1.0 for v in latencies),
        "crawl_p50_ms": pct(crawls, 0.5), "crawl_p99_ms": pct(crawls, 0.99),
        "client_cpu_us_per_request": round(client_cpu / max(len(latencies), 1) * 1e6, 1),
        "slowest_1pct_by_step": tail_steps(slowest, sequence),
    }


def tail_steps(slowest: list[tuple[float, int]], sequence: list[dict[str, Any]], top: int = 5) -> dict[str, int]:
    """Which steps of the sequence the slowest requests were: ``"<index> <method> <path>"`` -> count, most first."""
    counts = Counter(index for _, index in slowest)
    return {f"{index} {sequence[index]['method']} /{sequence[index]['path']}": count
            for index, count in counts.most_common(top)}


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
    parser.add_argument("--clients", type=int, default=CLIENTS, help="client processes sharing the crawls")
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
            result = storm(port, options.count, options.concurrency, sequence, options.clients)
            result["rss_mib"] = round(rss_mib(proc.pid))
        result["at"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
        append(result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
