"""How fast ``imds import`` loads a fleet into SQLite: N generated instances, then the same file again.

Run on demand (never in CI)::

    .venv/bin/python bench/import_rate.py --count 100000

Each instance has an Equinix-shaped document (hostname, facility, plan, a tag, an SSH key,
network addresses), one IPv4 host address, and a 40-byte cloud-config. The first run
creates every instance; the second must report every one unchanged (and writes nothing).
Prints one JSON line per run: items, seconds, items/s, and the summary line imds printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

IMDS = Path(sys.executable).parent / "imds"


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


def run(source: Path, data_dir: Path) -> tuple[float, str]:
    """``imds import SOURCE`` into ``data_dir``: (wall seconds, imds's summary line)."""
    started = time.monotonic()
    done = subprocess.run(
        [str(IMDS), "import", str(source), "--data-dir", str(data_dir), "--log-level", "warning"],
        capture_output=True, text=True, check=False,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"imds import failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds, done.stdout.splitlines()[0]


def main() -> None:
    """Generate the fleet, import it twice, print one JSON line per run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="imds-bench-import-") as scratch:
        root = Path(scratch)
        source = root / "fleet.jsonl"
        with source.open("w") as out:
            for n in range(options.count):
                out.write(json.dumps(record(n)) + "\n")
        data_dir = root / "data"
        subprocess.run([str(IMDS), "db", "upgrade", "--data-dir", str(data_dir)], check=True, capture_output=True)
        for label in ("first import", "re-run (idempotent)"):
            seconds, summary = run(source, data_dir)
            print(json.dumps({"run": label, "items": options.count, "seconds": round(seconds, 1),
                              "items_per_second": round(options.count / seconds), "summary": summary}))


if __name__ == "__main__":
    main()
