"""Instance read throughput with 1k and with 1M stored instances, in the same run (issue 12: within 1.1 times).

Run on demand (never in CI)::

    .venv/bin/python bench/read_scale.py                       # 1,000 vs 1,000,000 (databases kept, see --keep)
    .venv/bin/python bench/read_scale.py --counts 1000,100000  # a quicker pair

The databases are the ones ``bench/scale.py`` builds (same generator: Equinix-sized
documents, a 127.x.y.z address per instance), kept under ``--keep`` (default
``/var/tmp/imds-scale-<count>``) and reused, since filling a million takes minutes.

Each database is served by one ``imds serve`` (granian, one worker) with
``--trusted-proxy 127.0.0.1/32``, so that wrk (``-t1 -c64``, one source address) can read
as many instances: ``read_scale.lua`` names a different instance in ``X-Forwarded-For``
on every request. Two access patterns per database:

* **hot 1k**: the first 1,000 instances, the same set in both databases: what the size
  of the store costs a read (index, memory, GC), the issue's 1M-vs-1k comparison;
* **spread**: instances drawn from the whole store, so on 1M most reads miss the
  render cache: what a cold fleet-wide crawl costs.

Prints and appends rps, p50/p99, server CPU µs per read and the ratio to the 1k run of
the same pattern to ``bench/results.md`` and ``bench/results.jsonl``. Every process is
stopped by its PID.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import cpu_seconds, free_port, run_wrk
from scale import generate, loopback, rss_mib, serve, wait_ready

BENCH = Path(__file__).parent
LUA = BENCH / "read_scale.lua"
RESULTS = BENCH / "results.md"
HOT = 1000


def measure(data_dir: Path, count: int, duration: int) -> list[dict[str, Any]]:
    """Serve ``data_dir`` and load it with both access patterns."""
    port = free_port()
    log = data_dir.parent / "read-scale-serve.log"
    flags = ("--trusted-proxy", "127.0.0.1/32", "--rate-limit", "0", "--max-requests-per-source", "0",
             "--workers", "1", "--log-level", "warning")
    rows = []
    with serve(data_dir, port, log, *flags) as proc:
        wait_ready(proc, port, log)
        for pattern, span in (("hot 1k", min(HOT, count)), ("spread", count)):
            check_reads_as_named_instance(port, span)
            cpu = cpu_seconds(proc.pid)
            result = run_wrk(f"http://127.0.0.1:{port}/metadata", duration, 64, script=(str(LUA), str(span)))
            result["cpu_us"] = (cpu_seconds(proc.pid) - cpu) / max(result["requests"], 1) * 1e6
            rows.append({"bench": "read_scale", "instances": count, "pattern": pattern, "span": span,
                         "rps": round(result["rps"]), "p50_ms": round(result.get("p50", 0.0), 2),
                         "p99_ms": round(result.get("p99", 0.0), 2), "cpu_us": round(result["cpu_us"], 1),
                         "non2xx": int(result["non2xx"]), "rss_mib": round(rss_mib(proc.pid))})
    return rows


def check_reads_as_named_instance(port: int, span: int) -> None:
    """The forwarded address reads that instance's own document (the load measures real reads)."""
    n = span - 1
    status, body = get_forwarded(port, loopback(n))
    if status != 200 or json.loads(body)["hostname"] != f"node-{n}.example":
        raise SystemExit(f"reading as instance {n} through X-Forwarded-For gave {status}: {body[:200]!r}")


def get_forwarded(port: int, address: str) -> tuple[int, bytes]:
    """GET /metadata from 127.0.0.1 (the trusted proxy) on behalf of ``address``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metadata", headers={"X-Forwarded-For": address})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def record(rows: list[dict[str, Any]], context: dict[str, Any], command: str) -> None:
    """Ratios against the smallest count's run of the same pattern; JSON lines and a Markdown table."""
    smallest = min(row["instances"] for row in rows)
    base = {row["pattern"]: row["rps"] for row in rows if row["instances"] == smallest}
    lines = [
        f"\n## read at scale: {context['at']}\n",
        (f"{context['cores']} cores, Python {context['python']}, load average {context['load_before']} before / "
        f"{context['load_after']} after. Command: `{command}`. `imds serve` (granian, 1 worker) on SQLite, "
        "`wrk -t1 -c64` on `/metadata` through `--trusted-proxy 127.0.0.1/32`, each request naming an "
        "instance in `X-Forwarded-For` (*hot 1k*: the first 1,000 instances in every store; *spread*: "
        "the whole store). Target (issue 12): 1M within 1.1 times 1k (ratio ≥ 0.91).\n"),
        "| instances | pattern | req/s | ÷ smallest store | p50 ms | p99 ms | cpu µs/read | non-2xx | RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with (BENCH / "results.jsonl").open("a") as jsonl:
        for row in rows:
            row["ratio"] = round(row["rps"] / base[row["pattern"]], 3)
            jsonl.write(json.dumps({**context, **row}) + "\n")
            lines.append(f"| {row['instances']:,} | {row['pattern']} | {row['rps']} | **{row['ratio']}** | "
                         f"{row['p50_ms']} | {row['p99_ms']} | {row['cpu_us']} | {row['non2xx']} | {row['rss_mib']} |")
    with RESULTS.open("a") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Build or reuse each store, measure it, record the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,1000000", help="comma-separated store sizes (default 1000,1000000)")
    parser.add_argument("--duration", type=int, default=10, help="seconds of wrk per store and pattern")
    parser.add_argument("--keep", default="/var/tmp/imds-scale-{count}",  # noqa: S108 - a benchmark's own cache
                        help="where each store is kept and reused ({count} is replaced)")
    options = parser.parse_args()
    context: dict[str, Any] = {
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
        "python": platform.python_version(), "load_before": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }
    rows: list[dict[str, Any]] = []
    for count in (int(c) for c in options.counts.split(",")):
        root = Path(options.keep.format(count=count))
        data_dir = root / "data"
        if not data_dir.exists():
            root.mkdir(parents=True, exist_ok=True)
            print(f"filling {count:,} instances into {data_dir} (kept for next time)")
            generate(data_dir, count)
        rows += measure(data_dir, count, options.duration)
    context["load_after"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    record(rows, context, " ".join([".venv/bin/python bench/read_scale.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
