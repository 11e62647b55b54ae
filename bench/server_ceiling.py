"""How fast can each server interface go at all? The server-choice benchmark behind ``--server``.

Serves one fixed body (``/metadata``'s size by default) from a trivial app under granian's
RSGI and ASGI interfaces and under uvicorn (httptools, uvloop), one worker each, and loads
each with ``wrk -t1 -c64``. No imds code runs: the gap between these and the ``read``
benchmark is what imds itself costs; the gap between RSGI and ASGI is what an RSGI front
would buy. Appends a table to ``bench/results.md``.

    .venv/bin/python bench/server_ceiling.py --duration 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from instance_read import ROOT, cpu_seconds, free_port, run_wrk, stop, wait_for

APPS = """
BODY = b"x" * {size}
HEADERS_ASGI = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
HEADERS_RSGI = [("content-type", "application/json")]


async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({{"type": "http.response.start", "status": 200, "headers": HEADERS_ASGI}})
    await send({{"type": "http.response.body", "body": BODY}})


async def rsgi_app(scope, protocol):
    protocol.response_bytes(200, HEADERS_RSGI, BODY)
"""


def main() -> int:
    """Start each server on the trivial app, load it, print and record req/s, latency and CPU."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--size", type=int, default=3852)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results.md")
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    rows = []
    with tempfile.TemporaryDirectory(prefix="imds-ceiling-") as tmp:
        Path(tmp, "ceiling_apps.py").write_text(APPS.format(size=args.size))
        env = {**os.environ, "PYTHONPATH": tmp}
        for name, command in (
            ("granian rsgi", [bin_dir / "granian", "--interface", "rsgi", "--workers", "1", "--loop", "uvloop",
                              "--no-ws", "--log-level", "warning", "ceiling_apps:rsgi_app"]),
            ("granian asgi", [bin_dir / "granian", "--interface", "asginl", "--workers", "1", "--loop", "uvloop",
                              "--no-ws", "--log-level", "warning", "ceiling_apps:asgi_app"]),
            ("uvicorn", [bin_dir / "uvicorn", "--workers", "1", "--log-level", "warning", "--no-access-log",
                         "ceiling_apps:asgi_app"]),
        ):
            port = free_port()
            flag = ["--port", str(port), "--host", "127.0.0.1"]
            process = subprocess.Popen([*map(str, command), *flag], env=env, cwd=tmp)
            try:
                wait_for(f"http://127.0.0.1:{port}/")
                time.sleep(0.5)  # let granian's worker process settle before measuring its CPU
                before = cpu_seconds(process.pid)
                r = run_wrk(f"http://127.0.0.1:{port}/", args.duration, 64, 1)
                r["cpu_us_per_request"] = (cpu_seconds(process.pid) - before) / max(r["requests"], 1) * 1e6
            finally:
                stop(process)
            rows.append((name, r))
            print(f"{name:14} {r['rps']:>8.0f} req/s  p50 {r.get('p50', 0):.2f} ms  p99 {r.get('p99', 0):.2f} ms  "
                  f"cpu {r['cpu_us_per_request']:.1f} us/req")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    lines = ["", f"## server ceiling: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "",
             (f"A trivial app returning {args.size} bytes, one worker, `wrk -t1 -c64 -d{args.duration}s`, load average "
             f"{load}. Command: `.venv/bin/python bench/server_ceiling.py --duration {args.duration}`."), "",
             "| server | req/s | p50 ms | p99 ms | cpu µs/req |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {r['rps']:.0f} | {r.get('p50', 0):.2f} | {r.get('p99', 0):.2f} | "
              f"{r['cpu_us_per_request']:.1f} |" for name, r in rows]
    with args.output.open("a") as markdown:
        markdown.write("\n".join([*lines, ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
