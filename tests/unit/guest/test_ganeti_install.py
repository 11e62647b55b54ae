"""``ganeti install`` in-process, through ``main([...])``, against a fake service (ganeti_fake.py).

The disk is a regular file and the root filesystem a directory (``--root``), so nothing is
mounted here; tests/integration/test_ganeti_install.py runs it against loop devices,
``imds serve`` and Ganeti's client, as root.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from ganeti_fake import FakeService, tar_gz

from imds.cli import cli
from imds.guest.cli import main

MiB = 1024 * 1024
ENV = {"INSTANCE_NAME": "vm1.example.com", "DISK_COUNT": "2", "DISK_0_PATH": "/dev/drbd0",
       "DISK_1_PATH": "/dev/drbd1", "OSP_GREETING": "it's\nmulti-line $HOME", "OS_API_VERSION": "20"}
# create writes its environment and working directory into the target root it is told about.
CREATE = """#!/bin/sh
out="$OSP_TARGET"
pwd > "$out/cwd"
env | sort > "$out/env"
printf '%s' "$OSP_GREETING" > "$out/greeting"
echo "create says hello"
"""


@pytest.fixture
def service() -> Iterator[FakeService]:
    with FakeService() as fake:
        yield fake


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    """A 4 MiB "disk" file of zeros."""
    path = tmp_path / "disk.img"
    path.write_bytes(bytes(4 * MiB))
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


def definition(script: str = CREATE) -> bytes:
    """The OS definition archive imds serves: ``<name>/create`` and friends."""
    return tar_gz(("dir", "tiny", "", 0o755), ("file", "tiny/create", script, 0o755),
                  ("file", "tiny/ganeti_api_version", "20\n", 0o644))


def install(service: FakeService, disk: Path, *args: str) -> int:
    return main(["ganeti", "install", "--disk", str(disk), "--url", service.url, *args])


def test_every_step_in_order(service, disk, root, tmp_path, capsys):
    """Image → create with the served environment and the given disks → package over --root → succeeded."""
    image = b"IMAGE" * 1000
    service.install({"os-image": "http://images/x.img", "os-package": "http://pkg/site.tar.gz",
                     "target": str(tmp_path)}, {**ENV, "OSP_TARGET": str(tmp_path)})
    service.serve("os/image", image)
    service.serve("os/package", tar_gz(("dir", "etc", "", 0o755), ("file", "etc/motd", "hello", 0o644)))
    service.serve("os/os-install-package", definition())
    second = tmp_path / "second.img"
    assert install(service, disk, "--disk", str(second), "--root", str(root)) == 0
    assert service.states() == ["started", "image", "script", "package", "succeeded"]
    assert service.events[0]["message"] == f"ganeti install onto {disk}: image + OS create + package"
    assert disk.read_bytes()[: len(image)] == image
    assert disk.stat().st_size == 4 * MiB  # written from offset 0, never truncated
    assert (root / "etc" / "motd").read_text() == "hello"
    env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().split("\n") if "=" in line)
    assert (env["DISK_0_PATH"], env["DISK_1_PATH"]) == (str(disk), str(second))
    assert env["INSTANCE_NAME"] == ENV["INSTANCE_NAME"]
    assert env["PATH"] == "/sbin:/bin:/usr/sbin:/usr/bin"
    assert (tmp_path / "greeting").read_text() == ENV["OSP_GREETING"]  # quoted, multi-line value intact
    assert Path((tmp_path / "cwd").read_text().strip()).name == "tiny"  # run in its directory, as Ganeti does
    err = capsys.readouterr().err
    assert "create says hello\n" in err  # the script's output reaches our stderr
    assert service.events[1]["message"] == f"{len(image)} bytes written to {disk}, synced"


def test_the_package_is_overlaid_after_create(service, disk, root):
    """A create that empties the root filesystem (as one that formats or debootstraps): the package's files stay."""
    (root / "from-the-image").write_text("old")
    wipe = '#!/bin/sh\nrm -rf "$OSP_ROOT"/* && echo made-by-create > "$OSP_ROOT/created"\n'
    service.install({"os-package": "x", "root": str(root)}, {**ENV, "OSP_ROOT": str(root)})
    service.serve("os/package", tar_gz(("file", "etc/hostname", "personal\n", 0o644),
                                       ("file", "created", "pkg", 0o644)))
    service.serve("os/os-install-package", definition(wipe))
    assert install(service, disk, "--root", str(root)) == 0
    assert service.states() == ["started", "script", "package", "succeeded"]
    assert sorted(path.name for path in root.iterdir()) == ["created", "etc"]
    assert (root / "etc" / "hostname").read_text() == "personal\n"
    assert (root / "created").read_text() == "pkg"  # the package's file wins over create's


