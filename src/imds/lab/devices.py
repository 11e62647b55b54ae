"""``--device-tags``: Nova's device role tags applied inside a real guest by ``imds guest udev``.

The record gets a ``devices`` list (``meta_data.json``): the boot NIC tagged ``primary`` (by
MAC) and a second, empty disk tagged ``labdata`` (by its virtio serial, which QEMU sets). The
userdata gets one more script part carrying the guest tool's zipapp (as ``--ganeti-install``
ships it) and a watcher, started with ``systemd-run`` once cloud-init has finished. Every few
seconds, for a bounded time, the watcher runs ``imds-guest udev`` (from the metadata service, or
``--config-drive auto`` for a config drive guest) and prints what the tags became, one
``LAB-DEVICES`` line per device, when it changes::

    LAB-DEVICES nic 52:54:00:12:34:56 eth0 tag=primary addr=10.231.0.10/24
    LAB-DEVICES disk labdata vdc
    LAB-DEVICES gone disk hotdisk vdd

A NIC's ``tag`` is its udev property ``IMDS_TAG`` (``udevadm info``), its ``addr`` what ``ip``
shows; a disk line is a ``/dev/disk/by-tag/TAG`` symlink and the device it points at. So a
device attached later (``--hotplug``) gets its tag after the next read.
"""

from __future__ import annotations

from typing import Any

from imds.lab.ganeti import GUEST_TOOL

CONSOLE = "LAB-DEVICES"
LOG = "LAB-GUESTLOG"  # what the guest's logs say, printed when a hot NIC got no address
SCRIPT = "zw-imds-lab-devices.sh"
WATCHER = "/root/imds-lab-devices.sh"
NIC_TAG = "primary"
DISK_TAG = "labdata"
DISK_SERIAL = "imds-lab-data"
DISK = "disk-tagged.raw"
ROUND = 3  # seconds between two reads
DURATION = 1800  # seconds the watcher keeps reading


def boot_devices(mac: str) -> list[dict[str, Any]]:
    """The ``devices`` of the record at boot: the NIC (by MAC) and the data disk (by serial)."""
    return [{"type": "nic", "bus": "pci", "mac": mac, "tags": [NIC_TAG]},
            {"type": "disk", "bus": "pci", "serial": DISK_SERIAL, "tags": [DISK_TAG]}]


def watcher(source: str) -> str:
    """The guest's watcher: ``imds-guest udev`` with ``source`` arguments each round, changes to the console."""
    return f"""#!/bin/sh
# imds lab --device-tags: apply the device role tags again and again; print each change to the console
i=0
while [ ! -e /run/cloud-init/result.json ] && [ $i -lt 600 ]; do sleep 1; i=$((i+1)); done
report() {{
    for dev in /sys/class/net/*; do
        name=$(basename "$dev")
        [ "$name" = lo ] && continue
        tag=$(udevadm info -q property -p "$dev" 2>/dev/null | sed -n 's/^IMDS_TAG=//p')
        addr=$(ip -o -4 addr show dev "$name" 2>/dev/null | awk '{{print $4; exit}}')
        echo "nic $(cat "$dev/address") $name tag=$tag addr=$addr"
    done
    for link in /dev/disk/by-tag/*; do
        [ -e "$link" ] && echo "disk $(basename "$link") $(basename "$(readlink -f "$link")")"
    done
}}
: > /run/imds-lab-devices.state
waited=0
end=$(( $(date +%s) + {DURATION} ))
while [ "$(date +%s)" -lt "$end" ]; do
    python3 {GUEST_TOOL} udev {source} > /run/imds-lab-devices.udev 2>&1
    udevadm settle --timeout=10
    report | sort > /run/imds-lab-devices.now
    comm -13 /run/imds-lab-devices.state /run/imds-lab-devices.now | sed 's/^/{CONSOLE} /' > /dev/ttyS0
    comm -23 /run/imds-lab-devices.state /run/imds-lab-devices.now | sed 's/^/{CONSOLE} gone /' > /dev/ttyS0
    mv /run/imds-lab-devices.now /run/imds-lab-devices.state
    # A NIC still without an address after 8 rounds: what cloud-init's hotplug hook said, once.
    if grep -q "addr=$" /run/imds-lab-devices.state; then waited=$((waited+1)); else waited=0; fi
    if [ "$waited" = 8 ]; then
        {{ journalctl -u cloud-init-hotplugd --no-pager -n 40 2>&1
           grep -a -i "hotplug" /var/log/cloud-init.log | tail -n 40
           ls /etc/udev/rules.d; }} | sed 's/^/{LOG} /' > /dev/ttyS0
    fi
    sleep {ROUND}
done
"""


def devices_script(tool: bytes, source: str) -> str:
    """The userdata part: the zipapp, the watcher, and ``systemd-run`` to start it (it outlives cloud-final)."""
    import base64  # noqa: PLC0415 - only here

    end, tool_end = "IMDS_LAB_DEVICES", "IMDS_GUEST_PYZ"
    return (
        "#!/bin/sh\n"
        "# imds lab --device-tags: the guest tool and a watcher applying the device role tags (imds.lab.devices)\n"
        f"[ -s {GUEST_TOOL} ] || base64 -d > {GUEST_TOOL} <<'{tool_end}'\n"
        f"{base64.encodebytes(tool).decode()}{tool_end}\n"
        f"cat > {WATCHER} <<'{end}'\n{watcher(source)}{end}\n"
        f"systemd-run --no-block --unit=imds-lab-devices sh {WATCHER} || (setsid sh {WATCHER} &)\n"
    )


def source(*, config_drive: bool, metadata_url: str) -> str:
    """Where the guest's ``imds-guest udev`` reads the tags: the config drive, or the metadata service."""
    return "--config-drive auto" if config_drive else f"--metadata-url {metadata_url}"


def expected(mac: str) -> tuple[tuple[str, str], ...]:
    """The console lines a passing ``--device-tags`` boot shows: the NIC with its tag, the disk's link."""
    return ((f"nic {mac.lower()} ", f"tag={NIC_TAG} "), (f"disk {DISK_TAG} ", ""))
