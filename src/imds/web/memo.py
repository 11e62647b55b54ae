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
  for a read carrying the very same one; or else at most one gated header (``Gate``: a
  header a flavor checks on each read, IMDSv2's token), recalled only through the gate of
  the handler that made the answer (``Reply.gate``), which checks it for the caller's
  instance now and says the headers that go first (the token's TTL); a kept answer without
  a gate is never recalled for such a read. ``Metadata: true``, forwarding or
  signed-identity headers, ``If-None-Match``, two gated headers all go the whole way;
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
from typing import TypeVar, cast

from imds.models import METADATA, Network
from imds.services.catalog.addresses import parse_host
from imds.services.catalog.catalog import Catalog, Entry
from imds.services.identity.identify import is_trusted
from imds.services.lookup.resolve import Resolver
from imds.tally import Tally
from imds.web.routing import Gate, InstanceCall, Reply

# Request headers that no instance handler, guard or the front reads (a request with any other is not recalled).
INERT = frozenset({
    b"host", b"user-agent", b"accept", b"accept-encoding", b"accept-language", b"accept-charset", b"connection",
    b"keep-alive", b"te", b"cache-control", b"pragma", b"dnt", b"content-length", b"upgrade-insecure-requests",
})
_KEY = "replies"  # render-cache key of an entry's kept answers: {memo key: Remembered}
FLAVOR_HEADER = b"metadata-flavor"
_COST = 256  # bytes charged per kept answer besides its body: it, its headers' tuple, its slot (the rest is shared)
MAX_CALLERS = 65536  # peers whose entry is remembered (all forgotten at once past it)
MAX_SHARED = 65536  # keys, header pairs and counts shared by kept answers (all forgotten at once past it)
Header = tuple[bytes, bytes]  # a header: name (lower case), value
T = TypeVar("T")


@dataclass(slots=True)
class Remembered:
    """A kept answer: status, headers (without ``date``), body; hollow's counters it counted.

    ``wire`` is free for a server to keep its own encoding of the answer (imds's front keeps
    the bytes it writes there). ``renew`` (``Reply.renew``) makes the body of each answer,
    ``gate`` (``Reply.gate``) the first headers of an answer to a gated read: ``recall`` then
    hands out a new ``Remembered`` each time, never the kept one (its ``origin``), carrying the
    gated header's value it was recalled for (``credential``).
    """

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    counts: tuple[tuple[tuple[str, bool], int], ...]
    wire: object = None
    renew: Callable[[], bytes] | None = None
    key: str = ""
    gate: Gate | None = None
    credential: Header | None = None
    origin: Remembered | None = None


Read = tuple[str, Header | None]  # a read's memo key, and the gated header it carries (None: none)


def memo_key(path: str, headers: list[tuple[bytes, bytes]], gated: frozenset[bytes] = frozenset()) -> Read | None:
    """What a read of ``path`` with ``headers`` is kept and recalled under; None: never (a header a handler reads).

    The path; with a ``Metadata-Flavor`` header, the path and its value (one such header at
    most). With one header named in ``gated`` (and no ``Metadata-Flavor``), the path and that
    header, which only the answer's gate may admit (``ReadMemo.recall``).
    """
    if INERT.issuperset(map(itemgetter(0), headers)):
        return path, None
    flavor = credential = None
    for name, value in headers:
        if name in INERT:
            continue
        if flavor is not None or credential is not None:
            return None
        if name == FLAVOR_HEADER:
            flavor = value
        elif name in gated:
            credential = name, value
        else:
            return None
    return (f"{path}\n{flavor.decode('latin-1')}" if flavor is not None else path), credential


def _kept(entry: Entry, key: str) -> Remembered | None:
    """The answer ``entry`` keeps under ``key`` now, if any."""
    answers = entry.cached(_KEY)
    return answers.get(key) if isinstance(answers, dict) else None


class ReadMemo:
    """Keeps and recalls ``Remembered`` answers (see the module docstring)."""

    def __init__(self, resolver: Resolver, catalog: Catalog, tally: Tally, trusted: Sequence[Network],  # noqa: PLR0913
                 gated: frozenset[bytes] = frozenset(), *, alias: Callable[[str], str] | None = None) -> None:
        self._resolver = resolver
        self._alias = alias  # the path an answer is kept under (one answer for paths that read the same)
        self._catalog = catalog
        self._reads = tally.reads
        self._trusted = tuple(trusted)
        self._gated = gated  # the request headers the flavors' gates check (``Gate.header``)
        self._callers: dict[str, tuple[int, Entry | None]] = {}  # peer -> (catalog version, its entry then)
        # One object for each equal key, header pair or counts of kept answers: a fleet's answers differ in little
        # (a crawl keeps ~40 answers per instance; shared, each costs about a third of its own copies).
        self._shared: dict[object, object] = {}

    def key(self, path: str, headers: list[tuple[bytes, bytes]]) -> Read | None:
        """``memo_key`` with the gated headers of this server's flavors, of the path kept for ``path`` (its alias)."""
        alias = self._alias
        return memo_key(path if alias is None else alias(path), headers, self._gated)

    def holds(self, entry: Entry, key: str) -> bool:
        """Whether ``entry`` keeps an answer under ``key`` now."""
        return _kept(entry, key) is not None

    def host_of(self, entry: Entry) -> str | None:
        """An address of ``entry``'s instance that resolves to ``entry`` (the caller of a read made ahead), if any."""
        for network in entry.addresses:
            host = str(network.network_address)
            if self._entry(host) is entry:
                return host
        return None

    def recall(self, host: str | None, key: str, credential: Header | None = None) -> Remembered | None:
        """The answer kept under ``key`` (``memo_key``) with the entry the peer ``host`` resolves to now, if any.

        ``credential``: the gated header the read carries (``memo_key``), which the
        kept answer's gate must admit now. A renewed answer (``Remembered.renew``) or one whose
        gate says headers comes back as a new ``Remembered``, with a new body or those headers first.
        """
        entry = self._entry(host)  # as ``again`` does, one call less on every remembered read
        found = None if entry is None else _kept(entry, key)
        if found is None or entry is None:
            return None
        said = self._said(found, credential, entry) if found.gate is not None or credential is not None else ()
        if said is None:
            return None
        renew = found.renew
        if renew is None and credential is None and not said:  # the kept answer itself (``again`` checks no gate)
            return found
        return Remembered(found.status, said + found.headers if said else found.headers,
                          found.body if renew is None else renew(), found.counts, renew=renew, key=key,
                          gate=found.gate, credential=credential, origin=found)

    def again(self, host: str | None, found: Remembered) -> bool:
        """Whether ``found`` (from ``recall``) still answers the same read by the peer ``host``: made anew if need be.

        The memo must still keep ``found`` (or what it was made from, its ``origin``) with the
        entry ``host`` resolves to now, and its gate admit its ``credential`` now. A renewed
        answer gets a new body, a gated one its gate's headers now; either loses ``wire``.
        """
        entry = self._entry(host)
        kept = None if entry is None else _kept(entry, found.key)
        origin = found.origin
        if origin is None or kept is not origin or entry is None:
            return origin is None and kept is found
        said = self._said(origin, found.credential, entry)
        if said is None:
            return False
        if said and said != found.headers[:len(said)]:  # the TTL moved on: the kept encoding is stale
            found.headers, found.wire = said + origin.headers, None
        if origin.renew is not None:
            found.body, found.wire = origin.renew(), None
        return True

    def counted(self) -> dict[tuple[str, bool], int]:
        """The hollow counters now (taken before a handler runs, to see what it counted)."""
        return dict(self._reads)

    def keep(self, call: InstanceCall, read: Read, headers: list[tuple[bytes, bytes]], reply: Reply,
             before: dict[tuple[str, bool], int]) -> None:
        """Keep a fixed 200 answer to ``read`` with the entry it came from (if the peer resolves to that entry).

        The entry is the caller's, found by the handler (``InstanceCall.entry``): a fixed answer is
        made from it whether or not the reply carries its ETag (GCE's carries its own). An answer
        to a gated read is kept without the header its gate says (``Gate.says``, the first), and
        only when the reply has a gate for that header.
        """
        client = call.scope.get("client")
        entry = call.entry
        if entry is None or self._entry(client[0] if client else None) is not entry:
            return
        key, credential = read
        gate = reply.gate
        if credential is not None:
            if gate is None or gate.header != credential[0] or not headers or headers[0][0] != gate.says:
                return
            headers = headers[1:]
        counts = tuple((counter, count - before.get(counter, 0)) for counter, count in self._reads.items()
                       if count != before.get(counter, 0))
        body = reply.body
        share = self._share
        key = share(key)
        kept = Remembered(200, tuple(map(share, headers)), body, share(counts), renew=reply.renew, key=key, gate=gate)
        answers = entry.cached(_KEY)
        if not isinstance(answers, dict):
            answers = {}
        answers[key] = kept
        entry.keep(_KEY, answers, _COST + len(body))  # the same dict again: only the charge grows

    def restore(self, before: dict[tuple[str, bool], int]) -> None:
        """Set the hollow counters back to ``before`` (``counted``): a read made ahead counts nothing."""
        reads = self._reads
        for counter in reads:
            reads[counter] = before.get(counter, 0)

    def replay(self, found: Remembered) -> None:
        """Count again what the handler counted when it made ``found``."""
        for key, count in found.counts:
            self._reads[key] += count

    def _share(self, value: T) -> T:
        """The one object held for values equal to ``value`` (``value`` itself the first time)."""
        shared = self._shared
        found = shared.get(value)
        if found is None:
            if len(shared) >= MAX_SHARED:
                shared.clear()
            shared[value] = found = value
        return cast("T", found)

    @staticmethod
    def _said(found: Remembered, credential: Header | None, entry: Entry) -> tuple[Header, ...] | None:
        """The headers ``found``'s gate says for a read carrying ``credential`` (None: no gated header); None: refused.

        An answer with no gate answers only reads without a gated header; a gate admits only its own header.
        """
        gate = found.gate
        if gate is None:
            return () if credential is None else None
        if credential is None:
            return gate.admit(None, entry)
        return gate.admit(credential[1], entry) if credential[0] == gate.header else None

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