def test_a_package_that_cannot_be_had_stops_before_create(service, disk, root):
    """os/package missing (404): failed before create ran, so create never touched the disk."""
    service.install({"os-package": "x", "root": str(root)}, {**ENV, "OSP_ROOT": str(root)})
    service.serve("os/os-install-package", definition('#!/bin/sh\ntouch "$OSP_ROOT/ran"\n'))
    assert install(service, disk, "--root", str(root)) == 1
    assert service.states() == ["started", "failed"]
    assert not (root / "ran").exists()


def test_only_what_the_parameters_ask_for(service, disk):
    """No os-image, no os-package, no definition: nothing but started and succeeded; the disk untouched."""
    service.install({"greeting": "hi"}, ENV)
    assert install(service, disk) == 0
    assert service.states() == ["started", "succeeded"]
    assert disk.read_bytes() == bytes(4 * MiB)
    assert "/ganeti/latest/os/image" not in service.requests
    assert "/ganeti/latest/os/package" not in service.requests


def test_disks_are_the_given_devices(service, disk, tmp_path, capsys):
    """Node paths are never passed on: one --disk → DISK_0_PATH is it, DISK_COUNT 1, no DISK_1_PATH."""
    service.install({"target": "x"}, {**ENV, "OSP_TARGET": str(tmp_path)})
    service.serve("os/os-install-package", definition())
    assert install(service, disk) == 0
    env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert (env["DISK_0_PATH"], env["DISK_COUNT"]) == (str(disk), "1")
    assert "DISK_1_PATH" not in env
    assert "the instance has 2 disks (DISK_COUNT), 1 given with --disk" in capsys.readouterr().err


@pytest.mark.parametrize(("members", "reason"), [
    ((("file", "../escape", "x", 0o644),), "'..' component"),
    ((("file", "/etc/passwd", "x", 0o644),), "absolute path"),
    ((("file", "ok", "x", 0o644), ("sym", "up", "../../x", 0o777)), "points outside"),
    ((("sym", "abs", "/etc", 0o777),), "points outside"),
    ((("fifo", "pipe", "", 0o644),), "device, FIFO"),
])
def test_unsafe_package_is_refused_before_anything_is_written(service, disk, root, members, reason):
    """An unsafe member: failed event naming it, exit 1, and not even the safe members are unpacked."""
    service.install({"os-package": "x"}, ENV)
    service.serve("os/package", tar_gz(("file", "first", "x", 0o644), *members))
    assert install(service, disk, "--root", str(root)) == 1
    assert service.states() == ["started", "failed"]
    assert reason in service.events[-1]["message"]
    assert list(root.iterdir()) == []
    assert not (root.parent / "escape").exists()


