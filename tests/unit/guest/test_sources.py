"""Reading meta_data.json: config drive directory, config drive by label, metadata URL."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from guest_machines import load_fixture, make_config_drive, write_script

from imds.guest import sources
from imds.guest.errors import SourceError
from imds.guest.testing import FakeSystem, MetadataServer

META = "/openstack/latest/meta_data.json"


def test_config_drive_directory_is_read(tmp_path):
    """A mounted drive's openstack/latest/meta_data.json is returned as parsed JSON."""
    drive = make_config_drive(tmp_path / "drive", load_fixture("example"))
    assert sources.from_directory(drive) == load_fixture("example")


def test_config_drive_that_is_not_a_directory(tmp_path):
    """A path that does not exist is a SourceError naming it."""
    with pytest.raises(SourceError, match=f"^config drive {tmp_path}/nope: not a directory$"):
        sources.from_directory(tmp_path / "nope")


def test_config_drive_without_meta_data(tmp_path):
    """A directory without openstack/latest/meta_data.json says which file it could not read."""
    with pytest.raises(SourceError, match=r"^config drive: cannot read .*/openstack/latest/meta_data.json: No such"):
        sources.from_directory(tmp_path)


def test_config_drive_with_broken_json(tmp_path):
    """Malformed JSON is a SourceError naming the file."""
    (tmp_path / "openstack" / "latest").mkdir(parents=True)
    (tmp_path / "openstack" / "latest" / "meta_data.json").write_text('{"devices": [')
    with pytest.raises(SourceError, match=r"meta_data.json: not valid JSON \(Expecting value"):
        sources.from_directory(tmp_path)


# Config drive found by label, with fake mount/umount commands


@pytest.fixture
def drive_tools(tmp_path):
    """Fake mount (copies a prepared drive into the mount point) and umount (empties it), both logged."""
    drive = make_config_drive(tmp_path / "iso", load_fixture("lxc"))
    log = tmp_path / "mount.log"
    mount = write_script(tmp_path / "mount", f'echo "mount $*" >> "{log}"\ncp -r "{drive}/." "$4"')
    umount = write_script(tmp_path / "umount", f'echo "umount $*" >> "{log}"\nfind "$1" -mindepth 1 -delete')
    return mount, umount, log


def test_config_drive_by_label_is_mounted_read_only_then_unmounted(tmp_path, drive_tools):
    """auto: /dev/disk/by-label/config-2 → its device is mounted -o ro on a temp dir, read, unmounted, dir removed."""
    fake = FakeSystem(tmp_path / "machine")
    fake.by_label("config-2", "sr0")
    mount, umount, log = drive_tools
    warnings: list[str] = []
    document = sources.from_config_drive_label(
        fake.dev, warn=warnings.append, mount=[str(mount)], umount=[str(umount)], mount_parent=tmp_path,
    )
    assert document == load_fixture("lxc")
    mounted, unmounted = log.read_text().splitlines()
    mountpoint = mounted.split()[-1]
    assert mounted == f"mount -o ro {fake.dev / 'sr0'} {mountpoint}"
    assert unmounted == f"umount {mountpoint}"
    assert not Path(mountpoint).exists()
    assert warnings == []


def test_upper_case_label_is_found(tmp_path):
    """A drive labelled CONFIG-2 (as vfat tools may show it) is found too."""
    fake = FakeSystem(tmp_path / "machine")
    fake.by_label("CONFIG-2", "vdz")
    assert sources.find_config_drive(fake.dev) == fake.dev / "vdz"


def test_no_config_drive_label(tmp_path):
    """Without a config-2 label, auto fails before mounting anything."""
    with pytest.raises(SourceError, match=f"^no config drive: {tmp_path}/disk/by-label/config-2 does not exist$"):
        sources.from_config_drive_label(tmp_path, warn=print, mount=["false"], umount=["false"], mount_parent=tmp_path)


