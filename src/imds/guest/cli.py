"""``python3 -m imds.guest udev|ganeti install``: argparse only, so it runs on an image's system python.

``ganeti install`` is ``imds.guest.ganeti`` (its own exit statuses, documented there and in
docs/guest.md). ``udev``'s exit status: 0 when every tagged device became a rule; 1 when the rules were produced but
something tagged was left out (a device not found here, an invalid entry, a tag udev
cannot carry); 2 when nothing could be done (usage error, unreadable source, the rules
file could not be written, udevadm failed).

Usage::

    raise SystemExit(main(["udev", "--config-drive", "auto", "--dry-run"]))
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from imds.guest import apply, ganeti, rules, sources, sysfs
from imds.guest.devices import parse_devices
from imds.guest.errors import GuestError
from imds.guest.match import match_devices

OK, INCOMPLETE, FAILED = 0, 1, 2
DEFAULT_URL = "http://169.254.169.254"
DEFAULT_RULES = "/etc/udev/rules.d/70-imds-device-tags.rules"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``prog`` is how help names the command (``imds guest`` under click)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Guest-side imds tools. They need nothing but the system python.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    udev = commands.add_parser(
        "udev",
        help="write udev rules that tag devices from Nova device role tags",
        description=(
            'Read the device role tags (meta_data.json "devices") from a config drive or the '
            "metadata URL, find each tagged NIC and disk on this machine, and write udev rules "
            "that set ENV{IMDS_TAG} and /dev/disk/by-tag/<tag>. Exit status: 0 every tagged "
            "device matched, 1 some were left out (reported on stderr), 2 error."
        ),
    )
    source = udev.add_mutually_exclusive_group()
    source.add_argument(
        "--config-drive",
        metavar="PATH|auto",
        help="read openstack/latest/meta_data.json from a mounted config drive at PATH, or with "
        "'auto' mount the drive labelled config-2 read-only for the read",
    )
    source.add_argument(
        "--metadata-url",
        default=DEFAULT_URL,
        metavar="URL",
        help="fetch URL/openstack/latest/meta_data.json (default: %(default)s; the default source)",
    )
    udev.add_argument("--timeout", type=ganeti.positive_seconds, default=5.0, metavar="SECONDS",
                      help="HTTP timeout (default: 5)")
    udev.add_argument("--sysfs-root", type=Path, default=Path("/sys"), metavar="DIR", help="default: /sys")
    udev.add_argument(
        "--dev-root", type=Path, default=Path("/dev"), metavar="DIR", help="disk/by-id, disk/by-label (default: /dev)"
    )
    udev.add_argument(
        "--rules-file", type=Path, default=Path(DEFAULT_RULES), metavar="FILE", help=f"default: {DEFAULT_RULES}"
    )
    udev.add_argument("--rename-nics", action="store_true", help="also rename each tagged NIC after its first tag")
    udev.add_argument("--dry-run", action="store_true", help="print the rules; write and reload nothing")
    udev.add_argument("--no-reload", action="store_true", help="write the rules but leave udev alone")
    udev.add_argument("--udevadm", default="udevadm", metavar="PATH", help="the udevadm program (default: from PATH)")
    ganeti.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run one command and return its exit status (argparse exits 2 itself on a usage error)."""
    parser = build_parser(prog)
    options = parser.parse_args(argv)
    report = _Reporter(parser.prog)
    if options.command == "ganeti":
        return ganeti.run(options, report)
    if not options.sysfs_root.is_dir():
        parser.error(f"--sysfs-root {options.sysfs_root}: not a directory")
    try:
        return udev(options, report)
    except GuestError as exc:
        report(f"error: {exc}")
        return FAILED


class _Reporter:
    """Messages for the operator, on stderr, each prefixed with the program name."""

    def __init__(self, prog: str) -> None:
        self.prog = prog

    def __call__(self, message: str) -> None:
        sys.stderr.write(f"{self.prog}: {message}\n")


def _read_source(options: argparse.Namespace, report: _Reporter) -> tuple[object, str]:
    """The document and where it came from, for messages."""
    if options.config_drive == "auto":
        document = sources.from_config_drive_label(options.dev_root, warn=report)
        return document, f"config drive (config-2) {sources.META_DATA}"
    if options.config_drive is not None:
        root = Path(options.config_drive)
        return sources.from_directory(root), str(root / sources.META_DATA)
    url = options.metadata_url
    return sources.from_url(url, timeout=options.timeout), f"{url.rstrip('/')}/{sources.META_DATA}"


def udev(options: argparse.Namespace, report: _Reporter) -> int:
    """``udev``: source → devices → local match → rules → write and reload."""
    document, where = _read_source(options, report)
    entries = parse_devices(document, where)
    matching = match_devices(entries.devices, sysfs.scan(options.sysfs_root, options.dev_root))
    rendered = rules.render(matching.matches, rename_nics=options.rename_nics)
    left_out = [*entries.problems, *(miss.describe() for miss in matching.misses), *rendered.skipped]
    for line in (*left_out, *matching.notes):
        report(line)
    status = INCOMPLETE if left_out else OK
    if options.dry_run:
        sys.stdout.write(rendered.text)
        return status
    path: Path = options.rules_file
    current = apply.read_current(path)
    if not apply.write_rules(path, rendered.text, current):
        sys.stdout.write(f"{path} unchanged ({rendered.tagged} tagged devices)\n")
        return status
    sys.stdout.write(f"wrote {path} ({rendered.tagged} tagged devices)\n")
    if options.no_reload:
        return status
    try:
        apply.reload_udev(options.udevadm, apply.subsystems_in(current) | set(rendered.subsystems))
    except GuestError as exc:
        msg = f"{exc}; the rules are in place and apply at next boot or after a udev reload"
        raise type(exc)(msg) from exc
    sys.stdout.write("udev reloaded\n")
    return status