def test_an_absolute_link_already_on_the_target_is_not_followed(service, disk, root, tmp_path):
    """A root with var/run -> <outside>: a member under var/run would land outside; refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to(outside)
    service.install({"os-package": "x"}, ENV)
    service.serve("os/package", tar_gz(("file", "var/run/pid", "1", 0o644)))
    assert install(service, disk, "--root", str(root)) == 1
    assert "would be written outside the target" in service.events[-1]["message"]
    assert list(outside.iterdir()) == []


def test_create_failure_reports_its_exit_status(service, disk):
    """Create exits 3: failed with code 3, exit status 1, no succeeded."""
    service.install({}, ENV)
    service.serve("os/os-install-package", definition("#!/bin/sh\necho dying >&2\nexit 3\n"))
    assert install(service, disk) == 1
    assert service.states() == ["started", "script", "failed"]
    assert service.events[-1]["code"] == 3
    assert service.events[-1]["message"] == "tiny/create exited with status 3"


@pytest.mark.parametrize(("length", "sent", "problem"), [(2 * MiB, MiB, "ended early"), (True, 0, "HTTP 500")])
def test_short_or_failed_image_is_a_failure(service, disk, length, sent, problem):
    """A body shorter than its Content-Length, or an HTTP error: failed, exit 1."""
    service.install({"os-image": "x"}, ENV)
    service.serve("os/image", b"i" * sent, status=200 if sent else 500, length=length)
    assert install(service, disk) == 1
    assert service.states() == ["started", "failed"]
    assert problem in service.events[-1]["message"]


@pytest.mark.parametrize("case", [
    (20 * MiB, True, MiB, [2, 4, 6, 8, 10, 12, 14, 16, 18]),  # 10 % of 20 MiB beats --progress-bytes 1 MiB
    (10 * MiB, None, 3 * MiB, [3, 6, 9]),  # no Content-Length: every --progress-bytes
    (3 * MiB, True, 64 * MiB, []),  # a small image: only the final event
])
def test_image_progress_is_spaced(service, tmp_path, case):
    """Progress events at most every 10 % and every --progress-bytes, then one final event."""
    size, length, every, marks = case
    disk = tmp_path / "big.img"
    disk.write_bytes(b"")
    service.install({"os-image": "x"}, ENV)
    service.serve("os/image", os.urandom(1024) * (size // 1024), length=length)
    assert install(service, disk, "--progress-bytes", str(every)) == 0
    progress = [e["message"] for e in service.events if e["state"] == "image"]
    assert [int(m.split()[0]) // MiB for m in progress[:-1]] == marks
    assert progress[-1] == f"{size} bytes written to {disk}, synced"
    assert disk.stat().st_size == size


def test_rate_limited_events_are_waited_out(service, disk):
    """429s with Retry-After on started: retried until accepted, nothing lost."""
    service.install({}, ENV)
    service.throttle = 3
    assert install(service, disk) == 0
    assert (service.throttled, service.states()) == (3, ["started", "succeeded"])


@pytest.mark.parametrize("case", [
    (None, b"A=1\n", "HTTP 404"),
    (b'{"a": "not a pair"}', b"A=1\n", "not an object of [value, visibility] pairs"),
    (b"{}", b"A='unterminated\n", "not shell-quoted"),
    (b"{}", b"NOT-AN ASSIGNMENT\n", "is not KEY=value"),
])
def test_nothing_is_done_without_parameters_and_environment(service, disk, capsys, case):
    """Unreadable parameters or environment (404: no install under way): exit 2, nothing posted."""
    parameters, environment, problem = case
    if parameters is not None:
        service.serve("os/parameters.json", parameters)
    service.serve("os/environment", environment)
    assert install(service, disk) == 2
    assert service.events == []
    err = capsys.readouterr().err
    assert problem in err
    assert "nothing was done" in err


def test_dry_run_prints_the_plan_and_changes_nothing(service, disk, capsys):
    service.install({"os-image": "x", "os-package": "y"}, ENV)
    service.serve("os/os-install-package", definition())
    assert install(service, disk, "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [f"image: write {service.url}/ganeti/latest/os/image onto {disk}",
                       "create: run tiny/create",
                       (f"package: unpack {service.url}/ganeti/latest/os/package over {disk}'s root filesystem "
                       "(mounted on a temporary dir)")]
    assert f"DISK_0_PATH={disk}" in out[3]
    assert service.events == []
    assert disk.read_bytes() == bytes(4 * MiB)


def test_usage_needs_a_disk(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["ganeti", "install"])
    assert stopped.value.code == 2
    assert "--disk" in capsys.readouterr().err


def test_unreported_success_is_exit_3(service, disk, capsys):
    """Installed, but succeeded could not be posted: exit 3 and the reason; no failed event."""
    service.install({}, ENV)
    service.refused = {"succeeded"}
    assert install(service, disk) == 3
    assert service.states() == ["started"]
    assert "installed, but POST" in capsys.readouterr().err


def test_dry_run_names_the_root_device(service, disk, capsys):
    service.install({"os-package": "y"}, ENV)
    assert install(service, disk, "--root-device", "/dev/vdz1", "--dry-run") == 0
    assert "over /dev/vdz1's root filesystem" in capsys.readouterr().out


def test_root_and_root_device_exclude_each_other(disk, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["ganeti", "install", "--disk", str(disk), "--root", "/mnt", "--root-device", "/dev/vda1"])
    assert stopped.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_imds_guest_ganeti_install_is_the_same_command(service, disk):
    """``imds guest ganeti install …`` (click) reaches the same argparse main, exit status included."""
    service.install({}, ENV)
    result = CliRunner().invoke(cli, ["guest", "ganeti", "install", "--disk", str(disk), "--url", service.url])
    assert result.exit_code == 0, result.output
    assert service.states() == ["started", "succeeded"]
    usage = CliRunner().invoke(cli, ["guest", "ganeti", "install", "--help"])
    assert usage.output.startswith("usage: imds guest ganeti install [-h] --disk DEV")
