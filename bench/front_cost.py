"""The ``front`` benchmark: CPU time of the instance front per request, in process, no server.

Drives the ASGI app (``build_app`` with the demo instance, in-memory store) directly with
prebuilt scopes: what imds itself spends per request (routing, caller resolution,
rendering from cache, metrics), without the HTTP server, sockets or wrk. That is the part
``imds`` code changes can move, and CPU time (``time.process_time``) is far less disturbed
by a loaded machine than requests/s. With ``--baseline SRC`` the same is measured with imds
imported from another source tree (e.g. a copy of main's ``src/``), the two alternating
in fresh processes, and the ratio printed; the best (lowest) repetition of each counts.

Run on demand (never in CI)::

    .venv/bin/python bench/front_cost.py --repeat 5 --baseline /tmp/main-src

Appends to ``bench/results.jsonl`` and ``bench/results.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("/metadata", "/latest/meta-data/instance-id", "/openstack/latest/meta_data.json", "/nope-unknown-route")
CALLER = ("127.0.0.1", 40000)  # the demo instance's address
STRANGER = ("192.0.2.77", 40000)  # nobody: a 404 after the catalog misses
TOKEN_HEADER = b"x-aws-ec2-metadata-token"  # IMDSv2: never remembered, the whole way
GOOGLE = ("/computeMetadata/v1/instance/hostname", [(b"metadata-flavor", b"Google")])  # GCE: its header, likewise


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _measure(
    app: Any, path: str, client: tuple[str, int], count: int, headers: list[tuple[bytes, bytes]] | None = None,
) -> tuple[float, int]:
    """µs of CPU per request over ``count`` GETs of ``path`` from ``client`` (with ``headers``); the status answered."""
    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"host", b"169.254.169.254"), (b"user-agent", b"bench"), *(headers or [])], "client": client,
             "server": ("127.0.0.1", 80)}
    for _ in range(min(count, 500)):  # warm the render cache and the interpreter's caches
        await app(dict(scope), _receive, send)
    started = time.process_time()
    for _ in range(count):
        await app(dict(scope), _receive, send)
    return (time.process_time() - started) / count * 1e6, status


async def _child(count: int) -> dict[str, dict[str, float]]:
    from imds.app import build_app  # noqa: PLC0415 - imported from the tree PYTHONPATH names
    from imds.config import Settings  # noqa: PLC0415
    from imds.services.demo import load_demo  # noqa: PLC0415

    app = build_app(Settings.of(db="memory://", rate_limit=0.0, admin_token="bench-token"))  # noqa: S106
    results: dict[str, dict[str, float]] = {}
    async with app.services.running():
        instance_id, _ = await load_demo(app.services.records)
        for path in PATHS:
            us, status = await _measure(app, path, CALLER, count)
            results[path] = {"us": us, "status": status}
        us, status = await _measure(app, "/metadata", STRANGER, count)
        results["/metadata (unknown caller)"] = {"us": us, "status": status}
        token = app.services.tokens.issue(instance_id, 21600).encode()
        us, status = await _measure(app, PATHS[1], CALLER, count, [(TOKEN_HEADER, token)])
        results[f"{PATHS[1]} (IMDSv2 token)"] = {"us": us, "status": status}
        us, status = await _measure(app, GOOGLE[0], CALLER, count, GOOGLE[1])
        results[f"{GOOGLE[0]} (Metadata-Flavor)"] = {"us": us, "status": status}
        results["EC2 version root of a new instance (identity signatures)"] = {"us": _signing(app), "status": 200}
    return results


def _signing(app: Any, count: int = 100) -> float:
    """µs of CPU per EC2 version root rendered for an instance seen for the first time (a boot: signed then)."""
    from imds.models import Instance  # noqa: PLC0415 - imported from the tree PYTHONPATH names
    from imds.services.render.ec2 import version_root  # noqa: PLC0415

    document = json.loads((ROOT / "src" / "imds" / "demo" / "metadata.json").read_text())
    fresh = [Instance(f"i-{n:05d}", metadata={**document, "id": f"i-{n:05d}"}) for n in range(count)]
    started = time.process_time()
    for instance in fresh:
        version_root(instance, "2021-03-23", app.services.signer)
    return (time.process_time() - started) / count * 1e6


def run_tree(source: Path | None, count: int) -> dict[str, dict[str, float]]:
    """One fresh process measuring imds from ``source`` (None: this checkout)."""
    env = {**os.environ, "IMDS_LOG_LEVEL": "error"}
    if source is not None:
        env["PYTHONPATH"] = str(source)
    out = subprocess.run([sys.executable, __file__, "--child", "--count", str(count)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> int:
    """Alternate this tree and the baseline; print the best CPU µs/request of each and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000, help="requests per path and repetition")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", type=Path, metavar="SRC", help="another src/ tree to compare with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results.md")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args.count))))
        return 0
    trees: dict[str, Path | None] = {"this": None}
    if args.baseline is not None:
        trees["baseline"] = args.baseline
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    best: dict[str, dict[str, float]] = {name: {} for name in trees}
    statuses: dict[str, dict[str, float]] = {name: {} for name in trees}
    for repetition in range(args.repeat):
        for name, source in trees.items():
            for path, found in run_tree(source, args.count).items():
                best[name][path] = min(best[name].get(path, float("inf")), found["us"])
                statuses[name][path] = found["status"]
            print(f"#{repetition + 1} {name}: " + ", ".join(f"{p} {v:.1f}" for p, v in best[name].items()))
    for path in best["this"]:
        if statuses["baseline" if args.baseline else "this"][path] != statuses["this"][path]:
            print(f"the trees answer {path} differently", file=sys.stderr)
            return 1
    write_results(args, best, statuses["this"], load_before)
    return 0


def write_results(
    args: argparse.Namespace, best: dict[str, dict[str, float]], statuses: dict[str, float], load_before: list[str]
) -> None:
    """Print and append the table (and JSON lines)."""
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    lines = ["", f"## front (in-process CPU per request): {stamp}", "",
             (f"{os.cpu_count()} cores, Python {platform.python_version()}, load average {' '.join(load_before)} "
              f"before / {' '.join(load_after)} after. Command: `.venv/bin/python bench/front_cost.py --count "
              f"{args.count} --repeat {args.repeat}{' --baseline SRC' if args.baseline else ''}`. Best of "
              f"{args.repeat} fresh processes each, alternating; no server (ASGI called directly)."),
             "", "| path | status | this µs/req | baseline µs/req | this/baseline |", "|---|---|---|---|---|"]
    rows = []
    for path, us in best["this"].items():
        base = best.get("baseline", {}).get(path)
        ratio = us / base if base else None
        rows.append({"bench": "front", "at": stamp, "path": path, "status": statuses[path], "us": round(us, 2),
                     "baseline_us": round(base, 2) if base else None, "ratio": round(ratio, 3) if ratio else None,
                     "load_before": load_before, "load_after": load_after})
        lines.append(f"| `{path}` | {statuses[path]:.0f} | {us:.1f} | {f'{base:.1f}' if base else '-'} | "
                     f"{f'**{ratio:.3f}**' if ratio else '-'} |")
    print("\n".join(lines))
    with args.output.with_suffix(".jsonl").open("a") as jsonl:
        for row in rows:
            jsonl.write(json.dumps(row) + "\n")
    with args.output.open("a") as markdown:
        markdown.write("\n".join([*lines, ""]))


if __name__ == "__main__":
    sys.exit(main())
