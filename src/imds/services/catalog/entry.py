"""One catalog entry, kept compact until it is read, and the bounded cache of what reads build.

A million instances must fit one replica's memory, so an entry at rest holds only the id,
its addresses packed as integers and the metadata document's stored JSON text, compressed
(Zstandard with a preset dictionary: the first document packed, so similar documents
cost tens of bytes). The load never parses a document: it was validated when written.
The first read materialises the full ``Instance`` and every rendering a flavor builds
from it; those live on the entry while it is in the ``RenderCache``, a least-recently-read
list bounded by an approximate byte count (``--render-cache-bytes``). Evicting an entry
drops them; the next read rebuilds them from the packed form, byte for byte the same.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TypeVar, cast

import zstandard

from imds.models import Instance, JsonObject, Network, OsRecord, ProjectAttributes
from imds.services.catalog.addresses import pack_stored, unpack_network
from imds.services.catalog.members import Members, scope_keys
from imds.services.catalog.notices import NoticeBoard
from imds.services.catalog.projects import Projects, project_tag
from imds.services.catalog.watch import instance_etag, notices_tag
from imds.services.render.context import Context
from imds.services.render.gce import facility_of, project_of
from imds.services.render.timeline import next_change, seen
from imds.services.render.tree import Dir
from imds.store.interface import StoredInstance

T = TypeVar("T")
_ZDICT_LIMIT = 64 << 10  # the preset dictionary: the first document, up to this many bytes
_LEVEL = 3
_PARSED_FACTOR = 6  # approximate bytes of parsed Python objects per byte of compact JSON
_NODE_COST = 100  # approximate bytes of a tree node or cached value beside its text


def _unheard(_instance_id: str) -> None:
    """Nobody builds renderings ahead (a cache without a catalog: tests, tools)."""


def approximate_size(value: object) -> int:
    """A rough byte count of a cached value (text lengths plus a fixed cost per node).

    A tree is walked with a stack, not recursively: a first read of an instance counts every
    node of its renderings, and a generator frame per directory cost more than the counting.
    """
    if isinstance(value, bytes | str):
        return len(value) + _NODE_COST
    if not isinstance(value, Dir):
        return _NODE_COST
    size = 0
    pending = [value]
    while pending:
        node = pending.pop()
        size += _NODE_COST
        for key, child in node.items():
            if isinstance(child, str | bytes):
                size += len(key) + len(child) + _NODE_COST
            elif isinstance(child, Dir):
                size += len(key)
                pending.append(child)
            else:
                size += len(key) + _NODE_COST
    return size


class RenderCache:
    """The entries whose full instance and renderings are held, least recently read first.

    The bound is approximate (``approximate_size``); the entry being read is never evicted
    by its own insertion, so one oversized entry still works (and goes at the next miss).
    """

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._held: OrderedDict[Entry, int] = OrderedDict()
        self.packer = Packer()
        self.clock = clock  # wall-clock seconds: when notices change on their own (tests inject one)
        # What an entry's ETag and its renderings take besides the entry (``Entry.context``):
        self.members = Members()
        self.projects = Projects(self.members)
        self.notices = NoticeBoard(self.members)
        # Told the id of an entry whose renderings a new context dropped (``Entry.reproject``): the catalog builds
        # them ahead again (``RenderAhead.placed``), so a project's or a notice's change costs no guest's read.
        self.reprojected: Callable[[str], None] = _unheard

    def now(self) -> datetime:
        """The clock's moment, as notices compare it."""
        return datetime.fromtimestamp(self.clock(), UTC)

    def __len__(self) -> int:
        return len(self._held)

    def charge(self, entry: Entry, size: int) -> None:
        """Count ``size`` more bytes held by ``entry`` (now the most recently read); evict to fit."""
        self._held[entry] = self._held.get(entry, 0) + size
        self._held.move_to_end(entry)
        self.bytes += size
        while self.bytes > self.max_bytes and len(self._held) > 1:
            oldest, held = self._held.popitem(last=False)
            self.bytes -= held
            oldest.release()

    def touch(self, entry: Entry) -> None:
        """Mark ``entry`` as the most recently read."""
        if entry in self._held:
            self._held.move_to_end(entry)

    def drop(self, entry: Entry) -> None:
        """Forget ``entry`` (replaced or deleted) and what it held."""
        held = self._held.pop(entry, None)
        if held is not None:
            self.bytes -= held
        entry.release()

    def clear(self) -> None:
        """Forget every entry (a full reload)."""
        for entry in list(self._held):
            self.drop(entry)


