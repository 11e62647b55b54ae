"""``imds guest udev`` end to end in-process: sources, output, exit status, idempotency, reload."""

from __future__ import annotations

import json
import os

import pytest
from guest_machines import example_machine, load_fixture, make_config_drive, write_script, xen_machine

from imds.guest.cli import main
from imds.guest.devices import parse_devices
from imds.guest.match import match_devices
from imds.guest.rules import HEADER, render
from imds.guest.sysfs import scan
from imds.guest.testing import MetadataServer


@pytest.fixture
def drive(tmp_path):
    """A config drive directory with example.json."""
    return make_config_drive(tmp_path / "drive", load_fixture("example"))


@pytest.fixture
def rules_file(tmp_path):
    """Where the rules go in these tests (never /etc)."""
    return tmp_path / "etc" / "udev" / "rules.d" / "70-imds-device-tags.rules"


def _expected(fake, document):
    return render(match_devices(parse_devices(document).devices, scan(fake.sys, fake.dev)).matches).text


def test_dry_run_prints_the_rules_and_writes_nothing(fake, drive, rules_file, run_udev):
    """--dry-run: the rules on stdout, exit 0, nothing on stderr, no file."""
    example_machine(fake)
    run = run_udev(fake, "--config-drive", str(drive), "--rules-file", str(rules_file), "--dry-run")
    assert (run.status, run.err) == (0, "")
    assert run.out == _expected(fake, load_fixture("example"))
    assert 'KERNELS=="0000:00:02.0", ENV{IMDS_TAG}="nfvfunc1"' in run.out
    assert not rules_file.parent.exists()


def test_dry_run_output_is_exactly_what_is_written(fake, drive, rules_file, run_udev):
    """The file a real run writes is byte for byte the --dry-run output."""
    example_machine(fake)
    dry = run_udev(fake, "--config-drive", str(drive), "--rules-file", str(rules_file), "--dry-run")
    real = run_udev(fake, "--config-drive", str(drive), "--rules-file", str(rules_file), "--no-reload")
    assert real.status == 0
    assert real.out == f"wrote {rules_file} (4 tagged devices)\n"
    assert rules_file.read_text() == dry.out


def test_second_identical_run_changes_nothing_and_does_not_reload(fake, drive, rules_file, run_udev, udevadm):
    """Run twice: the first writes and reloads udev; the second leaves file, mtime and udev alone."""
    example_machine(fake)
    args = ("--config-drive", str(drive), "--rules-file", str(rules_file), "--udevadm", str(udevadm.path))
    first = run_udev(fake, *args)
    assert first.out == f"wrote {rules_file} (4 tagged devices)\nudev reloaded\n"
    assert udevadm.calls() == [
        "control --reload",
        "trigger --action=change --subsystem-match=block --subsystem-match=net",
    ]
    os.utime(rules_file, ns=(1_000_000_000, 1_000_000_000))
    before = rules_file.stat()
    second = run_udev(fake, *args)
    assert (second.status, second.out) == (0, f"{rules_file} unchanged (4 tagged devices)\n")
    after = rules_file.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert len(udevadm.calls()) == 2


def test_changed_tags_rewrite_and_retrigger_old_and_new_subsystems(fake, tmp_path, rules_file, run_udev, udevadm):
    """NIC rules dropped in favour of disk rules: both net (to untag) and block are triggered."""
    example_machine(fake)
    args = ("--rules-file", str(rules_file), "--udevadm", str(udevadm.path))
    nics_only = {"devices": load_fixture("example")["devices"][:2]}
    disks_only = {"devices": load_fixture("example")["devices"][2:]}
    run_udev(fake, "--config-drive", str(make_config_drive(tmp_path / "a", nics_only)), *args)
    run_udev(fake, "--config-drive", str(make_config_drive(tmp_path / "b", disks_only)), *args)
    assert udevadm.calls() == [
        "control --reload",
        "trigger --action=change --subsystem-match=net",
        "control --reload",
        "trigger --action=change --subsystem-match=block --subsystem-match=net",
    ]
    assert 'SUBSYSTEM=="net"' not in rules_file.read_text()


def test_no_reload_writes_but_leaves_udev_alone(fake, drive, rules_file, run_udev, udevadm):
    """--no-reload: the file is written and udevadm is never run."""
    example_machine(fake)
    run = run_udev(fake, "--config-drive", str(drive), "--rules-file", str(rules_file), "--no-reload",
                   "--udevadm", str(udevadm.path))
    assert run.status == 0
    assert rules_file.exists()
    assert udevadm.calls() == []


def test_missing_device_is_reported_and_exit_is_1(fake, tmp_path, rules_file, run_udev):
    """A tagged disk that is not here: reported on stderr, skipped, the rest written, exit 1."""
    example_machine(fake)
    document = load_fixture("example")
    gone = {"type": "disk", "bus": "pci", "address": "0000:00:0f.0", "serial": "gone", "tags": ["x"]}
    document["devices"].append(gone)
    run = run_udev(fake, "--config-drive", str(make_config_drive(tmp_path / "d", document)),
                   "--rules-file", str(rules_file), "--no-reload")
    assert run.status == 1
    assert run.err == (
        "imds-guest: not found: disk #4 (bus pci, address 0000:00:0f.0, serial 'gone'; tags 'x'): "
        "no disk has serial 'gone'; no disk at pci address 0000:00:0f.0\n"
    )
    assert rules_file.read_text() == _expected(fake, load_fixture("example"))


