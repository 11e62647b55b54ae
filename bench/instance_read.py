"""The ``read`` benchmark: the instance read path against nginx serving the same bytes.

Starts ``imds serve --demo`` (in-memory store, one worker) once per ``--server`` and nginx
(one worker) on loopback ports, checks that both answer each path (``/metadata``, an EC2
leaf and OpenStack's ``meta_data.json`` by default) with identical bytes, loads each with
``wrk -t1 -c64`` for the same duration, and reports per path and server: requests/s, the
imds/nginx ratio, p50/p99 latency and server CPU per request (utime+stime from
``/proc/<pid>/stat``, worker processes included). Results are appended to
``bench/results.jsonl`` (one JSON line per measurement) and ``bench/results.md`` (a table
per run). ``--profile`` also records the read path of the first server with py-spy under
the same load and saves the collapsed stacks and a top-functions summary under
``bench/profiles/``.

Run on demand (never in CI)::

    apt-get install nginx-light wrk   # once
    .venv/bin/python bench/instance_read.py --duration 5 --repeat 2 --profile

``--boot-storm N`` also runs the boot storm of ``bench/boot_storm.py`` against each imds
server in the same run: N instances in a fresh SQLite store, each crawling the EC2 tree
from its own 127.x.y.z address exactly as Debian's cloud-init does over IMDSv2 (token PUT,
then the recorded GETs with the token, a new connection per request), ``--storm-concurrency``
crawls at a time; request p50/p99/max, requests over 1 s, errors and server CPU per
request, and the clients' own CPU. nginx runs it first, answering every path with
instance 0's bytes and the token PUT with a fixed token: the same client, connections and
kernel, so its figures are the floor this box gives any server. ``--storm-workers N`` runs
each imds server of the storm with ``--workers N`` and nginx with N worker processes.

Every process it starts is stopped by its PID; only loopback addresses are targeted.
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
from datetime import UTC, datetime
from pathlib import Path
from subprocess import Popen

from benchlib import cpu_seconds, free_port, run_wrk, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]
IMDS = Path(sys.executable).with_name("imds")
BASELINE = "baseline"
BUDGET_OVER_WRK = 1024  # more than any --connections used here
START = 90.0  # seconds a server may take to answer its first read (a loaded machine starts slowly)
PATHS = ("/metadata", "/latest/meta-data/instance-id", "/openstack/latest/meta_data.json")
STORM_TOKEN = "storm-token-from-nginx"  # noqa: S105 - what nginx answers the token PUT with in the storm


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
        kind = "application/json" if url_path.endswith(("/metadata", ".json")) else "text/plain"
        locations.append(f"location = {url_path} {{ default_type {kind}; alias {file}; }}")
    return run_nginx(workdir, port, locations)


def start_storm_nginx(workdir: Path, answers: dict[str, tuple[int, bytes]], port: int,
                      workers: int = 1) -> subprocess.Popen[bytes]:
    """Start nginx answering the storm's paths with what imds gave instance 0, and the token PUT with a fixed token.

    A path ending in ``/`` (a listing) is rewritten to its file (nginx's static module
    would look for an index there); a status other than 200 is a bare ``return``.
    """
    www = workdir / "www"
    www.mkdir(parents=True)
    for path in (workdir, www):
        path.chmod(0o755)
    locations = [f'location = /latest/api/token {{ default_type text/plain; return 200 "{STORM_TOKEN}"; }}',
                 f"location /body/ {{ internal; default_type text/plain; alias {www}/; }}"]
    for index, (url_path, (status, body)) in enumerate(answers.items()):
        if status != 200:
            locations.append(f"location = {url_path} {{ return {status}; }}")
            continue
        file = www / f"body-{index}"
        file.write_bytes(body)
        file.chmod(0o644)
        locations.append(f"location = {url_path} {{ rewrite ^ /body/body-{index} last; }}")
    return run_nginx(workdir, port, locations, workers)


def run_nginx(workdir: Path, port: int, locations: list[str], workers: int = 1) -> subprocess.Popen[bytes]:
    """Start nginx (``workers`` worker processes, no access log) on 127.0.0.1:``port`` with ``locations``."""
    scratch = workdir / "scratch"
    conf = workdir / "nginx.conf"
    conf.write_text(f"""
