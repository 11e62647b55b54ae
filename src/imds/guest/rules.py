"""Matches → the text of a udev rules file.

Per disk, two rules (the partition rule gives ``/dev/disk/by-tag/<tag>-part<N>``)::

    SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ATTRS{serial}=="vol-1", ENV{IMDS_TAG}="db", SYMLINK+="disk/by-tag/db"
    SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", ATTRS{serial}=="vol-1", SYMLINK+="disk/by-tag/db-part%n"

Per NIC, one rule on its MAC, plus ``KERNELS==<address>`` (or ``KERNEL==<name>``) when
another interface or entry shares the MAC; ``DRIVERS=="?*"`` otherwise keeps the tag off
bridges, bonds and VLANs that copy the MAC::

    SUBSYSTEM=="net", ATTR{address}=="01:22:22:42:22:21", KERNELS=="0000:00:02.0", ENV{IMDS_TAG}="nfvfunc1"

A rule has one parent key at most: udev requires every ``KERNELS``/``ATTRS``/``DRIVERS`` of a
rule to match the *same* ancestor, and a disk's serial and its PCI address live on
different ones.

Tags become file names and udev strings, so only ``[0-9A-Za-z#+-.:=@_]`` (the characters
udev itself leaves alone in symlink names) are accepted, ``.`` and ``..`` are not, and a
tag is at most 128 characters; any other tag is skipped and reported. Match values read
from the system are checked the same way (no quotes, backslashes, globs or substitutions);
an unsafe one makes the rule fall back to the next key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from imds.guest.match import Key, Match

HEADER = (
    '# Written by `imds guest udev` from the device role tags in meta_data.json ("devices").\n'
    "# Rewritten on every run: edits here are lost. Tagged devices carry ENV{IMDS_TAG}\n"
    "# (tags separated by spaces); tagged disks also get /dev/disk/by-tag/<tag>.\n"
)
TAG_CHARACTERS = re.compile(r"[0-9A-Za-z#+\-.:=@_]+")
MAX_TAG = 128
IFNAME = re.compile(r"[0-9A-Za-z_.\-]{1,15}")  # IFNAMSIZ - 1, no ':' or '/'
_UNSAFE_VALUE = re.compile(r'["\\*?\[\]|$%]|[^\x20-\x7e]')

_NIC_SECOND_KEY = {"pci": "KERNELS", "xen-vif": "KERNELS", "kernel": "KERNEL"}
_DISK_KEY = {
    "attr-serial": ("ATTRS{serial}", "ATTRS{serial}"),
    "id-serial": ("ENV{ID_SERIAL}", "ENV{ID_SERIAL}"),
    "serial-short": ("ENV{ID_SERIAL_SHORT}", "ENV{ID_SERIAL_SHORT}"),
    "pci": ("KERNELS", "KERNELS"),
    "scsi": ("KERNELS", "KERNELS"),
    "kernel": ("KERNEL", "KERNELS"),  # a partition's parent is the disk
}


@dataclass(frozen=True)
class Rendered:
    """The rules text, the subsystems it covers, and one message per thing left out."""

    text: str
    subsystems: tuple[str, ...]
    skipped: tuple[str, ...]
    tagged: int


def tag_problem(tag: str) -> str | None:
    """Why ``tag`` cannot be used in a udev rule, or None when it can."""
    reason = None
    if any(char.isspace() for char in tag):
        reason = "contains whitespace"
    elif any(char in "\"'`" for char in tag):
        reason = "contains a quote"
    elif "/" in tag or "\\" in tag:
        reason = "contains a slash"
    elif any(char in "$%" for char in tag):
        reason = "contains a udev substitution character ($ or %)"
    elif not TAG_CHARACTERS.fullmatch(tag):
        bad = next(char for char in tag if not TAG_CHARACTERS.fullmatch(char))
        reason = f"contains {bad!r} (allowed: letters, digits and #+-.:=@_)"
    elif tag in (".", ".."):
        reason = "is a relative path component"
    elif len(tag) > MAX_TAG:
        reason = f"is longer than {MAX_TAG} characters"
    return reason


def value_is_safe(value: str) -> bool:
    """Whether ``value`` can sit between quotes in a udev match and mean exactly itself."""
    return bool(value) and not _UNSAFE_VALUE.search(value)


def render(matches: tuple[Match, ...], *, rename_nics: bool = False) -> Rendered:
    """The rules file for ``matches``; with ``rename_nics`` each NIC is also named after its first tag."""
    lines = [HEADER]
    skipped: list[str] = []
    subsystems: set[str] = set()
    names: set[str] = set()
    tagged = 0
    for found in matches:
        tags = _usable_tags(found, skipped)
        if not tags:
            continue
        rules = _disk_rules(found, tags) if found.type == "disk" else _nic_rule(found, tags)
        if rules is None:
            skipped.append(f"{found.type} {found.name}: no identifier of it can be written safely in a udev rule")
            continue
        if found.type == "nic" and rename_nics:
            rules = [_with_name(rules[0], found, tags[0], names, skipped)]
        tags_text = " ".join(tags)
        lines.append(f"\n# {found.type} {found.name} (found by {found.found_by}): {tags_text}\n")
        lines.extend(f"{rule}\n" for rule in rules)
        subsystems.add("block" if found.type == "disk" else "net")
        tagged += 1
    return Rendered("".join(lines), tuple(sorted(subsystems)), tuple(skipped), tagged)


def _usable_tags(found: Match, skipped: list[str]) -> list[str]:
    usable = []
    for tag in found.tags:
        problem = tag_problem(tag)
        if problem is None:
            usable.append(tag)
        else:
            skipped.append(f"{found.type} {found.name}: skipped tag {tag!r}: {problem}")
    return usable


def _nic_rule(found: Match, tags: list[str]) -> list[str] | None:
    mac, *rest = found.keys
    match = ['SUBSYSTEM=="net"', f'ATTR{{address}}=="{mac.value}"']
    if rest:
        if not value_is_safe(rest[0].value):
            return None
        match.append(f'{_NIC_SECOND_KEY[rest[0].kind]}=="{rest[0].value}"')
    elif found.hardware:
        match.append('DRIVERS=="?*"')
    return [", ".join([*match, f'ENV{{IMDS_TAG}}="{" ".join(tags)}"'])]


def _with_name(rule: str, found: Match, name: str, taken: set[str], skipped: list[str]) -> str:
    if not IFNAME.fullmatch(name) or name in (".", ".."):
        skipped.append(f"nic {found.name}: not renamed: tag {name!r} is not an interface name (1-15 of [0-9A-Za-z_.-])")
        return rule
    if name in taken:
        skipped.append(f"nic {found.name}: not renamed: another interface is already named {name!r}")
        return rule
    taken.add(name)
    if found.keys[-1].kind == "kernel" and len(found.keys) > 1:
        # KERNEL=="eth0" must still match after the rename, when `udevadm trigger` replays the event.
        rule = rule.replace(f'KERNEL=="{found.name}"', f'KERNEL=="{found.name}|{name}"')
    return f'{rule}, NAME="{name}"'


def _disk_rules(found: Match, tags: list[str]) -> list[str] | None:
    key = next((key for key in found.keys if value_is_safe(key.value)), None)
    if key is None:
        return None
    disk_key, partition_key = _disk_match(key)
    symlinks = ", ".join(f'SYMLINK+="disk/by-tag/{tag}"' for tag in tags)
    part_links = ", ".join(f'SYMLINK+="disk/by-tag/{tag}-part%n"' for tag in tags)
    return [
        f'SUBSYSTEM=="block", ENV{{DEVTYPE}}=="disk", {disk_key}, ENV{{IMDS_TAG}}="{" ".join(tags)}", {symlinks}',
        f'SUBSYSTEM=="block", ENV{{DEVTYPE}}=="partition", {partition_key}, {part_links}',
    ]


def _disk_match(key: Key) -> tuple[str, str]:
    disk, partition = _DISK_KEY[key.kind]
    return f'{disk}=="{key.value}"', f'{partition}=="{key.value}"'
