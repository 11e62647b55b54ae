"""Where the device role tags come from: a config drive or the metadata URL.

Each reader returns the parsed ``meta_data.json`` document and raises SourceError with a
one-line reason otherwise.

Usage::

    document = from_directory(Path("/mnt/config"))
    document = from_config_drive_label(Path("/dev"), warn=print)   # mounts read-only, unmounts
    document = from_url("http://169.254.169.254", timeout=5)
"""

from __future__ import annotations

import contextlib
import http.client
import json
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from imds.guest.errors import SourceError
from imds.guest.process import failure

META_DATA = "openstack/latest/meta_data.json"
LABELS = ("config-2", "CONFIG-2")  # Nova writes lower case; vfat tools may show upper case
MAX_BYTES = 16 * 1024 * 1024
MOUNT_TIMEOUT = 60.0


def parse_document(data: bytes, where: str) -> object:
    """The JSON document in ``data``; SourceError naming ``where`` when it is not JSON."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{where}: not valid JSON ({exc})") from exc


def from_directory(root: Path) -> object:
    """Read ``openstack/latest/meta_data.json`` from a mounted config drive at ``root``."""
    if not root.is_dir():
        raise SourceError(f"config drive {root}: not a directory")
    path = root / META_DATA
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"config drive: cannot read {path}: {exc.strerror or exc}") from exc
    return parse_document(data, str(path))


def find_config_drive(dev_root: Path) -> Path:
    """The block device labelled ``config-2`` under ``dev_root/disk/by-label``; SourceError if none."""
    for label in LABELS:
        link = dev_root / "disk" / "by-label" / label
        if link.exists():
            return link.resolve()
    raise SourceError(f"no config drive: {dev_root / 'disk' / 'by-label' / LABELS[0]} does not exist")


def from_config_drive_label(
    dev_root: Path,
    *,
    warn: Callable[[str], None],
    mount: Sequence[str] = ("mount",),
    umount: Sequence[str] = ("umount",),
    mount_parent: Path | None = None,
) -> object:
    """Mount the ``config-2`` drive read-only on a temporary directory, read it, unmount it.

    ``mount``/``umount`` are the commands to run (tests pass fakes). A failed unmount is
    reported through ``warn``: the document was read, so the run goes on (and the mount
    point stays, with the drive on it). The mount point is a new directory under
    ``mount_parent`` (default: the system temporary directory).
    """
    device = find_config_drive(dev_root)
    mountpoint = Path(tempfile.mkdtemp(prefix="imds-config-drive-", dir=mount_parent))
    try:
        _run([*mount, "-o", "ro", str(device), str(mountpoint)], f"mounting {device}")
        try:
            return from_directory(mountpoint)
        finally:
            try:
                _run([*umount, str(mountpoint)], f"unmounting {mountpoint}")
            except SourceError as exc:
                warn(str(exc))
    finally:
        with contextlib.suppress(OSError):  # still mounted: leave the directory, never its contents
            mountpoint.rmdir()


def _run(command: list[str], doing: str) -> None:
    if (why := failure(command, MOUNT_TIMEOUT)) is not None:
        raise SourceError(f"{doing}: {' '.join(command)}: {why}")


def from_url(base: str, *, timeout: float) -> object:
    """Fetch ``{base}/openstack/latest/meta_data.json`` over HTTP(S), bypassing any proxy settings.

    Link-local metadata must be fetched directly: an ``http_proxy`` from the environment
    would send the request (and the instance's identity) elsewhere.
    """
    if urllib.parse.urlsplit(base).scheme not in ("http", "https"):
        raise SourceError(f"metadata URL {base!r}: only http:// and https:// are supported")
    url = f"{base.rstrip('/')}/{META_DATA}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            data = response.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise SourceError(f"{url}: {exc.reason}") from exc
    except (OSError, http.client.HTTPException) as exc:  # timeouts and resets while reading
        raise SourceError(f"{url}: {exc or type(exc).__name__}") from exc
    if len(data) > MAX_BYTES:
        raise SourceError(f"{url}: larger than {MAX_BYTES} bytes")
    return parse_document(data, url)