worker_processes {workers};
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
        listen 127.0.0.1:{port} backlog=2048;
        {" ".join(locations)}
    }}
}}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    return subprocess.Popen([nginx, "-p", str(workdir), "-c", str(conf)])


def measure(url: str, pid: int, args: argparse.Namespace) -> dict[str, float]:
    """One wrk run against ``url`` plus the server's CPU time per request over it."""
    before = cpu_seconds(pid)
    result = run_wrk(url, args.duration, args.connections, args.threads)
    result["cpu_us_per_request"] = (cpu_seconds(pid) - before) / max(result["requests"], 1.0) * 1e6
    return result


def same_bytes(path: str, got: bytes, expected: bytes) -> bool:
    """Equal bytes; OpenStack's meta_data.json carries a fresh random_seed each time, so equal length there."""
    if path.endswith("/meta_data.json"):
        return len(got) == len(expected) and b'"random_seed"' in got
    return got == expected


def start_imds(server: str, port: int, source: Path | None = None) -> subprocess.Popen[bytes]:
    """``imds serve --demo`` on ``server`` with one worker, logging warnings only, rate limit off.

    wrk is one source with ``--connections`` connections: the per-source connection budget
    is raised above that (not turned off), so its scans run and their cost is measured.
    ``source``: a ``src`` directory to import imds from instead of this checkout (``--baseline``).
    """
    env = {**os.environ, "IMDS_LOG_LEVEL": "warning"}
    program = [str(IMDS)]
    if source is not None:
        env["PYTHONPATH"] = str(source)
        program = [sys.executable, "-m", "imds"]
    command = [*program, "serve", "--demo", "--db", "memory://", "--listen", f"127.0.0.1:{port}",
               "--server", server, "--workers", "1", "--rate-limit", "0", "--max-requests-per-source", "0"]
    if ((source or ROOT / "src") / "imds" / "cli" / "warden.py").exists():  # a tree with the budget
        command += ["--max-connections-per-source", str(BUDGET_OVER_WRK)]
    return subprocess.Popen(command, env=env)


def start_servers(servers: tuple[str, ...], ports: dict[str, int], baseline: Path | None) -> dict[str, Popen[bytes]]:
    """Each imds server on its port; ``baseline`` runs the first server's kind from the ``baseline`` tree."""
    started = {name: start_imds(name, ports[name]) for name in servers if name != BASELINE}
    if baseline is not None:
        started[BASELINE] = start_imds(servers[0], ports[BASELINE], baseline)
    return started


def _py_spy() -> str:
    """The py-spy executable (PATH, or beside this Python); SystemExit saying how to get it."""
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        sys.exit("--profile needs py-spy: .venv/bin/pip install py-spy")
    return found


def profile(pid: int, url: str, args: argparse.Namespace, name: str) -> Path:
    """py-spy record of ``pid`` while wrk loads ``url``; collapsed stacks plus a summary by function."""
    out_dir = args.output.parent / "profiles"
    out_dir.mkdir(exist_ok=True)
    raw = out_dir / f"read-{name}.collapsed.txt"
    spy = _py_spy()
    recorder = subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--output", str(raw),
         "--duration", str(args.duration + 1), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        run_wrk(url, args.duration, args.connections, args.threads)
    finally:
        recorder.wait(timeout=args.duration + 30)
    summary = out_dir / f"read-{name}.top.txt"
    summary.write_text(summarize(raw))
    return summary


def summarize(collapsed: Path, top: int = 30) -> str:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
    lines = [f"{total} samples", "", "self%  incl%  function (file:line)"]
    for frame, count in sorted(own.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"{100 * count / total:5.1f}  {100 * inclusive[frame] / total:5.1f}  {frame}")
    return "\n".join([*lines, ""])


