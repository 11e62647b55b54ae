"""Unpacking a tar.gz onto a target on disk under ``imds.tarball``'s rules, all or nothing.

``unpack`` runs the rules twice: against an empty imagined tree first (what the service
checks; a refusal there writes nothing), then against the target itself (``Disk``), where
every lookup and change goes through directory descriptors walked one name at a time
with ``O_NOFOLLOW`` from the root's, so no path is handed to the kernel whole and no link
is followed that the rules did not check. Every change is journaled: a refusal met on the
target (a link already there) or an I/O error undoes all of them.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile
from typing import IO, Self

from imds import tarball
from imds.tarball import DIR, FILE, LINK, OTHER, Where

CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CACHED = 64  # directory descriptors kept open


class Disk:
    """The target on disk: each lookup and change made through directory descriptors, journaled for undo."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._open: dict[Where, int] = {}  # least recently used first
        self._journal: list[tuple[str, Where, str, str]] = []  # (mkdir|made|moved, at, name, backup)
        self._serial = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is not None:
                self._undo()
        finally:
            for descriptor in self._open.values():
                os.close(descriptor)
            os.close(self._root)

    def _dir(self, at: Where) -> int:
        """A descriptor of the directory ``at``, valid until the next call (names walked with O_NOFOLLOW)."""
        if not at:
            return self._root
        if at in self._open:
            self._open[at] = self._open.pop(at)
            return self._open[at]
        depth = len(at) - 1
        while depth and at[:depth] not in self._open:
            depth -= 1
        descriptor = self._open[at[:depth]] if depth else self._root
        for index in range(depth, len(at)):
            walked = os.open(at[index], _DIR_FLAGS, dir_fd=descriptor)
            if index > depth:
                os.close(descriptor)  # an intermediate one, not kept
            descriptor = walked
        self._open[at] = descriptor
        while len(self._open) > _CACHED:
            os.close(self._open.pop(next(iter(self._open))))
        return descriptor

    @staticmethod
    def _kind_in(directory: int, name: str) -> str | None:
        try:
            mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(mode):
            return DIR
        if stat.S_ISLNK(mode):
            return LINK
        return FILE if stat.S_ISREG(mode) else OTHER

    def kind(self, at: Where, name: str) -> str | None:
        return self._kind_in(self._dir(at), name)

    def readlink(self, at: Where, name: str) -> str:
        return os.readlink(name, dir_fd=self._dir(at))

    def mkdir(self, at: Where, name: str) -> None:
        os.mkdir(name, 0o755, dir_fd=self._dir(at))
        self._journal.append(("mkdir", at, name, ""))

    def _free(self, directory: int) -> str:
        while True:
            self._serial += 1
            name = f".imds-unpack-{os.getpid()}-{self._serial}"
            if self._kind_in(directory, name) is None:
                return name

    def put(self, at: Where, name: str, member: tarfile.TarInfo, source: IO[bytes] | None,
            linked: Where | None) -> None:
        origin = os.dup(self._dir(linked[:-1])) if linked is not None else -1
        directory = os.dup(self._dir(at))
        temporary = self._free(directory)
        try:
            if member.issym():
                os.symlink(member.linkname, temporary, dir_fd=directory)
            elif linked is not None:
                os.link(linked[-1], temporary, src_dir_fd=origin, dst_dir_fd=directory, follow_symlinks=False)
            else:
                self._write(directory, temporary, member, source)
            if self._kind_in(directory, name) is not None:  # a file or link: kept aside until the end
                backup = self._free(directory)
                os.rename(name, backup, src_dir_fd=directory, dst_dir_fd=directory)
                self._journal.append(("moved", at, name, backup))
            os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
            self._journal.append(("made", at, name, ""))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            raise
        finally:
            os.close(directory)
            if origin >= 0:
                os.close(origin)

    @staticmethod
    def _write(directory: int, name: str, member: tarfile.TarInfo, source: IO[bytes] | None) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(name, flags, 0o600, dir_fd=directory)
        try:
            while source is not None and (chunk := source.read(CHUNK)):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(descriptor, view):]
            os.fchmod(descriptor, member.mode & 0o777)  # no set-id bits
            with contextlib.suppress(OSError, OverflowError, ValueError):
                os.utime(descriptor, (member.mtime, member.mtime))
        finally:
            os.close(descriptor)

    def set_modes(self, directories: list[tuple[Where, int]]) -> None:
        """The archive's modes on the directories it made (after every member: a mode may forbid writing)."""
        for where, mode in directories:
            descriptor = os.open(where[-1], _DIR_FLAGS, dir_fd=self._dir(where[:-1]))
            try:
                os.fchmod(descriptor, mode)
            finally:
                os.close(descriptor)

    def commit(self) -> None:
        """Keep every change: what was replaced goes."""
        for action, at, _name, backup in self._journal:
            if action == "moved":
                with contextlib.suppress(OSError):
                    os.unlink(backup, dir_fd=self._dir(at))
        self._journal.clear()

    def _undo(self) -> None:
        for action, at, name, backup in reversed(self._journal):
            with contextlib.suppress(OSError):
                directory = self._dir(at)
                if action == "mkdir":
                    os.rmdir(name, dir_fd=directory)
                elif action == "made":
                    os.unlink(name, dir_fd=directory)
                else:
                    os.rename(backup, name, src_dir_fd=directory, dst_dir_fd=directory)
        self._journal.clear()


def unpack(archive: str | os.PathLike[str], root: str | os.PathLike[str]) -> int:
    """Unpack the tar.gz file ``archive`` under the directory ``root``; the number of members.

    ``imds.tarball.ArchiveError`` when refused or failed; then nothing the archive made is left.
    """
    try:
        with tarball.reading(), tarfile.open(archive, mode="r:gz") as tar:
            count = tarball.apply(tar, tarball.Imagined(), data=False).count
        with Disk(root) as disk, tarball.reading(), tarfile.open(archive, mode="r:gz") as tar:
            rules = tarball.apply(tar, disk, data=True)
            disk.set_modes(rules.dirs)
            disk.commit()
    except OSError as exc:
        raise tarball.ArchiveError(f"unpacking under {os.fspath(root)}: {exc.strerror or exc}") from exc
    return count


__all__ = ["Disk", "unpack"]
