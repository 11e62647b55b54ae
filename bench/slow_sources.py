"""Can one source starve the others with slow connections? ``imds serve`` under a slowloris, on loopback.

Starts ``imds serve`` (granian, ``--db memory://``, its default limits unless given) on a
free port of 127.0.0.1, with one record at 127.0.0.3. Then, for ``--duration`` seconds:

- ``--slow`` connections from 127.0.0.2 each send the start of a request and then one more
  header byte every ``--drip`` seconds, never finishing it; one the server closes is opened
  again (an attacker keeps the pressure up);
- one normal reader at 127.0.0.3 opens a new connection for each ``GET /metadata``
  (``--rate`` per second, each given ``--timeout`` seconds) and times the answer.

The reader runs alone for ``--baseline`` seconds first. Prints the reader's p50/p99/max and
failures, alone and under attack, and how long the server let a slow connection live.
Loopback only; bounded in connections and time; the server is stopped by its PID.

    .venv/bin/python bench/slow_sources.py --slow 300 --drip 3 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from benchlib import free_port, stop, wait_for

ATTACKER, READER = "127.0.0.2", "127.0.0.3"
READER_ID = "5e1f0c1e-1b1d-4d8e-9f00-00000000510a"
TOKEN = "slow-sources-bench"  # noqa: S105 - the throwaway admin token of a loopback server
MAX_SLOW, MAX_DURATION = 2000, 120.0


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


async def slow_connection(port: int, drip: float, until: float, attack: Attack) -> None:
    """Hold one never-finished request open, a byte every ``drip`` s; reopen it when the server closes it."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))
        except OSError:
            await asyncio.sleep(drip)
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


async def measure(port: int, args: argparse.Namespace) -> dict[str, object]:
    """The baseline, then the attack with the reader alongside."""
    baseline = await reader_loop(port, args.rate, args.timeout, args.baseline)
    attack = Attack()
    until = time.monotonic() + args.duration
    # Opened at once: the attacker does not wait.
    slow = [asyncio.create_task(slow_connection(port, args.drip, until, attack)) for _ in range(args.slow)]
    await asyncio.sleep(min(2.0, args.duration / 4))  # let them all connect before timing the reader
    under = await reader_loop(port, args.rate, args.timeout, max(1.0, until - time.monotonic()))
    await asyncio.gather(*slow)
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
    }


def main() -> int:
    """Start serve, seed one record, measure, stop serve by PID, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow", type=int, default=300, help=f"slow connections from {ATTACKER} (<= {MAX_SLOW})")
    parser.add_argument("--drip", type=float, default=3.0, help="seconds between the slow header bytes")
    parser.add_argument("--duration", type=float, default=20.0, help=f"seconds of attack (<= {MAX_DURATION:.0f})")
    parser.add_argument("--baseline", type=float, default=3.0, help="seconds of the reader alone first")
    parser.add_argument("--rate", type=float, default=10.0, help=f"reads per second from {READER}")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds one read may take (then a failure)")
    parser.add_argument("serve_args", nargs="*", help="extra imds serve flags after --, e.g. -- --max-connections 64")
    args = parser.parse_args()
    args.slow = max(0, min(args.slow, MAX_SLOW))
    args.duration = max(1.0, min(args.duration, MAX_DURATION))
    args.baseline = max(1.0, min(args.baseline, 30.0))
    args.rate = max(0.5, min(args.rate, 100.0))
    args.drip = max(0.1, min(args.drip, 30.0))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < args.slow + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.slow + 1024), hard))
    imds = Path(sys.executable).parent / "imds"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="imds-slow-") as tmp:
        env = {**os.environ, "IMDS_ADMIN_TOKEN": TOKEN, "HOME": tmp, "XDG_DATA_HOME": tmp}
        with Path(tmp, "serve.log").open("wb") as log:
            server = subprocess.Popen(
                [str(imds), "serve", "--db", "memory://", "--listen", f"127.0.0.1:{port}", *args.serve_args],
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
            result = asyncio.run(measure(port, args))
        finally:
            stop(server)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"imds serve {' '.join(args.serve_args) or '(defaults)'}; {args.slow} slow connections from {ATTACKER}, "
          f"a byte every {args.drip:g} s, {args.duration:g} s; reader {args.rate:g}/s from {READER}; load {load}")
    for key, value in result.items():
        print(f"  {key:22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
