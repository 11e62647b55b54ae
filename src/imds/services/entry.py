"""One catalog entry, kept compact until it is read, and the bounded cache of what reads build.

A million instances must fit one replica's memory, so an entry at rest holds only the id,
its addresses packed as integers and the metadata document as zlib-compressed compact
JSON (with a preset dictionary: the first document packed, so similar documents cost a
few hundred bytes). The first read materialises the full ``Instance`` and every
rendering a flavor builds from it; those live on the entry while it is in the
``RenderCache``, a least-recently-read list bounded by an approximate byte count
(``--render-cache-bytes``). Evicting an entry drops them; the next read rebuilds them
from the packed form, byte for byte the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar, cast

from imds.models import Instance, JsonObject, Network
from imds.services.addresses import pack_network, unpack_network
from imds.services.render.tree import Dir
from imds.services.watch import instance_etag

T = TypeVar("T")
_ZDICT_LIMIT = 32768  # zlib's window: a longer preset dictionary is not used
_PARSED_FACTOR = 6  # approximate bytes of parsed Python objects per byte of compact JSON
_NODE_COST = 100  # approximate bytes of a tree node or cached value beside its text


def approximate_size(value: object) -> int:
    """A rough byte count of a cached value (text lengths plus a fixed cost per node)."""
    if isinstance(value, (bytes, str)):
        return len(value) + _NODE_COST
    if isinstance(value, Dir):
        return _NODE_COST + sum(len(key) + approximate_size(child) for key, child in value.items())
    return _NODE_COST


class RenderCache:
    """The entries whose full instance and renderings are held, least recently read first.

    The bound is approximate (``approximate_size``); the entry being read is never evicted
    by its own insertion, so one oversized entry still works (and goes at the next miss).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._held: OrderedDict[Entry, int] = OrderedDict()
        self.zdict: bytes | None = None

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


class Entry:
    """One version of an instance: packed at rest, materialised and rendered on demand.

    ``waiters`` are the change-watch requests held on this version; the catalog resolves
    them when it replaces or drops the entry (see ``imds.services.watch``).
    """

    __slots__ = ("_addresses", "_blob", "_cache", "_etag", "_instance", "_rendered", "_shell", "id", "waiters")

    def __init__(self, instance: Instance, cache: RenderCache) -> None:
        self.id = instance.id
        self._cache = cache
        self._addresses = tuple(pack_network(network) for network in instance.addresses)
        self._blob = None if instance.metadata is None else self._compress(instance.metadata)
        self._shell = dataclasses.replace(instance, addresses=(), metadata=None)
        self._instance: Instance | None = None
        self._rendered: dict[str, object] | None = None
        self._etag: bytes | None = None
        self.waiters: set[asyncio.Future[None]] | None = None

    @property
    def addresses(self) -> tuple[Network, ...]:
        """The instance's addresses (without materialising the instance)."""
        return tuple(unpack_network(key) for key in self._addresses)

    @property
    def instance(self) -> Instance:
        """The full instance, materialised from the packed form on the first read."""
        instance = self._instance
        if instance is None:
            metadata = None if self._blob is None else self._decompress(self._blob)
            instance = dataclasses.replace(self._shell, addresses=self.addresses, metadata=metadata)
            self._instance = instance
            blob = 0 if self._blob is None else len(self._blob)
            self._cache.charge(self, _NODE_COST + blob * _PARSED_FACTOR * 2)
        return instance  # a cached read is marked recent by ``render``, which every flavor calls

    @property
    def etag(self) -> bytes:
        """The strong ETag of this version of the instance, computed once (every read sends it)."""
        if self._etag is None:
            self._etag = instance_etag(self.instance)
        return self._etag

    def wake(self) -> None:
        """Resolve every change-watch request held on this version."""
        for waiter in self.waiters or ():
            if not waiter.done():
                waiter.set_result(None)
        self.waiters = None

    def render(self, key: str, build: Callable[[Instance], T]) -> T:
        """The cached rendering ``key``, built once per version while the entry is cached."""
        rendered = self._rendered
        if rendered is not None and key in rendered:
            self._cache.touch(self)
            return cast("T", rendered[key])
        value = build(self.instance)
        if self._rendered is None:
            self._rendered = {}
        self._rendered[key] = value
        self._cache.charge(self, approximate_size(value) + len(key))
        return value

    def release(self) -> None:
        """Drop the materialised instance and renderings (the cache evicted this entry)."""
        self._instance = None
        self._rendered = None

    def _compress(self, document: JsonObject) -> bytes:
        text = json.dumps(document, separators=(",", ":")).encode()
        if self._cache.zdict is None:
            self._cache.zdict = text[-_ZDICT_LIMIT:]
        packer = zlib.compressobj(level=6, zdict=self._cache.zdict)
        return packer.compress(text) + packer.flush()

    def _decompress(self, blob: bytes) -> JsonObject:
        zdict = self._cache.zdict
        unpacker = zlib.decompressobj(zdict=zdict) if zdict is not None else zlib.decompressobj()
        return cast("JsonObject", json.loads(unpacker.decompress(blob) + unpacker.flush()))
