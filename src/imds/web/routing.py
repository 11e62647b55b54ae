"""What the instance-facing flavors share: the request, the reply type and finding the calling instance."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal, Protocol

from imds.errors import ImdsError
from imds.models import METADATA, Address, Network
from imds.services.catalog.addresses import parse_host
from imds.services.catalog.catalog import Entry
from imds.services.identity.identify import caller_address
from imds.services.identity.proxied import Claim, SignedIdentity
from imds.services.lookup.resolve import Resolver
from imds.signing import HOST_HEADER, INSTANCE_ID_HEADER, SIGNATURE_HEADER, TENANT_HEADER, TIMESTAMP_HEADER
from imds.web.errors import error_parts

Scope = MutableMapping[str, Any]
TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"
BINARY = b"application/octet-stream"
READ_METHODS = frozenset({"GET", "HEAD"})
_SIGNED = tuple(name.encode() for name in (INSTANCE_ID_HEADER, SIGNATURE_HEADER, TENANT_HEADER, TIMESTAMP_HEADER,
                                           HOST_HEADER))
_SIGNED_SET = frozenset(_SIGNED)


class Unknown(Enum):
    """The value of an ``InstanceCall`` field the ``Locator`` has not looked at yet."""

    UNKNOWN = "unknown"


UNKNOWN: Final = Unknown.UNKNOWN


class InstanceCall:
    """One instance request as the flavors see it: made once by the front, handed to the handler.

    ``scope`` is the ASGI scope (method, path, headers). The ``Locator`` fills in the rest,
    each at most once per request (``UNKNOWN`` until then): ``address``, the caller's
    address; ``claim``, what a trusted proxy signed for (or None); and ``entry``, the
    caller's catalog entry however it was found (by address, or by the id a trusted proxy
    signed for). Finding it makes the reply ``versioned``: a version of the instance's
    document, so the front sends the entry's ETag with a 200 read and the change watch holds
    on it (``version``). A handler whose answer is no instance document (a message, a token,
    an error) calls ``unversioned``. Slotted, five fields: it costs what the scope keys it
    replaced did.
    """

    __slots__ = ("address", "claim", "entry", "scope", "versioned")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.entry: Entry | None = None
        self.versioned = False
        self.claim: Claim | Literal[Unknown.UNKNOWN] | None
        self.address: Address | Literal[Unknown.UNKNOWN] | None
        self.claim = self.address = UNKNOWN

    @property
    def version(self) -> Entry | None:
        """The entry whose ETag the reply carries and whose changes a watch waits for; None: no document."""
        return self.entry if self.versioned else None

    def found(self, entry: Entry) -> None:
        """The caller is ``entry``: the reply is a version of its document until ``unversioned``."""
        self.entry = entry
        self.versioned = True

    def unversioned(self) -> None:
        """The reply is no instance document: no ETag is sent and no change watch holds on it."""
        self.versioned = False


class Gate(Protocol):
    """A request header a flavor checks on each read (IMDSv2's token), so a fixed answer depends on it only so far.

    ``header``: the request header (lower case); ``says``: the one response header a read
    carrying it is answered with, first among the reply's headers (the token's TTL).
    """

    @property
    def header(self) -> bytes: ...

    @property
    def says(self) -> bytes: ...

    def admit(self, value: bytes | None, entry: Entry) -> tuple[tuple[bytes, bytes], ...] | None:
        """The headers answering a read of ``entry``'s document carrying ``value`` (None: no such header) now.

        None: the read is not admitted as it is (the handler answers it: a 401...).
        """


@dataclass(frozen=True)
class Reply:
    """A complete response. HEAD replies are cut to headers by the front.

    ``fixed``: the handler says this answer depends on nothing but the caller's catalog
    entry (this version of it) and the path: no other request header, no clock, no chance,
    no state outside the entry. The front may then keep it with the entry and answer the
    same read again from it (``imds.web.memo``). Set it only on answers rendered from the
    entry (``Entry.render``); leave it off for anything minted, timed or consumed.

    ``renew``: with ``fixed``, the answer is fixed but for a fresh part made anew for each
    answer (OpenStack's ``random_seed``): ``renew()`` makes the next body, of the same length
    as ``body`` (the kept ``content-length`` holds for each). The front keeps the recipe and
    answers each repeated read with a new body.

    ``gate``: with ``fixed``, the answer is fixed for every read the gate admits (an IMDSv2
    token's), whose headers the gate says (the token's TTL), first among the reply's headers.
    The front keeps the answer without them and recalls it for a read carrying the gate's
    header only through ``Gate.admit``.
    """

    status: int
    body: bytes
    content_type: bytes = TEXT
    headers: tuple[tuple[bytes, bytes], ...] = ()
    fixed: bool = False
    renew: Callable[[], bytes] | None = None
    gate: Gate | None = None


Handler = Callable[[InstanceCall], Awaitable[Reply]]


def error_reply(exc: ImdsError) -> Reply:
    """The JSON reply for an imds error (status from ``imds.web.errors``): the one place making it."""
    status, body, headers = error_parts(exc)
    return Reply(status, body, JSON, tuple(headers))


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (``name`` in lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class Locator:
    """Finds the calling instance from the socket peer (and trusted proxies only).

    The web side of ``imds.services.lookup.resolve.Resolver``: it reads the peer, the forwarded
    addresses and the signed-identity headers from the scope; the resolver does the rest
    (catalog, lookup cache, upstream lookup in pull mode, hollow's counters).
    """

    def __init__(
        self, resolver: Resolver, trusted: Sequence[Network], signed: SignedIdentity | None = None
    ) -> None:
        self._resolver = resolver
        self._trusted = tuple(trusted)
        self._signed = signed if trusted else None  # without trusted proxies nobody may claim an id

    def claim(self, call: InstanceCall) -> Claim | None:
        """The instance a trusted proxy signed for (``imds.services.identity.proxied``), or None.

        Checked once per request; a bad claim raises each time it is asked for.
        """
        if self._signed is None:
            return None
        known = call.claim
        if known is not UNKNOWN:
            return known
        scope = call.scope
        peer = scope.get("client")
        peer_address = parse_host(peer[0]) if peer else None
        found: dict[bytes, str] = {}
        for key, value in scope["headers"]:  # one pass for the five headers (the first copy of each)
            if key in _SIGNED_SET and key not in found:
                found[key] = value.decode("latin-1")
        values = [found.get(name) for name in _SIGNED]
        claim = call.claim = self._signed.claim(peer_address, *values)
        return claim

    def address(self, call: InstanceCall) -> Address | None:
        """The caller's address (see ``imds.services.identity.identify``), found once per request.

        A bad ``X-Forwarded-For`` raises each time it is asked for.
        """
        known = call.address
        if known is not UNKNOWN:
            return known
        scope = call.scope
        client = scope.get("client")
        peer = client[0] if client else None
        if not self._trusted:
            address = caller_address(peer, (), ())
        else:
            forwarded = [v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for"]
            address = caller_address(peer, forwarded, self._trusted)
        call.address = address
        return address

    async def entry(
        self, call: InstanceCall, kind: str = METADATA, *, count: bool = True, needs_record: bool = False
    ) -> Entry:
        """The calling instance, or InstanceNotFound (or the upstream lookup's error in pull mode).

        ``needs_record``: the caller must hold its ``kind`` record (looked up by id in pull
        mode; RecordNotFound otherwise). A miss is counted once per request (hollow's
        ``*_cache_miss_total``) unless ``count`` is False; the flavor counts the hit once it
        has answered (``served``).
        """
        claim = self.claim(call)
        address = self.address(call) if claim is None else None
        entry = await self._resolver.caller(kind, address=address, claim=claim, count=count, needs_record=needs_record)
        call.found(entry)  # by address or by claim alike: through a proxy the ETag and the watch work too
        return entry

    async def record(self, call: InstanceCall, entry: Entry, kind: str) -> Entry:
        """The caller holding its ``kind`` record (looked up by id in pull mode), else RecordNotFound."""
        found = await self._resolver.record(entry, kind)
        if found is not entry:
            call.entry = found  # the version a versioned reply carries; an unversioned one stays so
        return found

    def served(self, kind: str) -> None:
        """Count a ``kind`` read answered from what imds holds (hollow's ``*_cache_hit_total``)."""
        self._resolver.served(kind)


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


@dataclass(frozen=True)
class Pending(Reply):
    """A reply that still needs the request body (an instance's write, e.g. its OpenStack password).

    A handler returns ``Pending(complete=...)`` after identifying the caller, and the
    front awaits ``complete(receive)`` for the real reply (and the body).
    """

    status: int = 500
    body: bytes = b""
    complete: Callable[[Receive], Awaitable[Reply]] | None = None


@dataclass(frozen=True)
class Streamed(Reply):
    """A reply whose body is sent as ``chunks`` yields it, never held whole (the Ganeti OS image).

    ``length`` is the Content-Length when known before the first byte; ``close`` is awaited
    once the reply is done, however it ends. ``chunks`` raising
    after the headers went out aborts the connection (the front re-raises to the server):
    a body cut short must never end like a whole one.
    """

    status: int = 200
    body: bytes = b""
    chunks: AsyncGenerator[bytes] | None = None
    length: int | None = None
    close: Callable[[], Awaitable[None]] | None = None  # releases the source, also when no chunk was asked for
