"""Tar archives unpacked so that nothing can leave the root, whatever the python: one implementation for both sides.

The service checks a personalization package with ``check`` before serving it; the guest
tool unpacks it with ``imds.guest.unpack``, which runs ``check``'s rules first against an
empty tree, then again against the target on disk (its ``Tree``). The rules:

- **names**: relative, no ``..`` component, no NUL, no component over 255 bytes; ``.`` and
  empty components are dropped (``./etc//motd`` is ``etc/motd``). A directory member that
  names the root itself (``.``, ``./``) is skipped: the root keeps its mode and owner.
- **kinds**: regular files, directories, symbolic and hard links. A device, FIFO or any
  other kind refuses the archive.
- **where a member goes**: its directories are walked from the root one component at a
  time through directory file descriptors opened with ``O_NOFOLLOW``. A relative link on
  the way is followed only while it stays beneath the root; an absolute link (a target's
  ``var/run -> /run``), or ``..`` above the root, refuses the member. No path is ever
  handed to the kernel whole, so PATH_MAX plays no part (the construction behind
  CVE-2025-4517, where ``os.path.realpath`` stops resolving while the kernel goes on).
- **symbolic links**: a relative target that resolves beneath the root against what is
  there at that moment; after the last member every link the archive made is resolved
  again against the final tree, so a chain bent out of the root by a later member
  (``l -> d/../x``, then ``d -> .``) is refused too. Absolute targets are refused.
- **hard links**: only to a regular file an earlier member made, found beneath the root.
- **writes**: a file or link is made under a temporary name and renamed over what was
  there, so nothing is ever written through a link (symbolic or hard) already in place;
  a directory is never replaced. Set-id bits are dropped (files ``mode & 0o777``,
  directories ``mode & 0o1777``), no owner is changed (everything belongs to whoever
  unpacks), an existing directory keeps its mode.
- **all or nothing** (``imds.guest.unpack``): nothing is written when ``check`` refuses; a
  refusal met on the target (a link already there) or an I/O error midway undoes every
  change (made entries removed, replaced ones put back).

Standard library only: the guest tool's zipapp carries this module (docs/guest.md).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tarfile
import zlib
from collections import deque
from collections.abc import Iterator
from typing import IO, Protocol

MAX_MEMBERS = 100_000
MAX_HOPS = 40  # symbolic links followed in one lookup (Linux's MAXSYMLINKS)
NAME_MAX = 255
DIR, FILE, LINK, OTHER = "directory", "file", "symbolic link", "special file"
_SHOWN = 100
_PIECE = 1 << 20  # bytes decompressed at once while checking

Where = tuple[str, ...]  # a directory beneath the root, as names with no link among them


class ArchiveError(Exception):
    """The archive is refused (or could not be unpacked); ``str(exc)`` says why, naming the member."""


class _Outside(ArchiveError):
    """A lookup would leave the root (the message is the reason, completed by the caller)."""


def _shown(text: str) -> str:
    return repr(text[:_SHOWN])


class Tree(Protocol):
    """What the rules need from a tree: the empty one ``check`` imagines, or a target (``imds.guest.unpack``)."""

    def kind(self, at: Where, name: str) -> str | None:
        """DIR, FILE, LINK or OTHER for ``at/name`` itself (a link not followed), None when absent."""

    def readlink(self, at: Where, name: str) -> str:
        """The target of the link ``at/name``."""

    def mkdir(self, at: Where, name: str) -> None:
        """Make the directory ``at/name`` (absent)."""

    def put(self, at: Where, name: str, member: tarfile.TarInfo, source: IO[bytes] | None,
            linked: Where | None) -> None:
        """Make ``at/name`` from a file, symbolic link or hard link (to ``linked``) member; no directory is there."""


class Imagined:
    """The tree ``check`` unpacks into: names only, in memory, empty at first."""

    def __init__(self) -> None:
        self._nodes: dict[Where, tuple[str, str]] = {(): (DIR, "")}

    def kind(self, at: Where, name: str) -> str | None:
        node = self._nodes.get((*at, name))
        return None if node is None else node[0]

    def readlink(self, at: Where, name: str) -> str:
        return self._nodes[(*at, name)][1]

    def mkdir(self, at: Where, name: str) -> None:
        self._nodes[(*at, name)] = (DIR, "")

    def put(self, at: Where, name: str, member: tarfile.TarInfo, source: IO[bytes] | None,
            linked: Where | None) -> None:
        del source, linked
        self._nodes[(*at, name)] = (LINK, member.linkname) if member.issym() else (FILE, "")


def _names(member: tarfile.TarInfo) -> Where:
    """The member's name as components; ArchiveError when it is absolute, climbs, or cannot be a file name."""
    shown = _shown(member.name)
    if member.name.startswith("/"):
        raise ArchiveError(f"member {shown} has an absolute path")
    parts = tuple(part for part in member.name.split("/") if part not in {"", "."})
    if ".." in parts:
        raise ArchiveError(f"member {shown} has a '..' component")
    if "\0" in member.name or any(len(os.fsencode(part)) > NAME_MAX for part in parts):
        raise ArchiveError(f"member {shown} is not a valid file name")
    return parts


