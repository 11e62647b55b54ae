"""The late read: once cloud-init has finished, the guest reads its own metadata again over the network.

cloud-init reads metadata at boot through whatever the DHCP lease said, then applies the
network the datasource describes (``network_data.json``, NoCloud's ``network-config``, the
config drive's) and the lease's routes are gone. Agents, config management and watchers read
later: a guest that cannot is cut off. So every lab boot ships one more userdata part, a
shell script that hands a reader to systemd (``systemd-run``: its own unit, not killed with
``cloud-final``) and returns. The reader waits for ``/run/cloud-init/result.json`` (cloud-init
writes it when its final stage ends), finds the NIC by the record's MAC, reads the flavor's
metadata document from the address the guest has by then (up to five tries, ten seconds
each) and prints to the console either::

    LAB-LATE ok http://169.254.169.254/openstack/latest/meta_data.json try 1

once the answer names the instance id, or ``LAB-LATE failed: curl exit N ...`` followed by
the guest's ``ip route``, ``ip -6 route`` and ``ip addr`` and a closing ``LAB-LATE end``.
A boot passes only with the ``ok`` line.
"""

from __future__ import annotations

from imds.lab.flavors import METADATA_URL, METADATA_URL6, Flavor

CONSOLE = "LAB-LATE"
SCRIPT = "zx-imds-lab-late.sh"  # a user script like the others (cloud-init runs them sorted by name)
READER = "/root/imds-lab-late.sh"
TRIES = 5
WAIT = 600  # seconds the reader waits for cloud-init to finish
OPENSTACK_V6 = "http://[fe80::a9fe:a9fe%25$IFACE]"  # link-local: the zone is the NIC found by its MAC


def late_url(chosen: Flavor, *, ipv6: bool) -> str:
    """What the guest reads late (``$IFACE`` is the NIC's name, found in the guest)."""
    if chosen.name == "nocloud":
        return f"{METADATA_URL6 if ipv6 else METADATA_URL}/nocloud/meta-data"
    if chosen.name == "ec2":
        return f"{METADATA_URL6 if ipv6 else METADATA_URL}/latest/meta-data/instance-id"
    # OpenStack's own IPv6 address, as cloud-init 23+ asks it; a config drive guest reads the same service
    base = OPENSTACK_V6 if ipv6 and chosen.name == "openstack" else METADATA_URL6 if ipv6 else METADATA_URL
    return f"{base}/openstack/latest/meta_data.json"


def reader(url: str, instance_id: str, mac: str, *, token: bool, pause: int = 3) -> str:
    """The reader's shell text (``token``: ask an IMDSv2 token first, as EC2 needs; ``pause``: between tries)."""
    base = url.split("/latest/", 1)[0]
    fetch = (f'TOKEN=$(curl -sS -g --max-time 10 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 300" '
             f'"{base}/latest/api/token")\n'
             f'    body=$(curl -sS -g --max-time 10 -H "X-aws-ec2-metadata-token: $TOKEN" "$URL" 2>&1)'
             if token else 'body=$(curl -sS -g --max-time 10 "$URL" 2>&1)')
    return f"""#!/bin/sh
# imds lab: read this guest's metadata again after cloud-init finished and applied its network
i=0
while [ ! -e /run/cloud-init/result.json ] && [ $i -lt {WAIT} ]; do sleep 1; i=$((i+1)); done
IFACE=""
for dev in /sys/class/net/*; do
    [ "$(cat "$dev/address" 2>/dev/null)" = "{mac.lower()}" ] && IFACE=$(basename "$dev")
done
URL="{url}"
n=0
rc=0
while [ $n -lt {TRIES} ]; do
    n=$((n+1))
    {fetch}
    rc=$?
    case "$body" in *"{instance_id}"*) echo "{CONSOLE} ok $URL try $n" > /dev/ttyS0; exit 0;; esac
    sleep {pause}
done
{{
    echo "{CONSOLE} failed: curl exit $rc reading $URL (NIC $IFACE): $(echo "$body" | head -c 200)"
    echo "--- ip route"; ip route
    echo "--- ip -6 route"; ip -6 route
    echo "--- ip addr"; ip addr
    echo "{CONSOLE} end"
}} > /dev/ttyS0 2>&1
exit 1
"""


def late_script(chosen: Flavor, instance_id: str, mac: str, *, ipv6: bool) -> str:
    """The userdata part: write the reader and hand it to systemd, so it outlives cloud-init's final stage."""
    end = "IMDS_LAB_LATE"
    text = reader(late_url(chosen, ipv6=ipv6), instance_id, mac, token=chosen.name == "ec2")
    return (
        "#!/bin/sh\n"
        "# imds lab: the late read (see imds.lab.late)\n"
        f"cat > {READER} <<'{end}'\n{text}{end}\n"
        f"systemd-run --no-block --unit=imds-lab-late sh {READER} || (setsid sh {READER} &)\n"
    )
