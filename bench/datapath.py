"""Benchmark the added cost of each host datapath against reaching ``imds serve`` directly.

Starts ``imds serve --demo`` (in-memory store) trusting 127.0.0.1 with a proxy secret, then
each datapath in ``DATAPATHS`` in turn, and loads the same path through each with wrk: one
connection (added latency per request) and ``--connections`` (throughput). Prints and
writes to ``bench/datapath.md`` every figure with its ratio against ``direct`` from the
same run.

Run on demand (never in CI)::

    apt-get install wrk   # once
    .venv/bin/python bench/datapath.py --duration 5

Adding a datapath: write a context manager ``(Bench) -> Target`` that starts what it
needs (stopping it by PID on exit) and yields where wrk should aim and how to run it (e.g.
``ip netns exec VM`` as a prefix for a client inside a namespace), then add it to
``DATAPATHS``. Every process is stopped by its PID; only loopback (or namespaces the
datapath creates) is targeted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from benchlib import free_port, run_wrk, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]
IMDS = Path(sys.executable).with_name("imds")
DEFAULT_PATH = "/latest/meta-data/instance-id"





@dataclass
class Bench:
    """What every datapath may use: the running ``imds serve``, its secret, a scratch dir."""

    workdir: Path
    serve_url: str
    secret_file: Path
    instance_id: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """Where wrk aims, and the command prefix it runs under (empty: this namespace)."""

    url: str
    prefix: tuple[str, ...] = ()


@contextmanager
def direct(bench: Bench) -> Iterator[Target]:
    """The reference: the client talks to ``imds serve`` itself (it is the demo instance, 127.0.0.1)."""
    yield Target(bench.serve_url)


@contextmanager
def via_proxy(bench: Bench) -> Iterator[Target]:
    """``imds proxy --map`` on loopback: 127.0.0.1 mapped to the demo instance, signed to serve."""
    port = free_port()
    mapping = bench.workdir / "map.txt"
    mapping.write_text(f"127.0.0.1 {bench.instance_id}\n")
    process = subprocess.Popen(
        [str(IMDS), "proxy", "--listen", f"127.0.0.1:{port}", "--upstream", bench.serve_url,
         "--shared-secret-file", str(bench.secret_file), "--map", str(mapping)],
        env=bench.env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + DEFAULT_PATH)
        yield Target(url)
    finally:
        stop(process)


DATAPATHS: dict[str, Callable[[Bench], AbstractContextManager[Target]]] = {
    "direct": direct,
    "imds proxy": via_proxy,
}


def main() -> int:
    """Start serve, then each datapath; load each and record the ratios against direct."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds of load per datapath and mode")
    parser.add_argument("--connections", type=int, default=32, help="connections of the throughput run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--path", default=DEFAULT_PATH)
    parser.add_argument("--datapath", action="append", choices=sorted(DATAPATHS), help="default: all")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "datapath.md")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        print("wrk is not installed: apt-get install wrk", file=sys.stderr)
        return 2
    chosen = ["direct", *[name for name in (args.datapath or DATAPATHS) if name != "direct"]]
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="imds-datapath-") as tmp:
        workdir = Path(tmp)
        secret = workdir / "secret"
        secret.write_bytes(os.urandom(32).hex().encode())
        env = {k: v for k, v in os.environ.items() if not k.startswith("IMDS_")}
        env["IMDS_LOG_LEVEL"] = env["IMDS_PROXY_LOG_LEVEL"] = "warning"
        port = free_port()
        serve = subprocess.Popen(
            [str(IMDS), "serve", "--demo", "--db", "memory://", "--listen", f"127.0.0.1:{port}",
             "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file", str(secret),
             "--rate-limit", "0", "--max-requests-per-source", "0"],  # one source at full speed: no 429s
            env=env,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            instance_id = json.loads(wait_for(url + "/metadata"))["id"]
            bench = Bench(workdir, url, secret, instance_id, env)
            for name in chosen:
                with DATAPATHS[name](bench) as target:
                    expected = wait_for(bench.serve_url + args.path)
                    if wait_for(target.url + args.path) != expected:
                        print(f"{name} answers {args.path} differently from direct", file=sys.stderr)
                        return 1
                    results[name] = {
                        "latency": run_wrk(target.url + args.path, args.duration, 1, 1, prefix=target.prefix),
                        "throughput": run_wrk(target.url + args.path, args.duration, args.connections, args.threads,
                                              prefix=target.prefix),
                    }
                show(name, results)
        finally:
            stop(serve)
    write_results(args, results)
    return 0


def show(name: str, results: dict[str, dict[str, dict[str, float]]]) -> None:
    """Print one datapath's figures with its ratios against direct."""
    base = results["direct"]
    for mode, r in results[name].items():
        ratio = r["rps"] / base[mode]["rps"]
        print(f"{name:14} {mode:10} {r['rps']:>8.0f} req/s  p50 {r.get('p50', 0):.3f} ms  "
              f"p99 {r.get('p99', 0):.3f} ms  non-2xx {r['non2xx']:.0f}  throughput vs direct {ratio:.3f}")


def write_results(args: argparse.Namespace, results: dict[str, dict[str, dict[str, float]]]) -> None:
    """Replace bench/datapath.md with this run."""
    base = results["direct"]
    lines = [
        "# Datapath benchmark: direct vs the host datapaths",
        "",
        (
            f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {os.cpu_count()} cores, Python "
            f"{platform.python_version()}. Command: `.venv/bin/python bench/datapath.py --duration "
            f"{args.duration} --connections {args.connections} --threads {args.threads} --path {args.path}`."
        ),
        "",
        (
            "One `imds serve --demo` (uvicorn, one process) and, per datapath, what it needs, all on "
            "this machine with wrk: *latency* is one connection (`-c1`), *throughput* is "
            f"`-c{args.connections}`. Ratios are against `direct` in the same run (req/s ratio; "
            "added p50 = datapath p50 - direct p50)."
        ),
        "",
        "| datapath | mode | req/s | p50 ms | p90 ms | p99 ms | non-2xx | req/s vs direct | added p50 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, modes in results.items():
        for mode, r in modes.items():
            ratio = r["rps"] / base[mode]["rps"]
            added = r.get("p50", 0) - base[mode].get("p50", 0)
            lines.append(
                f"| {name} | {mode} | {r['rps']:.0f} | {r.get('p50', 0):.3f} | {r.get('p90', 0):.3f} | "
                f"{r.get('p99', 0):.3f} | {r['non2xx']:.0f} | **{ratio:.3f}** | {added:+.3f} |"
            )
    args.output.write_text("\n".join([*lines, ""]))


if __name__ == "__main__":
    sys.exit(main())
