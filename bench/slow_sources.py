"""Can one source starve the others with slow connections? ``imds serve`` under a slowloris, on loopback.

Starts ``imds serve`` (granian, ``--db memory://``, its default limits unless given; from
``--source SRC`` instead of this checkout to measure another version) on a free port of
127.0.0.1, with one record at 127.0.0.3. Then, for ``--duration`` seconds:

- ``--slow`` connections from each of ``--sources`` addresses (127.0.0.2, then 127.0.0.4,
  127.0.0.5, ...) each send the start of a request and then one more header byte every
  ``--drip`` seconds, never finishing it; one the server closes is opened again (an
  attacker keeps the pressure up);
- one normal reader at 127.0.0.3 opens a new connection for each ``GET /metadata``
  (``--rate`` per second, each given ``--timeout`` seconds) and times the answer.

The reader runs alone for ``--baseline`` seconds first. Prints the reader's p50/p99/max and
failures, alone and under attack, how long the server let a slow connection live and the
server's CPU time during the attack. Loopback only; bounded in connections and time; the
server is stopped by its PID.

    .venv/bin/python bench/slow_sources.py --slow 300 --drip 3 --duration 20
    .venv/bin/python bench/slow_sources.py --sources 10 --slow 500 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import cpu_seconds, free_port, stop, wait_for

ATTACKER, READER = "127.0.0.2", "127.0.0.3"
READER_ID = "5e1f0c1e-1b1d-4d8e-9f00-00000000510a"
TOKEN = "slow-sources-bench"  # noqa: S105 - the throwaway admin token of a loopback server
MAX_SLOW, MAX_SOURCES, MAX_TOTAL, MAX_DURATION = 2000, 20, 6000, 120.0


def attackers(count: int) -> list[str]:
    """The slow sources' addresses: 127.0.0.2, then 127.0.0.4 onwards (127.0.0.3 is the reader)."""
    return [f"127.0.0.{n}" for n in range(2, count + 3) if n != 3][:count]


@dataclass
class Attack:
    """What the slow connections saw."""

    opened: int = 0
    open_now: int = 0
    peak: int = 0
    closed_by_server: int = 0
    answered: int = 0
    lifetimes: list[float] = field(default_factory=list)


@dataclass
class Reads:
    """What the normal reader saw."""

    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)

    def fail(self, why: str) -> None:
        """Count one failed read by its kind."""
        self.failures[why] = self.failures.get(why, 0) + 1

    def summary(self) -> str:
        """p50/p99/max in ms, the count and the failures."""
        if not self.latencies:
            return f"0 answered, failures {self.failures}"
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return (f"{len(ordered)} answered: p50 {statistics.median(ordered) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
                f"max {ordered[-1] * 1e3:.1f} ms; failures {self.failures or 'none'}")


async def slow_connection(port: int, source: str, drip: float, until: float, attack: Attack) -> None:
    """Hold one never-finished request open, a byte every ``drip`` s; reopen it when the server closes it."""
    while time.monotonic() < until:
        try:  # bounded: a SYN dropped by a full backlog is retried for minutes
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), max(0.1, until - time.monotonic()))
        except (OSError, TimeoutError):
            await asyncio.sleep(min(drip, max(0.0, until - time.monotonic())))
            continue
        attack.opened += 1
        attack.open_now += 1
        attack.peak = max(attack.peak, attack.open_now)
        started = time.monotonic()
        try:
            writer.write(b"GET /metadata HTTP/1.1\r\nHost: imds\r\nX-Slow: ")
            while time.monotonic() < until:
                try:
                    data = await asyncio.wait_for(reader.read(4096), drip)
                except TimeoutError:
                    writer.write(b"a")
                    await writer.drain()
                    continue
                attack.answered += bool(data)
                attack.closed_by_server += 1
                attack.lifetimes.append(time.monotonic() - started)
                break
        except OSError:
            attack.closed_by_server += 1
            attack.lifetimes.append(time.monotonic() - started)
        finally:
            attack.open_now -= 1
            writer.close()