def _kind(member: tarfile.TarInfo) -> str:
    if member.isdir():
        return DIR
    if member.issym():
        return LINK
    if member.isreg() or member.islnk():
        return FILE
    raise ArchiveError(f"member {_shown(member.name)} is a device, FIFO or other special file")


class Rules:
    """The rules, applied member by member to a ``Tree``."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.made_files: set[Where] = set()  # names of regular files made so far (hard link targets)
        self.links: list[tuple[Where, str]] = []
        self.dirs: list[tuple[Where, int]] = []
        self.count = 0

    def resolve(self, at: Where, path: str, *, follow: bool, make: bool = False) -> Where:
        """Where ``path`` (taken from ``at``) leads beneath the root, links followed (the last one if ``follow``).

        ``make``: the whole path is directories, absent ones are made; otherwise the rest of
        the path after an absent name is taken by its names alone until ``..`` climbs back
        above it.
        """
        pending, current, hops, absent_at = deque(path.split("/")), list(at), 0, None
        while pending:
            part = pending.popleft()
            if part in {"", "."}:
                continue
            if part == "..":
                if not current:
                    raise _Outside("'..' climbs above the root")
                current.pop()
                absent_at = None if absent_at is not None and len(current) < absent_at else absent_at
                continue
            kind = None if absent_at is not None else self.tree.kind(tuple(current), part)
            inner = bool(pending) or make  # must be a directory
            if kind == LINK and (follow or inner):
                hops += 1
                pending.extendleft(reversed(self._link(current, part, hops).split("/")))
                continue
            if kind is None and make:
                self.tree.mkdir(tuple(current), part)
            elif inner and kind is None:
                absent_at = absent_at or len(current) + 1
            elif inner and kind in {FILE, OTHER}:
                raise _Outside(f"{_shown('/'.join((*current, part)))} is not a directory")
            current.append(part)
        return tuple(current)

    def _link(self, current: list[str], name: str, hops: int) -> str:
        """The target of the link ``current/name`` when it may be followed."""
        target = self.tree.readlink(tuple(current), name)
        if hops > MAX_HOPS:
            raise _Outside("a symbolic link loop")
        if target.startswith("/"):
            raise _Outside(f"through the absolute link {_shown('/'.join((*current, name)))}")
        return target

    def member(self, member: tarfile.TarInfo, source: IO[bytes] | None) -> None:
        """Unpack one member into the tree (``source``: a regular file's bytes)."""
        names, kind = _names(member), _kind(member)
        shown = _shown(member.name)
        self.count += 1
        if not names:
            if kind == DIR:
                return  # the root itself: its mode and owner stay
            raise ArchiveError(f"member {shown} names the root")
        try:
            at = self.resolve((), "/".join(names[:-1]), follow=True, make=True)
        except _Outside as exc:
            raise ArchiveError(f"member {shown} would be written outside the target: {exc}") from exc
        name = names[-1]
        there = self.tree.kind(at, name)
        if kind == DIR:
            self._directory(member, at, name, there)
            return
        if there == DIR:
            raise ArchiveError(f"member {shown}: a directory is in the way")
        linked = self._hard_link(member) if member.islnk() else None
        if member.issym():
            self._symlink_target(member.name, member.linkname, at)
            self.links.append((at, name))
        self.tree.put(at, name, member, source, linked)
        if kind == FILE:
            self.made_files.add(names)

    def _directory(self, member: tarfile.TarInfo, at: Where, name: str, there: str | None) -> None:
        if there is None:
            self.tree.mkdir(at, name)
            self.dirs.append(((*at, name), member.mode & 0o1777))
        elif there == LINK:
            try:
                found = self.resolve(at, name, follow=True)
            except _Outside as exc:
                raise ArchiveError(f"directory {_shown(member.name)} would be outside the target: {exc}") from exc
            if found and self.tree.kind(found[:-1], found[-1]) != DIR:
                raise ArchiveError(f"directory {_shown(member.name)}: a link to something else is in the way")
        elif there != DIR:
            raise ArchiveError(f"directory {_shown(member.name)}: a file is in the way")

    def _symlink_target(self, name: str, target: str, at: Where, *, after: str = "") -> None:
        shown = _shown(name)
        if not target or target.startswith("/") or "\0" in target:
            raise ArchiveError(f"symbolic link {shown} points outside the archive ({_shown(target)})")
        try:
            self.resolve(at, target, follow=True)
        except _Outside as exc:
            raise ArchiveError(f"symbolic link {shown} points outside the archive{after} ({_shown(target)}): "
                               f"{exc}") from exc

    def _hard_link(self, member: tarfile.TarInfo) -> Where:
        shown, target = _shown(member.name), member.linkname
        outside = f"hard link {shown} points outside the archive ({_shown(target)})"
        if target.startswith("/") or ".." in target.split("/"):
            raise ArchiveError(outside)
        names = tuple(part for part in target.split("/") if part not in {"", "."})
        if names not in self.made_files:
            raise ArchiveError(f"{outside}: not a regular file unpacked before it")
        try:
            found = self.resolve((), "/".join(names), follow=False)
        except _Outside as exc:
            raise ArchiveError(f"{outside}: {exc}") from exc
        if not found or self.tree.kind(found[:-1], found[-1]) != FILE:
            raise ArchiveError(f"{outside}: not a regular file any more")
        return found

    def finish(self) -> None:
        """Every link the archive made, resolved again in the final tree."""
        for at, name in self.links:
            if self.tree.kind(at, name) != LINK:
                continue  # replaced by a later member
            self._symlink_target("/".join((*at, name)), self.tree.readlink(at, name), at, after=" once unpacked")


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """Archive and compression errors → ArchiveError."""
    try:
        yield
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ArchiveError(f"not a gzip-compressed tar archive (or a truncated one): {exc}") from exc


def apply(tar: tarfile.TarFile, tree: Tree, *, data: bool) -> Rules:
    """Every member of ``tar`` through the rules into ``tree`` (with their bytes when ``data``); the rules after."""
    rules = Rules(tree)
    for member in tar:
        if rules.count == MAX_MEMBERS:
            raise ArchiveError(f"more than {MAX_MEMBERS} members")
        rules.member(member, tar.extractfile(member) if data and member.isreg() else None)
    rules.finish()
    return rules


def _whole_gzip(data: bytes) -> bool:
    """Whether ``data`` is complete gzip (tarfile stops quietly at a cut in file data), a piece at a time."""
    pending = data
    while pending:
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while pending and not stream.eof:
                stream.decompress(pending, _PIECE)
                pending = stream.unconsumed_tail
        except zlib.error:
            return False
        if not stream.eof:
            return False
        pending = stream.unused_data  # a further gzip member
    return True


def check(data: bytes) -> str | None:
    """Why the tar.gz ``data`` must not be unpacked (every rule, against an empty tree), or None."""
    if not _whole_gzip(data):
        return "not a gzip-compressed tar archive (or a truncated one)"
    try:
        with reading(), tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            apply(tar, Imagined(), data=False)
    except ArchiveError as exc:
        return str(exc)
    return None


__all__ = ["MAX_MEMBERS", "ArchiveError", "Imagined", "Rules", "Tree", "apply", "check", "reading"]
