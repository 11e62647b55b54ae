"""Benchmark the admin write path and cross-replica visibility (run on demand, never in CI).

For SQLite and PostgreSQL (started the way ``tests/postgres_server.py`` does) it starts two
``imds serve`` processes on one database, then measures:

* upserts/s through replica A with 1 and 16 concurrent writers (``POST /device-metadata``,
  a new instance with 2 addresses each), driven by wrk (``write_upsert.lua``), with p99 and
  the server's CPU per write;
* the time from A's 200 to the new value served by replica B (``GET /metadata`` from the
  instance's own loopback address), p50/p99 over ``--samples`` writes.

Appends one JSON line per figure to ``bench/results.jsonl`` and a Markdown table to
``bench/results.md``, with the load average before and after (the figures mean little on a
loaded machine)::

    .venv/bin/python bench/write.py            # 10 s of upserts per setting, 200 visibility samples
    .venv/bin/python bench/write.py --quick    # 3 s and 40: a smoke run in about a minute

Targets (issue 12; reported, never asserted): ≥ 2,000 upserts/s on SQLite and ≥ 1,000/s on
PostgreSQL with 16 writers; write → visible on the other replica p99 ≤ 100 ms on PostgreSQL.

Only 127.x addresses are used; every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from postgres_server import _execute, _Server  # noqa: E402 - the tests' helpers, found through sys.path
from serve_process import ADMIN_TOKEN, Server, serving  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from benchlib import cpu_seconds, run_wrk  # noqa: E402

LUA = ROOT / "bench" / "write_upsert.lua"
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def upserts(server: Server, writers: int, duration: int, base: int) -> dict[str, float]:
    """Run wrk with ``writers`` connections, each upserting new instances back to back for ``duration`` s.

    wrk (C, one thread) rather than a Python client: at a few thousand writes a second a
    Python client would take most of a core from the server it measures.
    """
    cpu = cpu_seconds(server.process.pid)
    result = run_wrk(f"{server.url}/", duration, writers, script=(str(LUA), ADMIN_TOKEN, str(base)))
    result["cpu_us"] = (cpu_seconds(server.process.pid) - cpu) / max(result["requests"], 1) * 1e6
    if result["non2xx"]:
        raise SystemExit(f"{result['non2xx']:.0f} upserts were refused: see {server.log}")
    return result


def visibility(a: str, b: str, samples: int) -> list[float]:
    """Milliseconds from A's 200 to B serving the new value, per sample."""
    guest = "127.0.95.3"
    instance_id = str(uuid.uuid4())
    reader = httpx.Client(transport=httpx.HTTPTransport(local_address=guest), timeout=5.0, trust_env=False)
    times = []
    with httpx.Client(headers=HEADERS, timeout=10.0, trust_env=False) as admin, reader:
        for n in range(samples):
            body = {"id": instance_id, "ipAddresses": [guest], "metadata": {"id": instance_id, "write": n}}
            admin.post(f"{a}/device-metadata", json=body).raise_for_status()
            acked = time.monotonic()
            while True:
                answer = reader.get(f"{b}/metadata")
                if answer.status_code == 200 and answer.json().get("write") == n:
                    break
                if time.monotonic() - acked > 30:
                    raise SystemExit(f"replica B never served write {n}")
            times.append((time.monotonic() - acked) * 1000)
    return times


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _common(backend: str, db: str) -> tuple[str, ...]:
    # SQLite has no NOTIFY: followers poll (the default 1 s). PostgreSQL followers are woken
    # by NOTIFY; the poll is only the fallback, so a long one shows what NOTIFY does alone.
    poll = "1" if backend == "sqlite" else "30"
    # wrk writes from one address: lift the per-source in-flight cap.
    return ("--db", db, "--feed-poll-interval", poll, "--max-requests-per-source", "0")


def throughput(backend: str, a: Server, args: argparse.Namespace, tree: str) -> list[dict[str, object]]:
    """Upserts/s through ``a`` with 1 and 16 writers."""
    figures: list[dict[str, object]] = []
    for base, writers in ((0, 1), (50, 16)):
        result = upserts(a, writers, args.duration, base)
        figures.append({"backend": backend, "measure": "upserts_per_s", "writers": writers, "tree": tree,
                        "value": round(result["rps"]), "p99_ms": round(result.get("p99", 0.0), 1),
                        "cpu_us": round(result["cpu_us"])})
    return figures


def run_baseline(backend: str, db: str, tmp: Path, args: argparse.Namespace) -> list[dict[str, object]]:
    """The throughput measure on its own database, imds imported from ``--baseline``."""
    with serving(tmp, *_common(backend, db), source=args.baseline) as a:
        return throughput(backend, a, args, "baseline")