def test_skipped_tags_and_invalid_entries_make_exit_1(fake, tmp_path, run_udev):
    """A tag udev cannot carry and an entry that breaks the schema are each reported; exit 1."""
    xen_machine(fake)
    document = load_fixture("xen")
    document["devices"][0]["tags"] = ["nfv func"]
    document["devices"].append({"type": "nic", "bus": "pci", "tags": ["x"]})
    run = run_udev(fake, "--config-drive", str(make_config_drive(tmp_path / "d", document)), "--dry-run")
    assert run.status == 1
    assert run.err.splitlines() == [
        'imds-guest: skipped devices[6]: a nic needs a "mac"',
        "imds-guest: nic eth0: skipped tag 'nfv func': contains whitespace",
    ]
    assert "nfv func" not in run.out


def test_notes_are_reported_without_changing_the_exit_status(fake, tmp_path, run_udev):
    """Two entries landing on one disk: a note on stderr, tags merged, exit 0."""
    fake.xen_disk("xvdc", 51744)
    disk = {"type": "disk", "bus": "xen", "path": "/dev/xvdc"}
    document = {"devices": [{**disk, "serial": "a", "tags": ["x"]}, {**disk, "serial": "b", "tags": ["y"]}]}
    run = run_udev(fake, "--config-drive", str(make_config_drive(tmp_path / "d", document)), "--dry-run")
    assert run.status == 0
    assert run.err == "imds-guest: disk xvdc: entries #0 and #1 describe the same device; their tags are merged\n"
    assert 'ENV{IMDS_TAG}="x y"' in run.out


def test_metadata_url_source(fake, run_udev):
    """The default source: {url}/openstack/latest/meta_data.json from a real HTTP server."""
    xen_machine(fake)
    with MetadataServer() as server:
        server.routes["/openstack/latest/meta_data.json"] = (200, json.dumps(load_fixture("xen")).encode())
        run = run_udev(fake, "--metadata-url", server.url, "--dry-run")
    assert run.status == 0
    assert run.out == _expected(fake, load_fixture("xen"))


def test_unreachable_metadata_url_is_exit_2(fake, rules_file, run_udev):
    """A metadata URL that answers 404: exit 2, one error line, no rules file."""
    with MetadataServer() as server:
        run = run_udev(fake, "--metadata-url", server.url, "--rules-file", str(rules_file))
    assert run.status == 2
    assert run.err == f"imds-guest: error: {server.url}/openstack/latest/meta_data.json: HTTP 404 Not Found\n"
    assert not rules_file.exists()


def test_missing_devices_key_is_exit_2(fake, tmp_path, rules_file, run_udev):
    """meta_data.json without "devices": a clear error, exit 2, the existing rules untouched."""
    rules_file.parent.mkdir(parents=True)
    rules_file.write_text("# previous\n")
    drive = make_config_drive(tmp_path / "d", {"uuid": "x"})
    run = run_udev(fake, "--config-drive", str(drive), "--rules-file", str(rules_file))
    assert run.status == 2
    assert run.err.startswith(f'imds-guest: error: {drive}/openstack/latest/meta_data.json: no "devices" key')
    assert rules_file.read_text() == "# previous\n"


def test_auto_without_a_config_drive_is_exit_2(fake, run_udev):
    """--config-drive auto with no config-2 label under --dev-root fails before mounting."""
    run = run_udev(fake, "--config-drive", "auto", "--dry-run")
    assert run.status == 2
    assert run.err == f"imds-guest: error: no config drive: {fake.dev}/disk/by-label/config-2 does not exist\n"


def test_empty_devices_list_writes_just_the_header(fake, tmp_path, run_udev):
    """No tagged devices: a header-only file (so old tags disappear), exit 0."""
    run = run_udev(fake, "--config-drive", str(make_config_drive(tmp_path / "d", {"devices": []})), "--dry-run")
    assert (run.status, run.out) == (0, HEADER)


def test_failing_reload_is_exit_2_and_keeps_the_rules(fake, drive, rules_file, run_udev, tmp_path):
    """A udevadm failing after the write: exit 2, a message saying the rules are in place."""
    example_machine(fake)
    broken = write_script(tmp_path / "broken-udevadm", "echo 'no udev here' >&2\nexit 1")
    run = run_udev(fake, "--config-drive", str(drive), "--rules-file", str(rules_file), "--udevadm", str(broken))
    assert run.status == 2
    assert run.err == (
        f"imds-guest: error: `{broken} control --reload` failed: no udev here; "
        "the rules are in place and apply at next boot or after a udev reload\n"
    )
    assert rules_file.exists()


def test_rename_nics_flag(fake, drive, run_udev):
    """--rename-nics adds NAME from the first tag; without it there is no NAME."""
    example_machine(fake)
    renamed = run_udev(fake, "--config-drive", str(drive), "--dry-run", "--rename-nics")
    assert 'KERNELS=="0000:00:02.0", ENV{IMDS_TAG}="nfvfunc1", NAME="nfvfunc1"' in renamed.out
    assert "NAME=" not in run_udev(fake, "--config-drive", str(drive), "--dry-run").out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["udev", "--config-drive", "/x", "--metadata-url", "http://y"], "not allowed with argument"),
        (["udev", "--timeout", "0"], "'0' is not a positive number of seconds"),
        (["udev", "--sysfs-root", "/nonexistent-sysfs"], "--sysfs-root /nonexistent-sysfs: not a directory"),
        (["udev", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_usage_errors_exit_2(args, message, capsys):
    """Bad arguments: argparse's usage message and exit status 2."""
    with pytest.raises(SystemExit) as caught:
        main(args, prog="imds-guest")
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
