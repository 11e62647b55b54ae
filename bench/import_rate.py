"""How fast ``imds import`` loads a fleet into SQLite: N generated instances, then the same file again.

Run on demand (never in CI)::

    .venv/bin/python bench/import_rate.py --count 100000
    git archive BASE src | tar -x -C /tmp/base      # the tree to compare with
    .venv/bin/python bench/import_rate.py --count 100000 --baseline /tmp/base/src --markdown bench/results.md

Each instance has an Equinix-shaped document (hostname, facility, plan, a tag, an SSH key,
network addresses), one IPv4 host address, and a 40-byte cloud-config. The first run
creates every instance; the second must report every one unchanged (and writes nothing).
With ``--baseline SRC`` every run is made with this checkout and with imds imported from
SRC, alternately (``--repeat`` rounds, each into a new database), so both meet the same
load on a shared machine; the table gives each tree's best and the ratio. Prints one JSON
line per run: tree, items, seconds, items/s, peak RSS and the summary line imds printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

TIME = "/usr/bin/time"  # GNU time: the peak RSS (%M, KiB) and CPU seconds (%U user, %S system) of what it runs
RUNS = ("first import", "re-run (idempotent)")


def record(n: int) -> dict[str, object]:
    """The n-th generated instance (ids and addresses unique up to 16 million)."""
    instance_id = str(uuid.UUID(int=n + 1, version=4))
    ip = f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
    return {
        "id": instance_id,
        "ipAddresses": [ip],
        "metadata": {
            "id": instance_id, "hostname": f"node-{n}", "facility": "da11", "plan": "c3.small.x86",
            "tags": ["role=worker"], "ssh_keys": [f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{n:032d} ops@example"],
            "network": {"addresses": [{"address": ip, "public": False, "address_family": 4, "cidr": 31}]},
        },
        "userdata": f"#cloud-config\nhostname: node-{n}\n",
        "userdata_encoding": "text",
    }


def run(source: Path, data_dir: Path, tree: Path | None, extra: list[str]) -> dict[str, object]:
    """``imds import SOURCE`` into ``data_dir`` with imds from ``tree`` (None: this checkout): seconds, RSS, summary."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMDS_")}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    report = data_dir.parent / "time.txt"
    command = [sys.executable, "-m", "imds", "import", str(source), "--data-dir", str(data_dir),
               "--log-level", "warning", *extra]
    started = time.monotonic()
    done = subprocess.run([TIME, "-f", "%M %U %S", "-o", str(report), *command], env=env, capture_output=True,
                          text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"imds import failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    peak_kib, user, system = report.read_text().splitlines()[-1].split()
    summary = done.stdout.splitlines()[0]
    return {"seconds": round(seconds, 1), "cpu_seconds": round(float(user) + float(system), 1),
            "peak_rss_mib": round(int(peak_kib) / 1024), "summary": summary}


def markdown(rows: list[dict[str, object]], command: str, load: tuple[str, str]) -> str:
    """The results as a section of ``bench/results.md``: each tree's best run and the ratio."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## import rate (`bench/import_rate.py`): {when}", "",
        (f"{os.cpu_count()} cores, Python {platform.python_version()}, load average {load[0]} before / {load[1]} "
         f"after (a shared machine). Command: `{command}`. `imds import FILE` into a new SQLite data directory "
         "(JSON lines, Equinix-sized documents), then the same file again; `this` is this checkout, `baseline` "
         "imds imported from another tree, alternately; best of the rounds; cpu s is the process's user + system "
         "seconds (on a loaded machine it tells more than wall seconds: a quiet one takes about that long); "
         "peak RSS is GNU time's `%M`."), "",
        ("| run | items | tree | best s | cpu s | items/s | peak RSS MiB | this/baseline s | this/baseline cpu "
         "| imds's summary |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label in RUNS:
        best = {}
        for tree in ("baseline", "this"):
            mine = [r for r in rows if r["run"] == label and r["tree"] == tree]
            if mine:
                best[tree] = min(mine, key=lambda r: float(str(r["seconds"])))
        for tree, r in best.items():
            ratio = cpu_ratio = ""
            if tree == "this" and "baseline" in best:
                base = best["baseline"]
                ratio = f"**{float(str(r['seconds'])) / float(str(base['seconds'])):.2f}**"
                cpu_ratio = f"**{float(str(r['cpu_seconds'])) / float(str(base['cpu_seconds'])):.2f}**"
            lines.append(f"| {label} | {r['items']:,} | {tree} | {r['seconds']} | {r['cpu_seconds']} | "
                         f"{r['items_per_second']} | {r['peak_rss_mib']} | {ratio} | {cpu_ratio} | {r['summary']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Generate the fleet, import it twice per tree and round, print one JSON line per run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1, help="rounds (each tree once per round)")
    parser.add_argument("--baseline", type=Path, metavar="SRC", help="another src/ tree to compare with")
    parser.add_argument("--extra", default="", help="more flags for this checkout's imds import (e.g. --partial)")
    parser.add_argument("--markdown", type=Path, default=None, help="append a table to this file")
    options = parser.parse_args()
    trees: dict[str, Path | None] = {"this": None}
    if options.baseline is not None:
        trees = {"baseline": options.baseline, "this": None}
    before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="imds-bench-import-") as scratch:
        root = Path(scratch)
        source = root / "fleet.jsonl"
        with source.open("w") as out:
            for n in range(options.count):
                out.write(json.dumps(record(n)) + "\n")
        for round_number in range(options.repeat):
            for tree, src in trees.items():
                data_dir = root / f"data-{tree}-{round_number}"
                extra = ["--batch-size", str(options.batch_size)]
                extra += options.extra.split() if tree == "this" else []
                for label in RUNS:
                    figures = run(source, data_dir, src, extra)
                    row = {"run": label, "tree": tree, "items": options.count, **figures,
                           "items_per_second": round(options.count / float(str(figures["seconds"])))}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if options.markdown is not None:
        command = "python bench/import_rate.py " + " ".join(sys.argv[1:])
        with options.markdown.open("a") as out:
            out.write("\n" + markdown(rows, command, (before, after)))


if __name__ == "__main__":
    main()
