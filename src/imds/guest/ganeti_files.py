"""What ``ganeti install`` does with the bytes it is served: environment, archives, the image.

- ``parse_environment``: ``os/environment``'s ``KEY=value`` lines (values quoted as
  ``shlex.quote`` quotes them; a quoted value may span lines) → a dict.
- ``safe_extract``: a tar.gz unpacked under a directory, refusing — before anything is
  written — absolute names, ``..`` components, device and FIFO members and links whose
  target leaves the tree; while extracting, a member whose path resolves outside the
  directory through a symbolic link already there (an absolute link on the target root,
  ``/var/run -> /run``) is refused too. tarfile's ``data`` filter is applied on a python
  that has it (3.11.4+); the checks here do not depend on it.
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
import posixpath
import re
import shlex
import stat
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

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


def _escapes(path: str) -> bool:
    normal = posixpath.normpath(path)
    return path.startswith("/") or normal == ".." or normal.startswith("../")


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why this member must not be unpacked, or None (the same rules the service applies to packages)."""
    shown = repr(member.name[:_SHOWN])
    if member.name.startswith("/"):
        return f"member {shown} has an absolute path"
    if ".." in member.name.split("/"):
        return f"member {shown} has a '..' component"
    if member.issym():
        target = posixpath.join(posixpath.dirname(member.name), member.linkname)
        if member.linkname.startswith("/") or _escapes(target):
            return f"symbolic link {shown} points outside the archive ({member.linkname[:_SHOWN]!r})"
    if member.islnk() and _escapes(member.linkname):
        return f"hard link {shown} points outside the archive ({member.linkname[:_SHOWN]!r})"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return f"member {shown} is a device, FIFO or other special file"
    return None


def safe_extract(archive: Path, target: Path) -> int:
    """Unpack the tar.gz ``archive`` under ``target``; the number of members; InstallError when refused."""
    root = target.resolve()
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                if (problem := member_problem(member)) is not None:
                    raise InstallError(f"{archive.name} refused: {problem}; nothing was unpacked")
            for member in members:
                _extract_one(tar, member, root)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        msg = f"{archive.name}: not a gzip-compressed tar archive, or a truncated one ({exc})"
        raise InstallError(msg) from exc
    except OSError as exc:
        raise InstallError(f"{archive.name}: unpacking under {target}: {exc}") from exc
    return len(members)


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path) -> None:
    """One member, after checking where its path resolves to now (links unpacked or already there)."""
    path = root / member.name
    # A link member replaces what is there: only its directory must stay inside. Anything else is
    # written through what is there, so the whole path must resolve inside.
    resolved = (path.parent if member.issym() or member.islnk() else path).resolve()
    if not resolved.is_relative_to(root):
        msg = f"member {member.name[:_SHOWN]!r} would be written outside the target, at {resolved}"
        raise InstallError(msg)
    if member.islnk() and not (root / member.linkname).resolve().is_relative_to(root):
        msg = f"hard link {member.name[:_SHOWN]!r} resolves outside the target"
        raise InstallError(msg)
    if hasattr(tarfile, "data_filter"):
        tar.extract(member, root, filter="data")
    else:  # python < 3.11.4: the checks above are all there is
        tar.extract(member, root)


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
