"""Real guests, every flavor: ``imds lab boot`` for each flavor, identification and network, one table.

Each cell is one boot of the lab's Debian guest (cloud-init 22.4) under QEMU through the agent's
datapath (see docs/lab.md): power-on to the first metadata request, to the hostname on the
console, and to cloud-init's final banner, with the datasource cloud-init chose. A boot takes
about a minute under TCG on 2 cores, so the matrix is a benchmark, not a CI test (CI boots EC2
once: tests/integration/test_lab_boot.py). Needs root, like the lab.

The network axis: ``ipv4`` (the flavor's own route to 169.254.169.254, or each ``--route``
given: Neutron's three ways) and ``ipv6`` (``--ipv6-only``). A cell the lab refuses (exit 2:
OpenStack has no IPv6 metadata address in bookworm's cloud-init 22.4) is listed as refused, not booted.
``--ganeti-install`` boots every cell with it: the guest also installs an OS image onto a second
disk through the Ganeti paths (``install s``: power-on to the console's ``LAB-GANETI exit=0``;
a config drive guest is refused).

Every cell also reads its metadata again after cloud-init finished (``late s``: power-on to the
console's ``LAB-LATE ok``; a boot fails without it). ``--suite`` boots the image built from
another Debian suite (``trixie``: cloud-init 25.1, whose OpenStack datasource asks
``fe80::a9fe:a9fe``, so the OpenStack IPv6-only cell boots there); ``--network-data`` what the
records say of their subnet (``static``, the default, or ``dhcp``); ``--device-tags`` and
``--hotplug`` the device role tags and the NIC and disk attached while the guest runs
(``hotplug s``: attach to both tagged, NIC configured; the flavors that take them); ``--systemd-imds``
the sid guest whose systemd-imds must read every key and import its credentials (an image build and a
boot of 15-20 minutes under TCG, so it is a cell here rather than a CI test).

    .venv/bin/python bench/lab_matrix.py --output bench/results.md
    .venv/bin/python bench/lab_matrix.py --flavor ec2 --flavor nocloud --identify smbios --network ipv6
    .venv/bin/python bench/lab_matrix.py --flavor openstack --identify cmdline --network ipv4 \
        --route gateway --route dhcp --route onlink
    .venv/bin/python bench/lab_matrix.py --flavor ec2 --identify cmdline --network ipv4 --ganeti-install
    .venv/bin/python bench/lab_matrix.py --suite trixie --flavor openstack --identify cmdline --network ipv6
    .venv/bin/python bench/lab_matrix.py --flavor openstack --identify cmdline --network ipv4 --route gateway --hotplug
    .venv/bin/python bench/lab_matrix.py --suite sid --package systemd-imds --systemd-imds --flavor ec2 \
        --identify smbios --network ipv4 --timeout 1500
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAVORS = ("ec2", "openstack", "nocloud", "configdrive")
IDENTIFY = ("cmdline", "smbios")
NETWORKS = ("ipv4", "ipv6")
ROUTES = ("onlink", "dhcp", "gateway")
IMDS = Path(sys.executable).parent / "imds"


def _boot(flavor: str, identify: str, network: tuple[str, str | None], work: Path,
          args: argparse.Namespace) -> dict[str, object]:
    family, route = network
    out = work / "-".join(filter(None, (args.suite, flavor, identify, family, route)))
    command = [str(IMDS), "lab", "boot", "--flavor", flavor, "--identify", identify, "--hostname", f"lab-{flavor}",
               "--out", str(out), "--image-dir", str(args.image_dir), "--timeout", str(args.timeout),
               "--accel", args.accel]
    if family == "ipv6":
        command.append("--ipv6-only")
    if route:
        command += ["--route", route]
    if args.ganeti_install:
        command.append("--ganeti-install")
    command += ["--suite", args.suite, "--network-data", args.network_data]
    if args.device_tags:
        command.append("--device-tags")
    if args.hotplug:
        command.append("--hotplug")
    for package in args.package or ():
        command += ["--package", package]
    if args.systemd_imds:
        command.append("--systemd-imds")
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=args.timeout + 300)
    if done.returncode == 2:
        reason = done.stderr.strip().splitlines()[-1].removeprefix("Error: ")
        return {"refused": reason, "route": route or "", "image": {"suite": args.suite},
                "wall": round(time.monotonic() - started, 1)}
    result_file = out / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {"error": done.stderr[-300:]}
    result["wall"] = round(time.monotonic() - started, 1)
    return result


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def _row(flavor: str, identify: str, family: str, result: dict[str, object]) -> str:
    seconds = result.get("seconds") or {}
    assert isinstance(seconds, dict)  # noqa: S101 - result.json's shape
    requests = result.get("requests") or []
    status = "pass" if result.get("passed") else f"FAIL {result.get('outcome') or result.get('error')}"
    install = result.get("ganeti_install")
    if isinstance(install, dict) and install.get("problems"):
        status = f"FAIL install: {'; '.join(install['problems'])}"
    late = result.get("late_read")
    if isinstance(late, dict) and late.get("line") and not late.get("passed"):
        status = f"FAIL late read: {late['line']}"
    hot = result.get("hotplug")
    if isinstance(hot, dict) and hot.get("problems"):
        status = f"FAIL hotplug: {'; '.join(hot['problems'])}"
    hot_seconds = hot.get("seconds", {}) if isinstance(hot, dict) else {}
    if result.get("refused"):
        status = f"refused: {result['refused']}"
    image = result.get("image") or {}
    assert isinstance(image, dict)  # noqa: S101 - result.json's shape
    cells = [_cell(image.get("suite")), _cell((image.get("cloud_init") or "").split("-")[0]), flavor, identify, family,
             _cell(result.get("route")), _cell(result.get("network_data")), _cell(result.get("accel")),
             _cell(result.get("datasource")),
             _cell(seconds.get("first_metadata_packet")),
             _cell(seconds.get("first_metadata_request")), _cell(seconds.get("hostname")),
             _cell(seconds.get("cloud-init final")), _cell(seconds.get("late read")),
             _cell(seconds.get("ganeti install")),
             _cell(hot_seconds.get("disk tagged")),
             str(len(requests) if isinstance(requests, list) else ""),
             _cell(result.get("wall")), status]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    """Boot every requested cell; print the table and append it to --output."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flavor", action="append", choices=FLAVORS, help="repeatable (default: all)")
    parser.add_argument("--identify", action="append", choices=IDENTIFY, help="repeatable (default: both)")
    parser.add_argument("--network", action="append", choices=NETWORKS, help="repeatable (default: both)")
    parser.add_argument("--route", action="append", choices=ROUTES,
                        help="IPv4 cells: boot once per route given (repeatable; default: the flavor's own)")
    parser.add_argument("--image-dir", type=Path, default=ROOT / ".cache" / "lab", help="the lab's image cache")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "lab-matrix", help="run directories")
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds per boot from power-on")
    parser.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto")
    parser.add_argument("--ganeti-install", action="store_true",
                        help="every guest also installs an OS image onto a second disk through the Ganeti paths")
    parser.add_argument("--suite", choices=("bookworm", "trixie", "sid"), default="bookworm",
                        help="the Debian suite of the guest image")
    parser.add_argument("--network-data", choices=("static", "dhcp"), default="static",
                        help="what the records say of the subnet")
    parser.add_argument("--device-tags", action="store_true", help="a tagged NIC and disk (openstack, configdrive)")
    parser.add_argument("--hotplug", action="store_true", help="a NIC and a disk attached while the guest runs")
    parser.add_argument("--package", action="append", help="an extra Debian package in the image (repeatable)")
    parser.add_argument("--systemd-imds", action="store_true",
                        help="pass only when systemd-imds in the guest read every key and imported its credentials "
                             "(ec2; with --suite sid --package systemd-imds)")
    parser.add_argument("--output", type=Path, default=None, help="append the table to this Markdown file")
    args = parser.parse_args()
    header = ("| suite | cloud-init | flavor | identify | network | route | network_data | accel | datasource "
              "| first packet s | first request s | hostname s | cloud-init final s | late s | install s | hotplug s "
              "| requests | wall s | result |\n" + "|---" * 19 + "|")
    rows = []
    for flavor in args.flavor or FLAVORS:
        for identify in args.identify or IDENTIFY:
            for family in args.network or NETWORKS:
                routes: list[str | None] = [*args.route] if args.route and family == "ipv4" else [None]
                for route in routes:
                    result = _boot(flavor, identify, (family, route), args.work, args)
                    rows.append(_row(flavor, identify, family, result))
                    print(rows[-1], flush=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    command = " ".join(["bench/lab_matrix.py", *sys.argv[1:]])
    table = (f"\n## lab matrix: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
             f"{os.cpu_count()} cores, {platform.python_version()}, load average {load} after. Command: "
             f"`{command}`. Seconds from QEMU power-on; `hostname` is the console first naming the record's "
             f"hostname; `late` the console's `LAB-LATE ok` (the guest read its metadata again after cloud-init "
             f"finished); `install` the console's `LAB-GANETI exit=0` (with `--ganeti-install`); `hotplug` from "
             f"attaching a NIC and a disk to both being tagged (with `--hotplug`); `requests` the "
             f"instance reads imds serve logged.\n\n{header}\n" + "\n".join(rows) + "\n")
    print(table)
    if args.output:
        with args.output.open("a") as sink:
            sink.write(table)


if __name__ == "__main__":
    main()
