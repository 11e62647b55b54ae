"""Benchmark the instance read path against nginx serving the same bytes.

Starts ``imds serve --demo`` (in-memory store, one process) and nginx (one worker) on
loopback ports, checks that both answer each path (``/metadata`` and an EC2 leaf by
default) with identical bytes, loads each with wrk for the same duration and connection
count, prints requests/s and latency percentiles with the imds/nginx ratio per path, and
writes them to ``bench/results.md``.

Run on demand (never in CI)::

    apt-get install nginx-light wrk   # once
    .venv/bin/python bench/instance_read.py --duration 10 --connections 64

Every process it starts is stopped by its PID; only 127.0.0.1 is targeted.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMDS = Path(sys.executable).with_name("imds")
PATHS = ("/metadata", "/latest/meta-data/instance-id")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, timeout: float = 15.0) -> bytes:
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


def start_nginx(workdir: Path, bodies: dict[str, bytes], port: int) -> subprocess.Popen[bytes]:
    """Start nginx with one worker serving each path's bytes (JSON paths as application/json)."""
    www = workdir / "www"
    www.mkdir()
    for path in (workdir, www):
        path.chmod(0o755)
    locations = []
    for index, (url_path, body) in enumerate(bodies.items()):
        file = www / f"body-{index}"
        file.write_bytes(body)
        file.chmod(0o644)
        kind = "application/json" if url_path == "/metadata" else "text/plain"
        locations.append(f"location = {url_path} {{ default_type {kind}; alias {file}; }}")
    scratch = workdir / "scratch"
    conf = workdir / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {scratch};
    proxy_temp_path {scratch};
    fastcgi_temp_path {scratch};
    uwsgi_temp_path {scratch};
    scgi_temp_path {scratch};
    server {{
        listen 127.0.0.1:{port};
        {" ".join(locations)}
    }}
}}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    return subprocess.Popen([nginx, "-p", str(workdir), "-c", str(conf)])


def run_wrk(url: str, duration: int, connections: int, threads: int) -> dict[str, float]:
    """Requests/s and latency percentiles (ms) from one wrk run."""
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", url],
        check=True, capture_output=True, text=True,
    ).stdout
    result = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}  # type: ignore[union-attr]
    for pct in ("50", "90", "99"):
        match = re.search(rf"^\s+{pct}(?:\.000)?%\s+([\d.]+)(us|ms|s)", out, re.MULTILINE)
        if match:
            scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[match.group(2)]
            result[f"p{pct}"] = float(match.group(1)) * scale
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    result["non2xx"] = float(errors.group(1)) if errors else 0.0
    return result


def main() -> int:
    """Run both servers, load them on each path, print and record the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds of load per server and path")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--path", action="append", help=f"path to load (repeatable; default: {', '.join(PATHS)})")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results.md")
    args = parser.parse_args()
    paths = tuple(args.path or PATHS)
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            print(f"{tool} is not installed: apt-get install nginx-light wrk", file=sys.stderr)
            return 2

    results: dict[str, dict[str, dict[str, float]]] = {}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="imds-bench-") as tmp:
        imds_port, nginx_port = free_port(), free_port()
        env = {**os.environ, "IMDS_LOG_LEVEL": "warning"}
        imds = subprocess.Popen(
            [str(IMDS), "serve", "--demo", "--db", "memory://", "--listen", f"127.0.0.1:{imds_port}"], env=env
        )
        nginx = None
        try:
            bodies = {path: wait_for(f"http://127.0.0.1:{imds_port}{path}") for path in paths}
            nginx = start_nginx(Path(tmp), bodies, nginx_port)
            for path, body in bodies.items():
                if wait_for(f"http://127.0.0.1:{nginx_port}{path}") != body:
                    print(f"nginx and imds disagree on the bytes of {path}", file=sys.stderr)
                    return 1
                sizes[path] = len(body)
            print(f"{args.duration}s per server and path, {args.connections} connections")
            for path in paths:
                results[path] = {}
                for name, port in (("nginx", nginx_port), ("imds", imds_port)):
                    r = run_wrk(f"http://127.0.0.1:{port}{path}", args.duration, args.connections, args.threads)
                    results[path][name] = r
                    print(f"{path:32} {name:6} {r['rps']:>9.0f} req/s  p50 {r.get('p50', 0):.2f} ms  "
                          f"p99 {r.get('p99', 0):.2f} ms  non-2xx {r['non2xx']:.0f}")
                ratio = results[path]["imds"]["rps"] / results[path]["nginx"]["rps"]
                print(f"{path:32} imds/nginx throughput ratio: {ratio:.3f}")
        finally:
            stop(imds)
            if nginx is not None:
                stop(nginx)
    write_results(args, results, sizes)
    return 0


def write_results(
    args: argparse.Namespace, results: dict[str, dict[str, dict[str, float]]], sizes: dict[str, int]
) -> None:
    """Replace bench/results.md with this run."""
    nginx_version = subprocess.run(["nginx", "-v"], capture_output=True, text=True, check=False).stderr.strip()
    lines = [
        "# Instance read benchmark: imds vs nginx",
        "",
        (
            f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, {nginx_version}. Command: `.venv/bin/python "
            f"bench/instance_read.py --duration {args.duration} --connections {args.connections} "
            f"--threads {args.threads}`."
        ),
        "",
        (
            "The demo instance's answers, loopback, wrk on the same machine; imds is one `imds serve` "
            "process (uvicorn + uvloop + httptools), nginx one worker serving the same bytes at the same paths."
        ),
        "",
        "| path | bytes | server | req/s | p50 ms | p90 ms | p99 ms | non-2xx | imds/nginx |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path, by_server in results.items():
        ratio = by_server["imds"]["rps"] / by_server["nginx"]["rps"]
        for name, r in by_server.items():
            shown = f"**{ratio:.3f}**" if name == "imds" else ""
            lines.append(
                f"| `{path}` | {sizes[path]} | {name} | {r['rps']:.0f} | {r.get('p50', 0):.2f} | "
                f"{r.get('p90', 0):.2f} | {r.get('p99', 0):.2f} | {r['non2xx']:.0f} | {shown} |"
            )
    args.output.write_text("\n".join([*lines, ""]))


if __name__ == "__main__":
    sys.exit(main())
