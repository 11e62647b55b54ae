"""A real Debian unstable guest: systemd-imds finds imds from EC2's SMBIOS and reads every key it knows.

``imds lab boot --suite sid --package systemd-imds --systemd-imds`` builds (once, cached in the
repository's ``.cache/lab``) a sid image with cloud-init 26.x and systemd-imds 262.x, boots it
under QEMU through the agent's datapath with EC2's SMBIOS (the BIOS vendor ``Amazon EC2`` that
systemd's hwdb matches) and ``systemd.imds.import=1``, and passes only when, in the guest,
systemd-imds read each of its EC2 keys from imds (its values on the console, each path answered
200 in serve's log: hostname, region, zone, public IPv4, ``meta-data/ipv6``, the SSH key, the
userdata) and its boot-time ``--import`` created the hostname and SSH key credentials. cloud-init
reads the same record on the same boot. Afterwards nothing the run made may be left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

REPO = Path(__file__).parents[2]
CACHE = REPO / ".cache" / "lab"
IMDS = Path(sys.executable).parent / "imds"
HOSTNAME = "sd-imds-guest"


def test_systemd_imds_reads_every_key_and_imports_the_credentials(tmp_path: Path) -> None:
    """The lab's verdict passes: every key read from imds, both credentials imported, cloud-init done."""
    out = tmp_path / "run"
    done = subprocess.run(
        [str(IMDS), "lab", "boot", "--flavor", "ec2", "--suite", "sid", "--package", "systemd-imds",
         "--systemd-imds", "--hostname", HOSTNAME, "--out", str(out), "--image-dir", str(CACHE),
         "--timeout", "1500"],
        capture_output=True, text=True, timeout=2900, check=False, cwd=REPO,
    )
    serial = (out / "serial.log").read_text(errors="replace") if (out / "serial.log").exists() else ""
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    found = result.get("systemd_imds", {})
    assert done.returncode == 0, (f"{done.stderr[-3000:]}\n--- verdict ---\n{json.dumps(found, indent=1)[-4000:]}"
                                  f"\n--- serial ---\n{serial[-3000:]}")
    assert result["passed"] is True
    assert result["image"]["suite"] == "sid"
    assert result["datasource"] == "DataSourceEc2Local"  # cloud-init read the same record
    assert found["passed"] is True, found["problems"]
    assert found["import"] == {"result": "success", "state": "active"}
    assert found["credentials"]["firstboot.hostname"].strip() == HOSTNAME
    assert found["credentials"]["ssh.authorized_keys.root"].strip() == (out / "id_ed25519.pub").read_text().strip()
    assert "Vendor: amazon-ec2" in found["summary"]  # found from SMBIOS, not told
    assert found["keys"]["ipv6-public"]["value"] == "2001:db8:ec2::7"
    served = {(r["path"], r["status"]) for r in result["requests"]}
    assert ("/latest/meta-data/ipv6", 200) in served
    assert not any(status == 403 for _path, status in served)  # a 403 would have ended IMDS for the boot
    assert result["cleanup_failures"] == []
