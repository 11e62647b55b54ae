"""Writing the rules file atomically and idempotently, and asking udev to reload."""

from __future__ import annotations

import os

import pytest
from guest_machines import write_script

from imds.guest.apply import read_current, reload_commands, reload_udev, subsystems_in, write_rules
from imds.guest.errors import ApplyError


def test_new_file_is_written_world_readable(tmp_path):
    """A missing rules file (and its directory) is created with mode 0644 and exactly the text."""
    path = tmp_path / "rules.d" / "70-imds-device-tags.rules"
    assert write_rules(path, "# rules\n", read_current(path)) is True
    assert path.read_text() == "# rules\n"
    assert path.stat().st_mode & 0o777 == 0o644


def test_identical_text_touches_nothing(tmp_path):
    """Same content: False, same inode, same mtime, no temporary file left."""
    path = tmp_path / "70.rules"
    write_rules(path, "# rules\n", None)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = path.stat()
    assert write_rules(path, "# rules\n", read_current(path)) is False
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert [entry.name for entry in tmp_path.iterdir()] == ["70.rules"]


def test_changed_text_replaces_the_file_by_rename(tmp_path):
    """New content arrives by rename (a new inode): readers never see a half-written file."""
    path = tmp_path / "70.rules"
    write_rules(path, "# old\n", None)
    old_inode = path.stat().st_ino
    assert write_rules(path, "# new\n", read_current(path)) is True
    assert path.read_text() == "# new\n"
    assert path.stat().st_ino != old_inode
    assert [entry.name for entry in tmp_path.iterdir()] == ["70.rules"]


def test_unwritable_location_is_an_apply_error(tmp_path):
    """A rules path under a regular file cannot be written: ApplyError naming the path."""
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "70.rules"
    with pytest.raises(ApplyError, match=f"^cannot write {path}: "):
        write_rules(path, "# rules\n", None)


def test_subsystems_are_read_from_rules_not_comments():
    """SUBSYSTEM=="…" of active rules count; a commented-out rule does not."""
    text = '# SUBSYSTEM=="tty"\nSUBSYSTEM=="net", ATTR{address}=="x"\nSUBSYSTEM=="block", KERNEL=="vda"\n'
    assert subsystems_in(text) == {"net", "block"}
    assert subsystems_in(None) == set()


def test_reload_commands_trigger_only_the_affected_subsystems():
    """First ``control --reload``, then one ``trigger --action=change`` limited to the subsystems given."""
    assert reload_commands("udevadm", {"net", "block"}) == [
        ["udevadm", "control", "--reload"],
        ["udevadm", "trigger", "--action=change", "--subsystem-match=block", "--subsystem-match=net"],
    ]
    assert reload_commands("udevadm", ()) == [["udevadm", "control", "--reload"]]


def test_reload_runs_udevadm(tmp_path):
    """reload_udev runs the commands in order through the given udevadm."""
    log = tmp_path / "log"
    udevadm = write_script(tmp_path / "udevadm", f'echo "$*" >> "{log}"')
    reload_udev(str(udevadm), {"block"})
    assert log.read_text().splitlines() == ["control --reload", "trigger --action=change --subsystem-match=block"]


def test_failing_udevadm_is_an_apply_error(tmp_path):
    """A non-zero exit names the command and carries its stderr."""
    udevadm = write_script(tmp_path / "udevadm", 'echo "Failed to send reload request: No such file" >&2\nexit 1')
    with pytest.raises(ApplyError, match=r"control --reload` failed: Failed to send reload request: No such file$"):
        reload_udev(str(udevadm), {"net"})


def test_missing_udevadm_is_an_apply_error(tmp_path):
    """No udevadm at that path: ApplyError, not a traceback."""
    with pytest.raises(ApplyError, match="No such file or directory"):
        reload_udev(str(tmp_path / "no-udevadm"), {"net"})