def load_all(
    bodies: dict[str, bytes], names: tuple[str, ...], ports: dict[str, int], pids: dict[str, int],
    args: argparse.Namespace,
) -> list[dict[str, object]]:
    """Each path, each repetition, each server (nginx first): one measurement row each."""
    rows: list[dict[str, object]] = []
    for path, body in bodies.items():
        for repetition in range(args.repeat):
            nginx_rps = 0.0
            for name in names:
                r = measure(f"http://127.0.0.1:{ports[name]}{path}", pids[name], args)
                nginx_rps = r["rps"] if name == "nginx" else nginx_rps
                ratio = r["rps"] / nginx_rps if nginx_rps else 0.0
                rows.append({"path": path, "bytes": len(body), "server": name, "run": repetition + 1,
                             "ratio": round(ratio, 3), **{k: round(v, 3) for k, v in r.items()}})
                print(f"{path:34} {name:8} #{repetition + 1} {r['rps']:>8.0f} req/s  ratio {ratio:.3f}  "
                      f"p50 {r.get('p50', 0):.2f} ms  p99 {r.get('p99', 0):.2f} ms  "
                      f"cpu {r['cpu_us_per_request']:.1f} us/req  non-2xx {r['non2xx']:.0f}")
    return rows


def _tools_present(*, profile: bool) -> bool:
    """wrk, nginx (and py-spy for --profile) are installed; else say how to get them, before measuring."""
    if profile:
        _py_spy()
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            print(f"{tool} is not installed: apt-get install nginx-light wrk", file=sys.stderr)
            return False
    return True