def run(backend: str, db: str, tmp: Path, args: argparse.Namespace) -> list[dict[str, object]]:
    """Both measures on one database shared by two replicas."""
    common = _common(backend, db)
    with serving(tmp, *common) as a:
        # B starts after the throughput runs: on this one machine its catching up after every
        # commit would take CPU from A (and from PostgreSQL), which a replica on its own host does not.
        figures = throughput(backend, a, args, "this")
        with serving(tmp, *common) as b:
            times = visibility(a.url, b.url, args.samples)
            result = upserts(a, 16, args.duration, 75)  # and once more with B following on this machine
            figures.append({"backend": backend, "measure": "upserts_per_s_with_b_following", "writers": 16,
                            "tree": "this", "value": round(result["rps"]), "p99_ms": round(result.get("p99", 0.0), 1),
                            "cpu_us": round(result["cpu_us"])})
    figures.extend({"backend": backend, "measure": f"visible_on_b_p{int(q * 100)}_ms",
                    "value": round(percentile(times, q), 1)} for q in (0.5, 0.99))
    return figures


def against_baseline(figures: list[dict[str, object]]) -> None:
    """Add ``vs_baseline`` (this tree's upserts/s over the baseline's) to this tree's rows."""
    base = {(f["backend"], f["writers"]): f["value"] for f in figures if f.get("tree") == "baseline"}
    for f in figures:
        before = base.get((f["backend"], f.get("writers")))
        if f.get("tree") == "this" and f["measure"] == "upserts_per_s" and isinstance(before, int) and before:
            f["vs_baseline"] = round(int(str(f["value"])) / before, 2)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(args: argparse.Namespace) -> list[dict[str, object]]:
    """Every chosen backend, each on a fresh database."""
    figures: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="imds-bench-write-") as scratch:
        tmp = Path(scratch)
        if "sqlite" in args.backends:
            if args.baseline is not None:
                figures += run_baseline("sqlite", f"sqlite:///{tmp / 'baseline.db'}", tmp, args)
            figures += run("sqlite", f"sqlite:///{tmp / 'bench.db'}", tmp, args)
        if "postgres" in args.backends:
            server = _Server()
            try:
                pg = server.start()
                _execute(pg, 'CREATE DATABASE "bench"')
                if args.baseline is not None:
                    _execute(pg, 'CREATE DATABASE "baseline"')
                    figures += run_baseline("postgres", pg.url("baseline"), tmp, args)
                figures += run("postgres", pg.url("bench"), tmp, args)
            finally:
                server.stop()
    return figures


def record(figures: list[dict[str, object]], context: dict[str, object], command: str) -> None:
    """Append the figures to bench/results.jsonl and a table to bench/results.md; print both."""
    with (ROOT / "bench" / "results.jsonl").open("a") as jsonl:
        for f in figures:
            jsonl.write(json.dumps({**context, **f}) + "\n")
    lines = [
        f"\n## write: {context['at']}\n",
        (
            f"{context['cores']} cores, Python {context['python']}, load average {context['load_before']} before / "
            f"{context['load_after']} after (a shared machine). Command: `{command}`. Upserts through replica A "
            "(`POST /device-metadata`, a new instance with 2 addresses each, wrk with 1 and 16 connections); then "
            "a second replica B on the same database: visibility = from A's 200 to B serving the new value.\n"
        ),
        "| backend | tree | measure | writers | value | vs baseline | target | p99 ms | server CPU µs/write |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    targets: dict[tuple[str, str, object], str] = {
        ("sqlite", "upserts_per_s", 16): "≥ 2000",
        ("postgres", "upserts_per_s", 16): "≥ 1000",
        ("postgres", "visible_on_b_p99_ms", ""): "≤ 100",
    }
    for f in figures:
        writers = f.get("writers", "")
        target = targets.get((str(f["backend"]), str(f["measure"]), writers), "")
        lines.append(f"| {f['backend']} | {f.get('tree', 'this')} | {f['measure']} | {writers} | {f['value']} | "
                     f"{f.get('vs_baseline', '')} | {target} | {f.get('p99_ms', '')} | {f.get('cpu_us', '')} |")
    with (ROOT / "bench" / "results.md").open("a") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Run every backend and record the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds of upserts per writer setting (default 10)")
    parser.add_argument("--samples", type=int, default=200, help="writes timed to the second replica (default 200)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 s per setting, 40 samples")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--baseline", type=Path, metavar="SRC",
                        help="also measure upserts/s with imds imported from another src/ tree (tree 'baseline'), "
                             "on its own database before this tree's run: a before/after ratio from the same run")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.samples = 3, 40
    context: dict[str, object] = {
        "bench": "write", "at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "cores": os.cpu_count(),
        "python": platform.python_version(), "load_before": load_average(),
    }
    figures = measure(args)
    against_baseline(figures)
    context["load_after"] = load_average()
    command = " ".join([".venv/bin/python bench/write.py", *sys.argv[1:]])
    if args.baseline is not None:
        command = command.replace(str(args.baseline), "SRC")
    record(figures, context, command)


if __name__ == "__main__":
    main()
