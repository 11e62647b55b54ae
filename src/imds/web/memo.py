"""Whole answers to repeated instance reads, kept with the catalog entry they were made from.

A fleet asks the same few paths again and again (a boot crawls ~30, an agent polls one
every second). The first read of a path goes the whole way: handler, flavor guard,
rendering, headers. If the handler says its answer is ``fixed`` (``Reply.fixed``: nothing
but the caller's entry and the path went into it) and it is a 200, the status, headers and
body are kept here (with ``Reply.renew``, the recipe of the body: each recall makes a new
one, e.g. with a fresh ``random_seed``); the next read of that path by a caller resolving to that same entry is
answered from them, with the front's bookkeeping (limits, tally, read log) done as for any
read and hollow's hit counters the handler counted counted again.

Kept, and recalled, only for a request that

- is a GET or HEAD without a query string;
- carries no header but ``INERT`` ones, which no handler reads, and at most one
  ``Metadata-Flavor`` (GCE's clients send it with every read; the ``--instance-auth`` guard
  admits any): its value is part of the key (``memo_key``), so an answer is recalled only
  for a read carrying the very same one. A token, ``Metadata: true``, forwarding or
  signed-identity headers, ``If-None-Match`` all go the whole way;
- comes from a peer that is not a trusted proxy (whose callers are named by headers);
- reaches a server with no upstream lookup (pull mode's caches are per kind and expire).

The caller is found as the handlers find it (``Resolver.held`` on the socket peer; the
result is reused while ``Catalog.version`` stays put: no entry placed, replaced or dropped),
and the answer lives in that entry's render cache (``Entry.keep``): a new version of the instance,
a change of its project, an eviction or a reload forgets it with the renderings. So a
recall can only ever give what the handler gave for this version of this instance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from imds.models import METADATA, Network
from imds.services.catalog.addresses import parse_host
from imds.services.catalog.catalog import Catalog, Entry
from imds.services.identity.identify import is_trusted
from imds.services.lookup.resolve import Resolver
from imds.tally import Tally
from imds.web.routing import InstanceCall, Reply

# Request headers that no instance handler, guard or the front reads (a request with any other is not recalled).
INERT = frozenset({
    b"host", b"user-agent", b"accept", b"accept-encoding", b"accept-language", b"accept-charset", b"connection",
    b"keep-alive", b"te", b"cache-control", b"pragma", b"dnt", b"content-length", b"upgrade-insecure-requests",
})
_KEY = "reply "  # render-cache key prefix of a kept answer (its ``memo_key`` follows)
FLAVOR_HEADER = b"metadata-flavor"
_COST = 256  # bytes charged per kept answer besides its body and headers
MAX_CALLERS = 65536  # peers whose entry is remembered (all forgotten at once past it)


@dataclass(slots=True)
class Remembered:
    """A kept answer: status, headers (without ``date``), body; hollow's counters it counted.

    ``wire`` is free for a server to keep its own encoding of the answer (imds's front keeps
    the bytes it writes there). ``renew`` (``Reply.renew``) makes the body of each answer:
    ``recall`` then hands out a new ``Remembered`` each time, never the kept one.
    """

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    counts: tuple[tuple[tuple[str, bool], int], ...]
    wire: object = None
    renew: Callable[[], bytes] | None = None
    key: str = ""


def memo_key(path: str, headers: list[tuple[bytes, bytes]]) -> str | None:
    """What a read of ``path`` with ``headers`` is kept and recalled under; None: never (a header a handler reads).

    The path; with a ``Metadata-Flavor`` header, the path and its value (one such header at most).
    """
    if INERT.issuperset(map(itemgetter(0), headers)):
        return path
    flavor = None
    for name, value in headers:
        if name not in INERT:
            if name != FLAVOR_HEADER or flavor is not None:
                return None
            flavor = value
    return f"{path}\n{flavor.decode('latin-1')}" if flavor is not None else path


class ReadMemo:
    """Keeps and recalls ``Remembered`` answers (see the module docstring)."""

    def __init__(self, resolver: Resolver, catalog: Catalog, tally: Tally, trusted: Sequence[Network]) -> None:
        self._resolver = resolver
        self._catalog = catalog
        self._reads = tally.reads
        self._trusted = tuple(trusted)
        self._callers: dict[str, tuple[int, Entry | None]] = {}  # peer -> (catalog version, its entry then)

    def recall(self, host: str | None, key: str) -> Remembered | None:
        """The answer kept under ``key`` (``memo_key``) with the entry the peer ``host`` resolves to now, if any.

        A renewed answer (``Remembered.renew``) comes back as a new ``Remembered`` with a new body.
        """
        entry = self._entry(host)  # as ``kept`` does, one call less on every remembered read
        found = None if entry is None else entry.cached(_KEY + key)
        if not isinstance(found, Remembered):
            return None
        renew = found.renew
        return found if renew is None else Remembered(found.status, found.headers, renew(), found.counts, renew=renew,
                                                      key=key)

    def kept(self, host: str | None, key: str) -> Remembered | None:
        """What is kept under ``key`` with the entry the peer ``host`` resolves to now, as kept (never renewed)."""
        entry = self._entry(host)
        if entry is None:
            return None
        found = entry.cached(_KEY + key)
        return found if isinstance(found, Remembered) else None

    def counted(self) -> dict[tuple[str, bool], int]:
        """The hollow counters now (taken before a handler runs, to see what it counted)."""
        return dict(self._reads)

    def keep(self, call: InstanceCall, key: str, headers: list[tuple[bytes, bytes]], reply: Reply,
             before: dict[tuple[str, bool], int]) -> None:
        """Keep a fixed 200 answer under ``key`` with the entry it came from (if the peer resolves to that entry).

        The entry is the caller's, found by the handler (``InstanceCall.entry``): a fixed answer is
        made from it whether or not the reply carries its ETag (GCE's carries its own).
        """
        client = call.scope.get("client")
        entry = call.entry
        if entry is None or self._entry(client[0] if client else None) is not entry:
            return
        counts = tuple((key, count - before.get(key, 0)) for key, count in self._reads.items()
                       if count != before.get(key, 0))
        body = reply.body
        kept = Remembered(200, tuple(headers), body, counts, renew=reply.renew, key=key)
        entry.keep(_KEY + key, kept, _COST + len(body) + sum(len(n) + len(v) for n, v in headers))

    def replay(self, found: Remembered) -> None:
        """Count again what the handler counted when it made ``found``."""
        for key, count in found.counts:
            self._reads[key] += count

    def _entry(self, host: str | None) -> Entry | None:
        """The entry the peer ``host`` resolves to (``Resolver.held``), remembered until the catalog moves."""
        if host is None:
            return None
        version = self._catalog.version
        known = self._callers.get(host)
        if known is not None and known[0] == version:
            return known[1]
        address = parse_host(host)
        entry = None
        if address is not None and not (self._trusted and is_trusted(address, self._trusted)):
            entry = self._resolver.held(METADATA, address=address)
        if len(self._callers) >= MAX_CALLERS:
            self._callers.clear()
        self._callers[host] = (version, entry)
        return entry
