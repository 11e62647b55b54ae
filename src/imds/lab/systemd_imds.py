"""``imds lab boot --systemd-imds``: systemd's own IMDS client, in a real guest, reads every key it knows from imds.

systemd-imds (systemd 261+; Debian's package ``systemd-imds``, in sid) finds the platform from
SMBIOS through hwdb (``hwdb.d/40-imds.hwdb``): for EC2 the BIOS vendor ``Amazon EC2``, which the
lab sets (``-smbios type=0,vendor=Amazon EC2``) beside the system fields cloud-init reads. Its
generator then pulls in ``systemd-imdsd.socket`` and, outside the initrd only when the kernel
command line says ``systemd.imds.import=1`` (the lab's does), ``systemd-imds-import.service``:
early in the boot ``systemd-imds --import`` asks imds (through the datapath, as every guest request
goes) for a token, the public addresses, the hostname, the SSH key and the userdata, and
writes the credentials ``firstboot.hostname`` and ``ssh.authorized_keys.root`` into
``/run/credstore``.

The record gets what every EC2 key needs (a public IPv4 and IPv6 address beside the private
one), and the userdata one more shell-script part (sorted before the lab's marker script) that
prints, on the console, ``LAB-SYSTEMD-IMDS`` lines: how the import service ended, each
well-known key read again with ``systemd-imds --cache=no --well-known=KEY`` (its exit status,
size, SHA-256 and, but for the userdata, the value in base64), and each credential's content.

The run passes only if every key was read (exit 0) with the value the record holds, the two
credentials hold the hostname and the SSH key, the import service succeeded, and serve's log
shows the token ``PUT`` and a 200 for each key's path (so the values came from imds, not a
cache): ``verdict``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from typing import Any

CONSOLE = "LAB-SYSTEMD-IMDS"
SCRIPT = "zx-imds-lab-systemd-imds.sh"  # cloud-init runs user scripts sorted by name: before the marker script
BIOS_VENDOR = "type=0,vendor=Amazon EC2"  # hwdb's dmi:bvnAmazonEC2:* (the modalias drops the space)
# The generator pulls systemd-imds-import.service in by default only in the initrd (systemd-imds-generator(8):
# "Defaults to true in the initrd, and false otherwise"); the lab's initrd has no network, so the booted system asks.
KERNEL_ARGS = ("systemd.imds.import=1",)
PUBLIC_IPV4 = "198.51.100.7"  # documentation ranges: the values are read, never routed
PUBLIC_IPV6 = "2001:db8:ec2::7"
KEYS = {  # systemd's EC2 entry: well-known key → the path under /latest
    "hostname": "/meta-data/hostname",
    "region": "/meta-data/placement/region",
    "zone": "/meta-data/placement/availability-zone",
    "ipv4-public": "/meta-data/public-ipv4",
    "ipv6-public": "/meta-data/ipv6",
    "ssh-key": "/meta-data/public-keys/0/openssh-key",
    "userdata": "/user-data",
}
CREDENTIALS = ("firstboot.hostname", "ssh.authorized_keys.root")
TOKEN_PATH = "/latest/api/token"  # noqa: S105 - a path, not a secret
TOOL = "/usr/lib/systemd/systemd-imds"  # where Debian's package puts the tool (not on PATH)


def public_addresses() -> list[dict[str, Any]]:
    """What the record adds to ``network.addresses`` so that systemd's public IPv4 and IPv6 keys exist."""
    return [{"address": PUBLIC_IPV4, "address_family": 4, "public": True},
            {"address": PUBLIC_IPV6, "address_family": 6, "public": True}]