class Packer:
    """Compresses stored documents with one preset dictionary: the first document packed.

    Zstandard with the dictionary digested once: similar documents then cost tens of bytes
    each, in about two microseconds (zlib with a dictionary took ten).
    """

    def __init__(self) -> None:
        self._packer: zstandard.ZstdCompressor | None = None
        self._unpacker = zstandard.ZstdDecompressor()

    def pack(self, text: bytes) -> bytes:
        """``text`` compressed."""
        if self._packer is None:
            zdict = zstandard.ZstdCompressionDict(text[-_ZDICT_LIMIT:], dict_type=zstandard.DICT_TYPE_RAWCONTENT)
            self._packer = zstandard.ZstdCompressor(level=_LEVEL, dict_data=zdict, write_checksum=False,
                                                   write_dict_id=False)
            self._unpacker = zstandard.ZstdDecompressor(dict_data=zdict)
        # A copy at its size: the bytes zstandard returns keeps its worst-case allocation (kilobytes).
        return bytes(memoryview(self._packer.compress(text)))

    def unpack(self, blob: bytes) -> bytes:
        """The text ``pack`` compressed into ``blob``."""
        return self._unpacker.decompress(blob)


class Entry:
    """One version of an instance: packed at rest, materialised and rendered on demand.

    At rest: the id, the packed addresses (shared with the address index), the compressed
    document text, its timestamp and, only when the instance has any, the rest (userdata,
    password, OS record) as an ``Instance`` without addresses or metadata.

    ``waiters`` are the change-watch requests held on this version (``watch``/``unwatch``);
    the catalog resolves them when it replaces or drops the entry (see ``imds.services.catalog.watch``).
    ``joined`` are the scopes (its project, its facility) whose records the ETag and the
    renderings took, once computed (``imds.services.catalog.members``): a change of those
    records resets them (``reproject``), and so does the clock reaching ``_until``, the next
    moment one of its notices changes on its own.
    """

    __slots__ = ("_blob", "_cache", "_etag", "_instance", "_rendered", "_rest", "_until", "_updated", "id", "joined",
                 "packed", "waiters")

    def __init__(self, stored: StoredInstance, cache: RenderCache) -> None:
        self.id = stored.id
        self._cache = cache
        self.packed = tuple(dict.fromkeys(pack_stored(text) for text in stored.addresses))
        self._blob = None if stored.document is None else cache.packer.pack(stored.document.encode())
        self._updated = stored.metadata_updated_at
        self._rest: Instance | None = None
        if stored.userdata is not None or stored.password is not None or stored.os is not None:
            self._rest = Instance(stored.id, userdata=stored.userdata, userdata_updated_at=stored.userdata_updated_at,
                                  password=stored.password, os=stored.os)
        self._instance: Instance | None = None
        self._rendered: dict[str, object] | None = None
        self._etag: bytes | None = None
        self._until: float | None = None
        self.joined: tuple[str, ...] | None = None
        self.waiters: set[asyncio.Future[None]] | None = None

    @property
    def addresses(self) -> tuple[Network, ...]:
        """The instance's addresses (without materialising the instance)."""
        return tuple(unpack_network(key) for key in self.packed)

    @property
    def os(self) -> OsRecord | None:
        """The instance's Ganeti OS record (without materialising the instance)."""
        return None if self._rest is None else self._rest.os

    @property
    def instance(self) -> Instance:
        """The full instance, materialised from the packed form on the first read."""
        instance = self._instance
        if instance is None:
            text = None if self._blob is None else self._cache.packer.unpack(self._blob)
            metadata = None if text is None else cast("JsonObject", json.loads(text))
            rest = self._rest or _BARE
            instance = Instance(self.id, self.addresses, metadata, self._updated, rest.userdata,
                                rest.userdata_updated_at, rest.password, rest.os)
            self._instance = instance
            self._cache.charge(self, _NODE_COST + (0 if text is None else len(text)) * _PARSED_FACTOR)
        return instance  # a cached read is marked recent by ``render``, which every flavor calls

    @property
    def rendered(self) -> Mapping[str, object]:
        """What ``render`` holds for this version now (empty once evicted); read-only."""
        return MappingProxyType(self._rendered) if self._rendered is not None else MappingProxyType({})

    @property
    def etag(self) -> bytes:
        """The strong ETag of this version of the instance and of what its context holds, computed once.

        Every read sends it. Without a project record or notices it is the instance's own ETag;
        notices count as the state guests see, so the ETag changes when a window opens.
        """
        if self._until is not None:
            self._fresh()
        if self._etag is None:
            etag = instance_etag(self.instance)
            context = self.context()
            extra = b""
            if context.project is not None:
                extra += project_tag(context.project)
            if context.notices:
                extra += notices_tag(context.notices)
            if extra:
                digest = hashlib.sha256(etag + extra).hexdigest()[:32]
                etag = b'"' + digest.encode() + b'"'
            self._etag = etag
        return self._etag

    def context(self) -> Context:
        """The project's record and the notices reaching this instance, now; joins their scopes.

        Notices are seen at the cache's clock; ``_until`` is the next moment one of them changes
        on its own, at which the ETag and the renderings are computed again.
        """
        doc = self.instance.metadata or {}
        project_id = sys.intern(project_of(doc).id)  # one string per project, not per entry
        cache = self._cache
        keys = self.joined = scope_keys(project_id, facility_of(doc))
        cache.members.join(self, keys)
        project = cache.projects.get(project_id)
        notices = cache.notices.affecting(self.id, keys)
        if not notices:
            return Context(project)
        now = cache.now()
        upcoming = next_change(notices, now)
        self._until = None if upcoming is None else upcoming.timestamp()
        return Context(project, seen(notices, now), now)

    def _fresh(self) -> None:
        """Past ``_until`` a notice changed on its own: forget what was computed with it."""
        if self._until is not None and self._cache.clock() >= self._until:
            self.reproject()

    def reproject(self) -> None:
        """The context changed (a project's or a notice's record, or the clock): forget the ETag and renderings.

        Watches on this version wake. The entry stays a member of its scopes (``joined``) until
        it is replaced, so leaving them then finds every set it is in.
        """
        self.wake()
        self._cache.drop(self)
        self._etag = None
        self._until = None
        self._cache.reprojected(self.id)

    def watch(self, waiter: asyncio.Future[None]) -> None:
        """Hold ``waiter`` on this version: ``wake`` resolves it when the version is replaced or dropped."""
        if self.waiters is None:
            self.waiters = set()
        self.waiters.add(waiter)

    def unwatch(self, waiter: asyncio.Future[None]) -> None:
        """Stop holding ``waiter`` (its request ended: a change, the timeout or a disconnect)."""
        if self.waiters is not None:
            self.waiters.discard(waiter)

    def wake(self) -> None:
        """Resolve every change-watch request held on this version."""
        for waiter in self.waiters or ():
            if not waiter.done():
                waiter.set_result(None)
        self.waiters = None

    def render(self, key: str, build: Callable[[Instance], T]) -> T:
        """The cached rendering ``key``, built once per version while the entry is cached."""
        if self._until is not None:
            self._fresh()
        rendered = self._rendered
        if rendered is not None and key in rendered:
            self._cache.touch(self)
            return cast("T", rendered[key])
        return self._keep(key, build(self.instance))

    def render_in_context(self, key: str, build: Callable[[Instance, Context], T]) -> T:
        """``render``, for a rendering that also takes the instance's context (project record, notices)."""
        if self._until is not None:
            self._fresh()
        rendered = self._rendered
        if rendered is not None and key in rendered:  # as ``render`` does, without making a closure per read
            self._cache.touch(self)
            return cast("T", rendered[key])
        return self._keep(key, build(self.instance, self.context()))

    def render_in_project(self, key: str, build: Callable[[Instance, ProjectAttributes | None], T]) -> T:
        """``render_in_context`` for a rendering that takes only the project's record."""
        return self.render_in_context(key, lambda instance, context: build(instance, context.project))

    def cached(self, key: str) -> object | None:
        """The rendering ``key`` if this version holds it now (marked recent), else None; builds nothing.

        Past ``_until`` (a notice changed on its own) nothing computed before is held, as for ``render``.
        """
        if self._until is not None:
            self._fresh()
        rendered = self._rendered
        if rendered is None:
            return None
        value = rendered.get(key)
        if value is not None:
            self._cache.touch(self)
        return value

    def keep(self, key: str, value: object, size: int) -> None:
        """Hold ``value`` as rendering ``key`` of this version, charged ``size`` bytes (``render`` estimates)."""
        if self._rendered is None:
            self._rendered = {}
        self._rendered[key] = value
        self._cache.charge(self, size + len(key))

    def _keep(self, key: str, value: T) -> T:
        if self._rendered is None:
            self._rendered = {}
        self._rendered[key] = value
        self._cache.charge(self, approximate_size(value) + len(key))
        return value

    def release(self) -> None:
        """Drop the materialised instance and renderings (the cache evicted this entry)."""
        self._instance = None
        self._rendered = None


_BARE = Instance("")
