"""What would serving the instance front through granian's RSGI interface buy? An evaluation.

Runs the same imds app (demo instance, in-memory store) under granian twice, one worker
each: through ASGI (``Bounded(InstanceFront)``, what ``imds serve`` runs) and through RSGI
with a thin shim that turns the RSGI scope into the dict the front reads and its two ASGI
messages into one ``protocol.response_bytes`` call. Loads both with ``wrk -t1 -c64``,
alternating, and reports req/s, p50/p99 and server CPU µs/request per path and the
RSGI/ASGI ratios from the same run. The shim still builds an ASGI scope per request; a
native RSGI front (handlers reading granian's scope) would save a little more. Admin
paths are not served by the shim (they would need an RSGI→ASGI bridge or their own
listener: ``--admin-listen``).

    .venv/bin/python bench/rsgi_front.py --duration 5 --repeat 3

Appends to ``bench/results.md`` and ``bench/results.jsonl``. Every process it starts is
stopped by its PID; only 127.0.0.1 is targeted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchlib import cpu_seconds, free_port, run_wrk, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("/metadata", "/latest/meta-data/instance-id", "/openstack/latest/meta_data.json")

APPS = '''
import asyncio
from dataclasses import replace

from imds.app import build_app
from imds.config import Settings
from imds.services.demo import load_demo
from imds.web.bounded import Bounded

SETTINGS = Settings.of(db="memory://", rate_limit=0.0, max_requests_per_source=0, admin_token="bench-token",
                       demo=True)
asgi_app = Bounded(build_app(SETTINGS), SETTINGS)  # the lifespan loads the demo


class RsgiShim:
    """The instance front behind RSGI: RSGI scope -> the dict it reads; its reply -> response_bytes."""

    def __init__(self):
        self.front = build_app(replace(SETTINGS, demo=False))

    def __rsgi_init__(self, loop):
        async def start():
            self.running = self.front.services.running()
            await self.running.__aenter__()
            await load_demo(self.front.services.records)
        loop.run_until_complete(start())

    async def __rsgi__(self, scope, protocol):
        host, _, port = scope.client.rpartition(":")
        request = {"type": "http", "method": scope.method, "path": scope.path,
                   "query_string": scope.query_string.encode("latin-1"),
                   "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()],
                   "client": (host.strip("[]"), int(port or 0))}
        start = {}

        async def receive():
            return {"type": "http.request", "body": await protocol(), "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                start.update(message)
                return
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start["headers"]
                       if k != b"content-length"]
            protocol.response_bytes(start["status"], headers, message.get("body", b""))

        await self.front(request, receive, send)


rsgi_app = RsgiShim()
'''


def start(interface: str, port: int, workdir: Path) -> subprocess.Popen[bytes]:
    """Start granian (one worker, uvloop) serving the ASGI app or the RSGI shim on ``port``."""
    granian = Path(sys.executable).with_name("granian")
    app = "bench_apps:rsgi_app" if interface == "rsgi" else "bench_apps:asgi_app"
    env = {**os.environ, "PYTHONPATH": str(workdir), "IMDS_LOG_LEVEL": "warning"}
    command = [str(granian), "--interface", interface, "--workers", "1", "--loop", "uvloop", "--no-ws",
               "--log-level", "warning", "--host", "127.0.0.1", "--port", str(port), app]
    return subprocess.Popen(command, env=env, cwd=workdir)


def main() -> int:
    """Start both, check they answer the same bytes, load them alternately, print and record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results.md")
    args = parser.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    best: dict[tuple[str, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="imds-rsgi-") as tmp:
        Path(tmp, "bench_apps.py").write_text(APPS)
        ports = {name: free_port() for name in ("asgi", "rsgi")}
        servers = {name: start(name, ports[name], Path(tmp)) for name in ports}
        try:
            for path in PATHS:
                bodies = {name: wait_for(f"http://127.0.0.1:{port}{path}", 30) for name, port in ports.items()}
                if len(bodies["asgi"]) != len(bodies["rsgi"]):
                    print(f"ASGI and RSGI disagree on {path}", file=sys.stderr)
                    return 1
            time.sleep(0.5)
            for path in PATHS:
                for repetition in range(args.repeat):
                    for name, port in ports.items():
                        pid = servers[name].pid
                        before = cpu_seconds(pid)
                        r = run_wrk(f"http://127.0.0.1:{port}{path}", args.duration, 64)
                        r["cpu_us"] = (cpu_seconds(pid) - before) / max(r["requests"], 1.0) * 1e6
                        print(f"{path:34} {name} #{repetition + 1} {r['rps']:>8.0f} req/s  "
                              f"p50 {r.get('p50', 0):.2f} ms  p99 {r.get('p99', 0):.2f} ms  "
                              f"cpu {r['cpu_us']:.1f} us/req  non-2xx {r['non2xx']:.0f}")
                        kept = best.get((path, name))
                        if kept is None or r["cpu_us"] < kept["cpu_us"]:
                            best[(path, name)] = r
        finally:
            for process in servers.values():
                stop(process)
    write_results(args, best, load_before)
    return 0


def write_results(args: argparse.Namespace, best: dict[tuple[str, str], dict[str, float]],
                  load_before: list[str]) -> None:
    """The best (lowest-CPU) run of each path and interface, and RSGI/ASGI ratios."""
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    lines = ["", f"## RSGI front evaluation: {stamp}", "",
             (f"{os.cpu_count()} cores, load average {' '.join(load_before)} before / {' '.join(load_after)} after. "
              f"Command: `.venv/bin/python bench/rsgi_front.py --duration {args.duration} --repeat {args.repeat}`. "
              "granian 1 worker each, the same imds app: ASGI (`Bounded(InstanceFront)`) vs an RSGI shim in front of "
              "the same `InstanceFront`; best (lowest CPU) of the repetitions."),
             "",
             ("| path | ASGI req/s | RSGI req/s | RSGI/ASGI req/s | ASGI p99 ms | RSGI p99 ms | ASGI cpu µs/req | "
              "RSGI cpu µs/req | RSGI/ASGI cpu |"),
             "|---|---|---|---|---|---|---|---|---|"]
    with args.output.with_suffix(".jsonl").open("a") as jsonl:
        for path in PATHS:
            a, r = best[(path, "asgi")], best[(path, "rsgi")]
            lines.append(f"| `{path}` | {a['rps']:.0f} | {r['rps']:.0f} | **{r['rps'] / a['rps']:.3f}** | "
                         f"{a.get('p99', 0):.2f} | {r.get('p99', 0):.2f} | {a['cpu_us']:.1f} | {r['cpu_us']:.1f} | "
                         f"**{r['cpu_us'] / a['cpu_us']:.3f}** |")
            jsonl.write(json.dumps({"bench": "rsgi_front", "at": stamp, "path": path, "asgi": a, "rsgi": r,
                                    "load_before": load_before, "load_after": load_after}) + "\n")
    print("\n".join(lines))
    with args.output.open("a") as markdown:
        markdown.write("\n".join([*lines, ""]))


if __name__ == "__main__":
    sys.exit(main())