async def read_once(port: int, limit: float, reads: Reads) -> None:
    """One ``GET /metadata`` on a new connection from the reader's address, timed."""
    started = time.monotonic()
    writer = None
    try:
        async with asyncio.timeout(limit):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(READER, 0))
            writer.write(b"GET /metadata HTTP/1.1\r\nHost: imds\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
    except TimeoutError:
        reads.fail("timeout")
        return
    except OSError as exc:
        reads.fail(type(exc).__name__)
        return
    finally:
        if writer is not None:
            writer.close()
    status = answer.split(b" ", 2)[1:2]
    if status != [b"200"]:
        reads.fail(f"status {status[0].decode() if status else 'none'}")
        return
    reads.latencies.append(time.monotonic() - started)


async def reader_loop(port: int, rate: float, limit: float, seconds: float) -> Reads:
    """Start a read every ``1/rate`` s for ``seconds``; wait for the last ones."""
    reads = Reads()
    tasks = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        tasks.append(asyncio.create_task(read_once(port, limit, reads)))
        await asyncio.sleep(1 / rate)
    await asyncio.gather(*tasks)
    return reads


def _attack_main(port: int, args: argparse.Namespace, until: float, results: multiprocessing.Queue[Attack]) -> None:
    """The slow connections, in their own process: the reader's timings must not include the attacker's loop.

    ``--attacker-nice``: on a small shared machine the attacker's own CPU use (thousands of
    reconnections a second when the server shuts its connections) competes with the server;
    a real attacker runs elsewhere.
    """
    os.nice(args.attacker_nice)
    attack = Attack()

    async def run() -> None:
        await asyncio.gather(*(slow_connection(port, source, args.drip, until, attack)
                               for source in attackers(args.sources) for _ in range(args.slow)))

    asyncio.run(run())
    results.put(attack)


async def measure(port: int, args: argparse.Namespace, pid: int) -> dict[str, object]:
    """The baseline, then the attack (another process) with the reader alongside."""
    baseline = await reader_loop(port, args.rate, args.timeout, args.baseline)
    cpu = cpu_seconds(pid)
    until = time.monotonic() + args.duration  # CLOCK_MONOTONIC: the same clock in the child
    spawn = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[Attack] = spawn.Queue()
    attacker = spawn.Process(target=_attack_main, args=(port, args, until, results))
    attacker.start()
    # Opened at once: the attacker does not wait. Let them all connect before timing the reader.
    await asyncio.sleep(min(2.0, args.duration / 4))
    under = await reader_loop(port, args.rate, args.timeout, max(1.0, until - time.monotonic()))
    attack = await asyncio.to_thread(results.get, timeout=args.duration + 60)
    await asyncio.to_thread(attacker.join, 30)
    cpu = cpu_seconds(pid) - cpu
    lifetimes = sorted(attack.lifetimes)
    return {
        "baseline": baseline.summary(),
        "under_attack": under.summary(),
        "slow_opened": attack.opened,
        "slow_peak_open": attack.peak,
        "slow_closed_by_server": attack.closed_by_server,
        "slow_answered": attack.answered,
        "slow_lifetime_s": (f"median {statistics.median(lifetimes):.1f}, max {lifetimes[-1]:.1f}"
                            if lifetimes else "none closed"),
        "server_cpu_s": f"{cpu:.1f} in {args.duration:g} s of attack",
    }


def _bounded(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments clamped to what this loopback benchmark allows."""
    args.sources = max(1, min(args.sources, MAX_SOURCES))
    args.attacker_nice = max(0, min(args.attacker_nice, 19))
    args.slow = max(0, min(args.slow, MAX_SLOW, MAX_TOTAL // args.sources))
    args.duration = max(1.0, min(args.duration, MAX_DURATION))
    args.baseline = max(1.0, min(args.baseline, 30.0))
    args.rate = max(0.5, min(args.rate, 100.0))
    args.drip = max(0.1, min(args.drip, 30.0))
    return args


def main() -> int:
    """Start serve, seed one record, measure, stop serve by PID, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow", type=int, default=300, help=f"slow connections per source (<= {MAX_SLOW})")
    parser.add_argument("--sources", type=int, default=1,
                        help=f"slow sources: {ATTACKER}, then 127.0.0.4... "
                             f"(<= {MAX_SOURCES}; sources x slow <= {MAX_TOTAL})")
    parser.add_argument("--attacker-nice", type=int, default=0,
                        help="nice increment of the attacker's process (0-19; 10: it yields the CPU to the server)")
    parser.add_argument("--source", type=Path, default=None,
                        help="a src directory to run imds serve from (another checkout: the version before)")
    parser.add_argument("--drip", type=float, default=3.0, help="seconds between the slow header bytes")
    parser.add_argument("--duration", type=float, default=20.0, help=f"seconds of attack (<= {MAX_DURATION:.0f})")
    parser.add_argument("--baseline", type=float, default=3.0, help="seconds of the reader alone first")
    parser.add_argument("--rate", type=float, default=10.0, help=f"reads per second from {READER}")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds one read may take (then a failure)")
    parser.add_argument("serve_args", nargs="*", help="extra imds serve flags after --, e.g. -- --max-connections 64")
    args = _bounded(parser.parse_args())
    total = args.slow * args.sources
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < total + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, total + 1024), hard))
    program = [str(Path(sys.executable).parent / "imds")]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="imds-slow-") as tmp:
        env = {**os.environ, "IMDS_ADMIN_TOKEN": TOKEN, "HOME": tmp, "XDG_DATA_HOME": tmp}
        if args.source is not None:
            program, env["PYTHONPATH"] = [sys.executable, "-m", "imds"], str(args.source.resolve())
        with Path(tmp, "serve.log").open("wb") as log:
            server = subprocess.Popen(
                [*program, "serve", "--db", "memory://", "--listen", f"127.0.0.1:{port}", *args.serve_args],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        try:
            wait_for(f"{base}/healthz")
            body = {"id": READER_ID, "ipAddresses": [READER],
                    "metadata": {"id": READER_ID, "hostname": "reader"}}
            request = urllib.request.Request(  # noqa: S310 - loopback URL built here
                f"{base}/device-metadata", data=json.dumps(body).encode(), method="POST",
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )
            try:
                urllib.request.urlopen(request, timeout=5).close()  # noqa: S310 - loopback URL built here
            except urllib.error.HTTPError as exc:
                sys.exit(f"seeding the reader's record failed: {exc.code} {exc.read().decode(errors='replace')}")
            result = asyncio.run(measure(port, args, server.pid))
        finally:
            stop(server)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    sources = f"{args.sources} sources ({', '.join(attackers(args.sources))})" if args.sources > 1 else ATTACKER
    where = f" from {args.source}" if args.source else ""
    nice = f", attacker nice {args.attacker_nice}" if args.attacker_nice else ""
    print(f"imds serve{where} {' '.join(args.serve_args) or '(defaults)'}{nice}; "
          f"{args.slow} slow connections from {sources}, "
          f"a byte every {args.drip:g} s, {args.duration:g} s; reader {args.rate:g}/s from {READER}; load {load}")
    for key, value in result.items():
        print(f"  {key:22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