def guest_script() -> str:
    """The userdata part: what systemd-imds read, one console line per key and credential."""
    keys = " ".join(KEYS)
    credentials = " ".join(CREDENTIALS)
    return (
        "#!/bin/sh\n"
        "# imds lab --systemd-imds: what systemd-imds read from imds in this guest\n"
        f'say() {{ echo "{CONSOLE} $*" >> /dev/ttyS0; }}\n'
        f"if [ ! -x {TOOL} ]; then say missing; exit 0; fi\n"
        'say "import=$(systemctl show -P Result systemd-imds-import.service)'
        ' state=$(systemctl show -P ActiveState systemd-imds-import.service)"\n'
        f'say "summary=$({TOOL} 2>&1 | base64 -w0)"\n'
        # What the journal says of the IMDS units (why an import did not run, say): for result.json.
        'say "journal=$(journalctl -b --no-pager -o short-monotonic 2>&1'
        " | grep -i -E 'imds|ordering cycle|to break|credstore' | tail -40 | base64 -w0)\"\n"
        'say "units=$( (systemctl show -p LoadState -p ActiveState -p Result -p ConditionResult -p NeedDaemonReload'
        ' -p InactiveEnterTimestampMonotonic -p WantedBy -p RequiredBy systemd-imds-import.service;'
        ' ls -l /run/systemd/generator.early/*.wants/; systemctl list-jobs --no-pager)'
        ' 2>&1 | tail -40 | base64 -w0)"\n'
        f"for key in {keys}; do\n"
        f'  {TOOL} --cache=no --well-known="$key" > /tmp/imds-lab-value 2> /tmp/imds-lab-error\n'
        "  rc=$?\n"
        '  value=$(base64 -w0 < /tmp/imds-lab-value)\n'
        '  [ "$key" = userdata ] && value=-\n'
        '  say "key=$key rc=$rc size=$(stat -c %s /tmp/imds-lab-value)'
        ' sha256=$(sha256sum < /tmp/imds-lab-value | cut -d" " -f1) value=$value'
        ' error=$(head -c 300 /tmp/imds-lab-error | base64 -w0)"\n'
        "done\n"
        f"for name in {credentials}; do\n"
        '  if [ -f "/run/credstore/$name" ]; then say "credential=$name value=$(base64 -w0 < "/run/credstore/$name")"\n'
        '  else say "credential=$name missing"; fi\n'
        "done\n"
        "say done\n"
    )


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)


def _text(encoded: str) -> str:
    try:
        return base64.b64decode(encoded).decode("utf-8", "replace")
    except ValueError:
        return ""


def read_console(lines: Iterable[str]) -> dict[str, Any]:
    """The probe's console lines → import, summary, keys (rc, size, sha256, value) and credentials."""
    found: dict[str, Any] = {"keys": {}, "credentials": {}, "done": False, "missing": False}
    for raw in lines:
        start = raw.find(CONSOLE + " ")
        if start < 0:
            continue
        line = raw[start:].strip()
        fields = _fields(line)
        if line == f"{CONSOLE} done":
            found["done"] = True
        elif line == f"{CONSOLE} missing":
            found["missing"] = True
        elif "import" in fields:
            found["import"] = {"result": fields["import"], "state": fields.get("state")}
        elif "summary" in fields:
            found["summary"] = _text(fields["summary"])
        elif "journal" in fields or "units" in fields:
            name = "journal" if "journal" in fields else "units"
            found[name] = _text(fields[name]).splitlines()
        elif "key" in fields:
            value = fields.get("value", "-")
            found["keys"][fields["key"]] = {"rc": fields.get("rc"), "size": fields.get("size"),
                                            "sha256": fields.get("sha256"),
                                            "value": None if value == "-" else _text(value),
                                            "error": _text(fields.get("error", ""))}
        elif "credential" in fields:
            found["credentials"][fields["credential"]] = None if line.endswith(" missing") else _text(
                fields.get("value", ""))
    return found


def _key_problems(found: dict[str, Any], expected: dict[str, str], userdata: bytes) -> list[str]:
    problems = []
    for key, value in expected.items():
        read = found["keys"].get(key)
        if read is None or read["rc"] != "0":
            problems.append(f"key {key}: not read ({read})")
        elif key == "userdata" and read["sha256"] != hashlib.sha256(userdata).hexdigest():
            problems.append(f"key userdata: {read['size']} bytes, not the record's {len(userdata)}")
        elif key != "userdata" and read["value"] != value:
            problems.append(f"key {key}: {read['value']!r}, not {value!r}")
    wanted = {"firstboot.hostname": expected["hostname"], "ssh.authorized_keys.root": expected["ssh-key"]}
    for name, value in wanted.items():
        held = found["credentials"].get(name)
        if held is None or held.strip() != value:
            problems.append(f"credential {name}: {held!r}, not {value!r}")
    return problems


def verdict(console: Iterable[str], requests: list[dict[str, Any]], expected: dict[str, str],
            userdata: bytes) -> dict[str, Any]:
    """Whether systemd-imds read every key from imds (``expected``: key → value; the userdata by its hash)."""
    found = read_console(console)
    problems = []
    if found["missing"]:
        problems.append("systemd-imds is not in the guest (build the image with --package systemd-imds)")
    elif not found["done"]:
        problems.append("the probe's console lines never finished")
    if found.get("import", {}).get("result") != "success":
        problems.append(f"systemd-imds-import.service: {found.get('import')}")
    problems += _key_problems(found, expected, userdata)
    served = {(r.get("path"), r.get("status")) for r in requests}
    paths = [TOKEN_PATH, *(f"/latest{key}" for key in KEYS.values())]
    problems += [f"serve never answered {path} with 200" for path in paths if (path, 200) not in served]
    return {"passed": not problems, "problems": problems, **found}