def test_failed_mount_is_an_error_with_its_message(tmp_path):
    """The stderr of a failed mount is part of the SourceError."""
    fake = FakeSystem(tmp_path / "machine")
    fake.by_label("config-2", "sr0")
    mount = write_script(tmp_path / "mount", 'echo "mount: wrong fs type" >&2\nexit 32')
    with pytest.raises(SourceError, match=r"^mounting .*/sr0: .*/mount -o ro .*: mount: wrong fs type$"):
        sources.from_config_drive_label(
            fake.dev, warn=print, mount=[str(mount)], umount=["false"], mount_parent=tmp_path,
        )


def test_failed_unmount_is_a_warning_after_a_good_read(tmp_path, drive_tools):
    """The document was read, so a failing umount is reported through warn and the run goes on."""
    fake = FakeSystem(tmp_path / "machine")
    fake.by_label("config-2", "sr0")
    mount, _, _ = drive_tools
    umount = write_script(tmp_path / "bad-umount", 'echo "umount: target is busy" >&2\nexit 32')
    warnings: list[str] = []
    document = sources.from_config_drive_label(
        fake.dev, warn=warnings.append, mount=[str(mount)], umount=[str(umount)], mount_parent=tmp_path,
    )
    assert document == load_fixture("lxc")
    assert len(warnings) == 1
    assert warnings[0].startswith("unmounting ")
    assert warnings[0].endswith(": umount: target is busy")
    # Still "mounted": the mount point and the drive's files stay (in this test's tmp_path, never in /tmp).
    (left,) = tmp_path.glob("imds-config-drive-*")
    assert (left / "openstack" / "latest" / "meta_data.json").is_file()


# Metadata URL, served by a real http.server on 127.0.0.1


@pytest.fixture
def server():
    """A metadata server on a free loopback port, stopped after the test."""
    with MetadataServer() as running:
        yield running


def test_metadata_url_fetches_openstack_latest(server):
    """The document at {url}/openstack/latest/meta_data.json is fetched and parsed; a trailing slash is fine."""
    server.routes[META] = (200, json.dumps(load_fixture("xen")).encode())
    assert sources.from_url(server.url + "/", timeout=5) == load_fixture("xen")
    assert server.requests == [META]


def test_metadata_url_ignores_proxy_environment(server, monkeypatch):
    """http_proxy pointing at a dead port does not divert a link-local metadata request."""
    server.routes[META] = (200, b'{"devices": []}')
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert sources.from_url(server.url, timeout=5) == {"devices": []}


def test_metadata_url_http_error(server):
    """A 404 names the URL and the status."""
    with pytest.raises(SourceError, match=f"^{server.url}{META}: HTTP 404 Not Found$"):
        sources.from_url(server.url, timeout=5)


def test_metadata_url_bad_json(server):
    """A body that is not JSON names the URL."""
    server.routes[META] = (200, b"<html>")
    with pytest.raises(SourceError, match=f"^{server.url}{META}: not valid JSON"):
        sources.from_url(server.url, timeout=5)


def test_metadata_url_timeout(server):
    """A server that does not answer within --timeout is a SourceError, not a hang."""
    server.stalled.add(META)
    with pytest.raises(SourceError, match=f"^{server.url}{META}: (timed out|.*timed out)"):
        sources.from_url(server.url, timeout=0.2)


def test_metadata_url_refused():
    """Nothing listening: connection refused, with the URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SourceError, match=rf"^http://127.0.0.1:{port}{META}: \[Errno 111\] Connection refused$"):
        sources.from_url(f"http://127.0.0.1:{port}", timeout=2)


def test_metadata_url_scheme_must_be_http():
    """file:// and friends are refused before any request."""
    with pytest.raises(SourceError, match=r"^metadata URL 'file:///etc': only http:// and https:// are supported$"):
        sources.from_url("file:///etc", timeout=1)
