"""What the benchmark scripts share: a free loopback port, waiting for a URL, stopping by PID, wrk, CPU time."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, timeout: float = 60.0) -> bytes:  # a loaded 2-core machine took 18 s to start imds
    """GET ``url`` until it answers 200; return the body."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - loopback URL built here
                return bytes(response.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process by PID, then SIGKILL if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_wrk(  # noqa: PLR0913 - wrk's own knobs
    url: str, duration: int, connections: int, threads: int = 1, *, prefix: Sequence[str] = (),
    timeout: float | None = None, script: Sequence[str] = (),
) -> dict[str, float]:
    """One wrk run (under ``prefix``, e.g. ``ip netns exec VM``): rps, requests, p50/p90/p99 in ms, non2xx.

    ``script``: a Lua script and its arguments (``wrk -s script.lua url -- args``).
    """
    lua = ["-s", script[0]] if script else []
    extra = ["--", *script[1:]] if script else []
    out = subprocess.run(
        [*prefix, "wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", *lua, url, *extra],
        check=True, capture_output=True, text=True, timeout=timeout if timeout is not None else duration + 60,
    ).stdout
    result = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}  # type: ignore[union-attr]
    result["requests"] = float(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    for pct in ("50", "90", "99"):
        match = re.search(rf"^\s+{pct}(?:\.000)?%\s+([\d.]+)(us|ms|s)", out, re.MULTILINE)
        if match:
            scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[match.group(2)]
            result[f"p{pct}"] = float(match.group(1)) * scale
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    result["non2xx"] = float(errors.group(1)) if errors else 0.0
    return result


def cpu_seconds(pid: int) -> float:
    """utime+stime of ``pid`` and its live children (nginx's worker, imds's --workers), from /proc/<pid>/stat."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(child) for child in children.read_text().split()]
    ticks = 0
    for each in pids:
        fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))
    return ticks / CLOCK_TICKS
