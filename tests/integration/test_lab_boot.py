"""One real guest: ``imds lab boot`` boots a Debian VM under QEMU through the agent's datapath.

The guest image is built from Debian packages once and cached in the repository's
``.cache/lab`` (gitignored), keyed by its recipe, so later runs reuse it. The boot is OpenStack
over IPv4: the guest's tap is plugged into userspace OVS the way os-vif plugs a Nova port,
dnsmasq gives it an address and the route to 169.254.169.254 via the DHCP port (as Neutron's
DHCP agent), and cloud-init's OpenStack datasource reads its record through ``imds agent``'s
haproxy from the lab's own ``imds serve``, then applies the *static* network imds derived from
the record (``network_data.json``), which drops the DHCP lease. The guest must still read its
metadata after cloud-init finished (the late read): the derived network carries the route
itself. The serial console is the witness: the hostname from the record, the userdata's
marker and the late read's ``LAB-LATE ok`` must appear on it. Afterwards nothing the run made
may be left.

The same boot also installs through the Ganeti paths (``--ganeti-install``, a few seconds more):
the guest writes the lab's ext4 image onto its second disk with the guest tool's zipapp, the
events and the OS record's mode come back, and the disk file holds the instance id afterwards.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from imds.lab.run import tool_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1000)]

REPO = Path(__file__).parents[2]
CACHE = REPO / ".cache" / "lab"
IMDS = Path(sys.executable).parent / "imds"
HOSTNAME = "lab-os-guest"


def _leftovers(tag: str) -> list[str]:
    """Namespaces, links, processes and temporary paths of the run tagged ``tag`` still present.

    Only this run's: other sessions' lab runs may start and end on the same host meanwhile.
    """
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    found = [line for line in netns.splitlines() if line.startswith("imdslab-")]
    found += [line.split(":")[1].strip() for line in links.splitlines() if line.split(":")[1].strip()[:3] in
              ("lbi", "lbm", "ltm", "ldh", "lrt", "lvm")]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    found += [line.split()[2] for line in ps.splitlines() if line.startswith("qemu-system-x86_64 -name imds-lab-")]
    mine = [name for name in found if re.search(rf"(?<![0-9a-f]){tag}(?![0-9a-f])", name)]
    made = Path("/tmp").glob(f"imdslab-{tag}[-.]*")  # noqa: S108 - the switch's directory and the QMP socket
    return mine + [str(path) for path in made]


def test_openstack_guest_reads_its_metadata_late_through_the_derived_static_network(tmp_path: Path) -> None:
    """cloud-init picks OpenStack, applies the derived static network, and the guest still reads metadata after."""
    out = tmp_path / "run"
    done = subprocess.run(
        [str(IMDS), "lab", "boot", "--flavor", "openstack", "--hostname", HOSTNAME, "--out", str(out),
         "--image-dir", str(CACHE), "--timeout", "600", "--ganeti-install"],
        capture_output=True, text=True, timeout=900, check=False, cwd=REPO,
    )
    serial = (out / "serial.log").read_text(errors="replace") if (out / "serial.log").exists() else ""
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n--- serial ---\n{serial[-4000:]}"
    result = json.loads((out / "result.json").read_text())

    assert f"LAB-MARKER host={HOSTNAME}" in serial
    assert "Datasource DataSourceOpenStackLocal" in serial
    assert result["passed"] is True
    assert result["datasource"] == "DataSourceOpenStackLocal"  # OpenStack identified from SMBIOS: init-local
    assert result["hostname_seen"] is True
    assert result["accel"] in ("kvm", "tcg")
    if result["accel"] == "tcg" and Path("/dev/kvm").exists():
        assert result["kvm_failure"]  # KVM was tried first and given up for a reason
    assert (result["route"], result["network_data"]) == ("dhcp", "static")

    requests = result["requests"]
    paths = [r["path"] for r in requests]
    derived = [p for p in paths if p.startswith("/openstack/") and p.endswith("/network_data.json")]
    assert derived  # cloud-init read the derived network ...
    # ... applied it (eth0 static, the lease gone) with the route imds put in it: via the DHCP port.
    assert re.search(r"ci-info: \|\s+\d+\s+\|\s+169\.254\.169\.254\s+\|\s+10\.231\.0\.1\s+\|", serial), serial[-3000:]
    # The late read: after cloud-init finished, the guest read its own meta_data.json over the network.
    assert "LAB-LATE ok http://169.254.169.254/openstack/latest/meta_data.json" in serial
    assert result["late_read"]["passed"] is True
    late = [r for r in requests if r["path"] == "/openstack/latest/meta_data.json" and r["status"] == 200]
    assert late
    assert any(r["path"].endswith("/user_data") and r["status"] == 200 for r in requests)

    seconds = result["seconds"]
    # runcmd (the marker) runs in cloud-init's final stage, before its closing banner; the late read after it.
    assert 0 < seconds["first_metadata_request"] < seconds["marker"] <= seconds["cloud-init final"]
    assert seconds["cloud-init final"] <= seconds["late read"]
    assert late[-1]["t"] >= seconds["cloud-init final"] - 5  # serve's clock: the late read's request
    # The datapath saw the first packet when serve saw the first request (polled, so within seconds).
    assert abs(seconds["first_metadata_packet"] - seconds["first_metadata_request"]) < 5
    assert result["cleanup_failures"] == []
    assert re.fullmatch(r"[0-9a-f]{4}", result["tag"])
    assert _leftovers(result["tag"]) == []

    # --ganeti-install: the zipapp ran in the guest, imds ended the install, the second disk holds the image.
    assert "LAB-GANETI exit=0" in serial
    install = result["ganeti_install"]
    assert install["passed"] is True, install
    assert install["exit"] == 0
    assert [s for s in install["events"] if s != "image"] == ["started", "succeeded", "mode"]
    assert "image" in install["events"]
    assert install["mode"] == "run"
    assert install["disk_marker"] == f"{result['instance_id']}\n"
    disk = subprocess.run(["debugfs", "-R", "cat /imds-lab-installed", str(out / "disk2.raw")],
                          capture_output=True, text=True, check=True, env=tool_env()).stdout
    assert disk == f"{result['instance_id']}\n"
    assert seconds["marker"] <= seconds["ganeti install"] <= seconds["cloud-init final"]
    ganeti_paths = [p for p in paths if p.startswith("/ganeti/")]
    assert "/ganeti/latest/os/parameters.json" in ganeti_paths
    assert ganeti_paths.count("/ganeti/latest/write") >= 3  # started, image, succeeded
