"""Putting the rules in place: an atomic, idempotent write, then a udev reload.

Usage::

    if write_rules(Path("/etc/udev/rules.d/70-imds-device-tags.rules"), text):
        reload_udev("udevadm", ("block", "net"))
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from imds.guest.errors import ApplyError
from imds.guest.process import failure

UDEVADM_TIMEOUT = 120.0
_SUBSYSTEM = re.compile(r'^[^#\n]*\bSUBSYSTEM=="([a-z0-9_]+)"', re.MULTILINE)


def read_current(path: Path) -> str | None:
    """The rules file as it is now, or None when there is none."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ApplyError(f"cannot read {path}: {exc}") from exc


def subsystems_in(text: str | None) -> set[str]:
    """The subsystems a rules text matches on (``SUBSYSTEM=="net"`` → ``net``)."""
    return set(_SUBSYSTEM.findall(text or ""))


def write_rules(path: Path, text: str, current: str | None) -> bool:
    """Replace ``path`` with ``text`` atomically; False, touching nothing, when it already holds ``text``.

    The new content goes to a temporary file in the same directory (its ``.tmp`` suffix is
    not ``.rules``, so udev never reads it half-written), is synced, then renamed over
    ``path``: readers see the old file or the new one, never a mix.
    """
    if current == text:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise ApplyError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        Path(temporary).chmod(0o644)
        Path(temporary).replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            Path(temporary).unlink()
        raise ApplyError(f"cannot write {path}: {exc.strerror or exc}") from exc
    _sync_directory(path.parent)
    return True


def _sync_directory(directory: Path) -> None:
    """Make the rename durable; best effort (some filesystems refuse to sync a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def reload_commands(udevadm: str, subsystems: Iterable[str]) -> list[list[str]]:
    """``udevadm control --reload``, then one ``trigger --action=change`` over ``subsystems`` (if any).

    ``change``, not ``add``: udev applies the rules (properties, symlinks) on either, but an ``add``
    replayed for every NIC is taken for a NIC plugged in by listeners such as cloud-init's hotplug
    hook, which then refreshes the network once per interface (``lo`` included, failing each time).
    """
    commands = [[udevadm, "control", "--reload"]]
    matches = [f"--subsystem-match={name}" for name in sorted(set(subsystems))]
    if matches:
        commands.append([udevadm, "trigger", "--action=change", *matches])
    return commands


def reload_udev(udevadm: str, subsystems: Iterable[str]) -> None:
    """Ask udev to reread its rules and replay ``change`` for ``subsystems``; ApplyError on failure."""
    for command in reload_commands(udevadm, subsystems):
        if (why := failure(command, UDEVADM_TIMEOUT)) is not None:
            raise ApplyError(f"`{' '.join(command)}` failed: {why}")