def main() -> int:
    """Run nginx and each imds server, load them on each path, print and record the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds of load per server, path and repetition")
    parser.add_argument("--repeat", type=int, default=2, help="repetitions per server and path")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--server", action="append", choices=("front", "granian", "uvicorn"),
                        help="imds server to measure (repeatable; default: front and granian)")
    parser.add_argument("--path", action="append", help=f"path to load (repeatable; default: {', '.join(PATHS)})")
    parser.add_argument("--profile", action="store_true", help="also save a py-spy profile of the first server")
    parser.add_argument("--baseline", type=Path, metavar="SRC",
                        help="also measure the first server importing imds from SRC (e.g. a copy of main's src/), "
                             "as server 'baseline': a before/after ratio from the same run")
    parser.add_argument("--boot-storm", type=int, default=0, metavar="N",
                        help="also run a boot storm of N IMDSv2 crawls against each imds server (0: none)")
    parser.add_argument("--storm-concurrency", type=int, default=256, help="crawls at a time in the boot storm")
    parser.add_argument("--storm-clients", type=int, default=2, help="client processes sharing the boot storm")
    parser.add_argument("--storm-workers", type=int, default=1,
                        help="worker processes of each server in the boot storm (imds --workers, nginx's)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results.md")
    args = parser.parse_args()
    if not _tools_present(profile=args.profile):
        return 2
    paths = tuple(args.path or PATHS)
    servers = tuple(args.server or ("front", "granian"))

    load_before = Path("/proc/loadavg").read_text().split()[:3]
    rows: list[dict[str, object]] = []
    profiles: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="imds-bench-") as tmp:
        if args.baseline is not None:  # the same server, imds imported from another source tree
            servers = (*servers, BASELINE)
        ports = {name: free_port() for name in ("nginx", *servers)}
        imds = start_servers(servers, ports, args.baseline)
        nginx = None
        try:
            first = servers[0]
            bodies = {path: wait_for(f"http://127.0.0.1:{ports[first]}{path}", START) for path in paths}
            nginx = start_nginx(Path(tmp), bodies, ports["nginx"])
            pids = {"nginx": nginx.pid, **{name: process.pid for name, process in imds.items()}}
            for path, body in bodies.items():
                for name in ("nginx", *servers):
                    if not same_bytes(path, wait_for(f"http://127.0.0.1:{ports[name]}{path}", START), body):
                        print(f"{name} and {first} disagree on the bytes of {path}", file=sys.stderr)
                        return 1
            print(f"wrk -t{args.threads} -c{args.connections}, {args.duration}s x {args.repeat} per server and path; "
                  f"load average before: {' '.join(load_before)}")
            rows = load_all(bodies, ("nginx", *servers), ports, pids, args)
            if args.profile:
                profiles.append(profile(pids[first], f"http://127.0.0.1:{ports[first]}{paths[0]}", args, first))
                print(f"profile: {profiles[-1]}")
        finally:
            for process in imds.values():
                stop(process)
            if nginx is not None:
                stop(nginx)
        storms = boot_storms(tuple(name for name in servers if name != BASELINE), args, Path(tmp))
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    write_results(args, rows, load_before, load_after, profiles)
    write_storms(args, storms)
    return 0


def boot_storms(servers: tuple[str, ...], args: argparse.Namespace, tmp: Path) -> list[dict[str, object]]:
    """The boot storm of ``bench/boot_storm.py`` (``--boot-storm`` crawls): nginx, then each server, one after another.

    nginx answers every path of the sequence with what the first imds server answered
    instance 0 (status and bytes) and the token PUT with a fixed token: the same requests
    and connections, so its row is the floor of this client and kernel on this box.
    """
    if not args.boot_storm:
        return []
    from boot_storm import SEQUENCE, storm  # noqa: PLC0415 - the storm's generator loads imds's store
    from scale import built_ahead, generate, get, loopback, serve, wait_ready  # noqa: PLC0415

    sequence = json.loads(SEQUENCE.read_text())
    data_dir = tmp / "storm"
    generate(data_dir, args.boot_storm)
    rows: list[dict[str, object]] = []

    def one(name: str, pid: int, port: int) -> None:
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        before = cpu_seconds(pid)
        result = storm(port, args.boot_storm, args.storm_concurrency, sequence, args.storm_clients)
        result["cpu_us_per_request"] = round((cpu_seconds(pid) - before) / result["requests"] * 1e6, 1)
        result["load_before"] = load_before
        result["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
        rows.append({"server": name, **result})
        print(f"boot storm {name:8} {result['crawls']} crawls in {result['total_s']} s: request p50 "
              f"{result['request_p50_ms']} / p99 {result['request_p99_ms']} / max {result['request_max_ms']} ms, "
              f"{result['over_1s']} over 1 s, {result['errors']} errors, server cpu {result['cpu_us_per_request']} "
              f"us/req, client cpu {result['client_cpu_us_per_request']} us/req, load {' '.join(load_before)}; "
              f"slowest 1 % by step: {result['slowest_1pct_by_step']}")

    answers: dict[str, tuple[int, bytes]] = {}
    for name in servers:
        port, log = free_port(), tmp / f"storm-{name}.log"
        with serve(data_dir, port, log, "--server", name, "--imdsv2", "optional", "--log-level", "warning",
                   "--workers", str(args.storm_workers), "--metrics-public") as proc:
            wait_ready(proc, port, log)
            built = built_ahead(port)  # every storm, nginx's too, starts once imds has built what it builds ahead
            print(f"imds ({name}) built {built[0]} instances ahead of their first read in {built[1]:.1f} s")
            if not answers:  # what nginx will answer, from the first server: then nginx goes first
                answers = {f"/{step['path']}": get(port, f"/{step['path']}", loopback(0))
                           for step in sequence if step["method"] == "GET"}
                nginx_port = free_port()
                nginx = start_storm_nginx(tmp / "storm-nginx", answers, nginx_port, args.storm_workers)
                try:
                    wait_for(f"http://127.0.0.1:{nginx_port}/latest/api/token", START)
                    one("nginx", nginx.pid, nginx_port)
                finally:
                    stop(nginx)
            one(name, proc.pid, port)
    return rows


def write_storms(args: argparse.Namespace, storms: list[dict[str, object]]) -> None:
    """Append the boot storms (if any) to bench/results.jsonl and as a table under this run's read table."""
    if not storms:
        return
    with args.output.with_suffix(".jsonl").open("a") as jsonl:
        for row in storms:
            jsonl.write(json.dumps({"bench": "read-boot-storm", **row}) + "\n")
    lines = [
        "",
        (f"Boot storm in the same run: {args.boot_storm:,} IMDSv2 crawls (cloud-init's recorded sequence, a new "
         f"connection per request, each instance from its own 127.x.y.z), {args.storm_concurrency} at a time from "
         f"{args.storm_clients} client processes (uvloop, prebuilt request bytes on bare sockets); imds: SQLite "
         f"store, default limits, `--imdsv2 optional`, `--workers {args.storm_workers}`; nginx: "
         f"{args.storm_workers} worker(s) answering the same paths with instance 0's "
         "bytes and the token PUT with `return 200` (the floor of this client and kernel on this box). "
         "server/client cpu = utime+stime per request; load = load average before / after each storm."),
        "",
        ("| server | crawls | requests | total s | request p50 / p99 / max ms | requests > 1 s | errors "
         "| server cpu µs/req | client cpu µs/req | load before / after |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {row['server']} | {row['crawls']:,} | {row['requests']:,} | {row['total_s']} | "
              f"{row['request_p50_ms']} / {row['request_p99_ms']} / {row['request_max_ms']} | {row['over_1s']} | "
              f"{row['errors']} | {row['cpu_us_per_request']} | {row['client_cpu_us_per_request']} | "
              f"{' '.join(row['load_before'])} / {' '.join(row['load_after'])} |"  # type: ignore[arg-type]
              for row in storms]
    with args.output.open("a") as markdown:
        markdown.write("\n".join([*lines, ""]))


def write_results(
    args: argparse.Namespace, rows: list[dict[str, object]], load_before: list[str], load_after: list[str],
    profiles: list[Path],
) -> None:
    """Append this run to bench/results.jsonl (one line per measurement) and bench/results.md (a table)."""
    nginx_version = subprocess.run(["nginx", "-v"], capture_output=True, text=True, check=False).stderr.strip()
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    context = {"bench": "read", "at": stamp, "cores": os.cpu_count(), "python": platform.python_version(),
               "nginx": nginx_version, "load_before": load_before, "load_after": load_after,
               "wrk": f"-t{args.threads} -c{args.connections} -d{args.duration}s"}
    with args.output.with_suffix(".jsonl").open("a") as jsonl:
        for row in rows:
            jsonl.write(json.dumps({**context, **row}) + "\n")
    command = (f".venv/bin/python bench/instance_read.py --duration {args.duration} --repeat {args.repeat} "
               f"--connections {args.connections} --threads {args.threads}"
               + "".join(f" --server {name}" for name in (args.server or ())) + (" --profile" if args.profile else "")
               + (" --baseline SRC" if args.baseline else "")
               + (f" --boot-storm {args.boot_storm} --storm-concurrency {args.storm_concurrency} "
                  f"--storm-clients {args.storm_clients} --storm-workers {args.storm_workers}"
                  if args.boot_storm else ""))
    lines = [
        "",
        f"## read: {stamp}",
        "",
        (f"{os.cpu_count()} cores, Python {platform.python_version()}, {nginx_version}, load average "
         f"{' '.join(load_before)} before / {' '.join(load_after)} after (a shared machine). Command: `{command}`. "
         "imds: `imds serve --demo --workers 1 --rate-limit 0` per server (`baseline`: the first server with imds "
         "imported from another source tree); nginx: one worker, same bytes, same paths. "
         "cpu = server utime+stime per request."),
        "",
        "| path | bytes | server | run | req/s | imds/nginx | p50 ms | p99 ms | cpu µs/req | non-2xx |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = f"**{row['ratio']:.3f}**" if row["server"] != "nginx" else ""
        lines.append(
            f"| `{row['path']}` | {row['bytes']} | {row['server']} | {row['run']} | {row['rps']:.0f} | {ratio} | "
            f"{row.get('p50', 0):.2f} | {row.get('p99', 0):.2f} | {row['cpu_us_per_request']:.1f} | "
            f"{row['non2xx']:.0f} |"
        )
    lines += [f"\nProfile: [{p.name}](profiles/{p.name})" for p in profiles]
    with args.output.open("a") as markdown:
        markdown.write("\n".join([*lines, ""]))


if __name__ == "__main__":
    sys.exit(main())
