"""What ``ganeti install`` does with the bytes it is served: environment, archives, the image.

- ``parse_environment``: ``os/environment``'s ``KEY=value`` lines (values quoted as
  ``shlex.quote`` quotes them; a quoted value may span lines) → a dict.
- ``safe_extract``: a tar.gz unpacked under a directory by ``imds.guest.unpack`` (the rules the
  service checks packages with: nothing leaves the root, set-id bits dropped, special
  files refused, all or nothing), the same on every python.
- ``copy_image``: a response streamed onto a block device or file from offset 0, then
  ``fsync``; a body shorter than its ``Content-Length`` is an error. A block device is
  opened ``O_EXCL``, so a disk that is mounted (or otherwise held) is refused; afterwards
  ``reread_partitions`` asks the kernel for its new partition table.
"""

from __future__ import annotations

import errno
import fcntl
import http.client
import os
import re
import shlex
import stat
from collections.abc import Callable
from pathlib import Path

from imds import tarball
from imds.guest import unpack
from imds.guest.errors import InstallError, ServiceError

CHUNK = 1024 * 1024
BLKRRPART = 0x125F  # linux/fs.h _IO(0x12, 95): re-read the partition table
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")  # fullmatch
_SHOWN = 100


def parse_environment(text: str, where: str) -> dict[str, str]:
    """``KEY=value`` words, shell-quoted → {KEY: value}; ServiceError naming the first bad word."""
    try:
        words = shlex.split(text, comments=False, posix=True)
    except ValueError as exc:
        raise ServiceError(f"{where}: not shell-quoted KEY=value lines ({exc})") from exc
    environment: dict[str, str] = {}
    for word in words:
        name, equals, value = word.partition("=")
        if not equals or not _NAME.fullmatch(name):
            msg = f"{where}: {word[:_SHOWN]!r} is not KEY=value"
            raise ServiceError(msg)
        environment[name] = value
    return environment


def safe_extract(archive: Path, target: Path) -> int:
    """Unpack the tar.gz ``archive`` under ``target`` (``imds.tarball``'s rules); the number of members.

    InstallError when refused or failed: then nothing of the archive is left under ``target``.
    """
    try:
        return unpack.unpack(archive, target)
    except tarball.ArchiveError as exc:
        raise InstallError(f"{archive.name} refused: {exc}; nothing of it was left under {target}") from exc


def copy_image(
    response: http.client.HTTPResponse, device: str, *, url: str, length: int | None,
    progress: Callable[[int], None],
) -> int:
    """Stream ``response`` onto ``device`` from offset 0, fsync it; the bytes written.

    ``progress(written)`` is called after every chunk (the caller decides when to report).
    A short body (fewer bytes than ``length``, or a broken chunked stream) is a ServiceError.
    """
    flags = os.O_WRONLY | os.O_CLOEXEC
    try:
        if stat.S_ISBLK(Path(device).stat().st_mode):
            flags |= os.O_EXCL  # Linux: EBUSY when the disk is mounted or otherwise in use
        descriptor = os.open(device, flags)
    except OSError as exc:
        raise InstallError(f"cannot open {device} for writing: {exc.strerror or exc}") from exc
    written = 0
    buffer = memoryview(bytearray(CHUNK))  # one buffer for the whole copy: no allocation per chunk
    try:
        while True:
            try:
                size = response.readinto(buffer)
            except http.client.IncompleteRead as exc:
                msg = f"{url}: the image ended early after {written + len(exc.partial)} bytes"
                raise ServiceError(msg) from exc
            except (OSError, http.client.HTTPException) as exc:
                raise ServiceError(f"{url}: reading the image after {written} bytes: {exc}") from exc
            if not size:
                break
            view = buffer[:size]
            while view:
                done = os.write(descriptor, view)
                view = view[done:]
                written += done
            progress(written)
        if length is not None and written != length:
            msg = f"{url}: the image ended early: {written} of {length} bytes"
            raise ServiceError(msg)
        os.fsync(descriptor)
    except OSError as exc:
        raise InstallError(f"writing the image to {device} after {written} bytes: {exc.strerror or exc}") from exc
    finally:
        os.close(descriptor)
    return written


def reread_partitions(device: str) -> str | None:
    """Ask the kernel to re-read a block device's partition table (BLKRRPART); a note when it could not.

    Not a block device, or one that cannot be partitioned (a loop device without partition
    scanning): nothing to do, None.
    """
    try:
        if not stat.S_ISBLK(Path(device).stat().st_mode):
            return None
        descriptor = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open {device} to re-read its partition table: {exc.strerror or exc}"
    try:
        fcntl.ioctl(descriptor, BLKRRPART)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOTTY):
            return None
        return f"the kernel did not re-read {device}'s partition table: {exc.strerror or exc}"
    finally:
        os.close(descriptor)
    return None
