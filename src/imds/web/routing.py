"""What the instance-facing flavors share: the reply type and finding the calling instance."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from imds.errors import ImdsError, InstanceNotFound, RecordNotFound
from imds.metrics import Metrics
from imds.models import METADATA, Address, Network
from imds.services.addresses import parse_host
from imds.services.catalog import Catalog, Entry
from imds.services.identify import caller_address
from imds.services.lookup import Lookup, LookupNeeded
from imds.services.proxied import Claim, SignedIdentity
from imds.signing import INSTANCE_ID_HEADER, SIGNATURE_HEADER, TENANT_HEADER

Scope = MutableMapping[str, Any]
TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"
BINARY = b"application/octet-stream"
READ_METHODS = frozenset({"GET", "HEAD"})
# Set in the scope by the front after a lookup: True, or the error the lookup ended with.
LOOKED_UP = "imds.looked_up"
# Set in the scope once the signed-identity headers were checked: the Claim, or False.
CLAIM = "imds.claim"
_SIGNED = tuple(name.encode() for name in (INSTANCE_ID_HEADER, SIGNATURE_HEADER, TENANT_HEADER))
# Set in the scope by the Locator: the caller's catalog entry (the front adds its ETag).
ENTRY = "imds.entry"


@dataclass(frozen=True)
class Reply:
    """A complete response. HEAD replies are cut to headers by the front."""

    status: int
    body: bytes
    content_type: bytes = TEXT
    headers: tuple[tuple[bytes, bytes], ...] = ()


Handler = Callable[[Scope], Reply]


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (``name`` in lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class Locator:
    """Finds the calling instance from the socket peer (and trusted proxies only).

    With pull mode on, a miss raises ``LookupNeeded`` once per request; the front fetches
    and runs the handler again, and the second miss is final (or the lookup's error).
    """

    def __init__(
        self,
        catalog: Catalog,
        trusted: Sequence[Network],
        metrics: Metrics,
        lookup: Lookup | None = None,
        signed: SignedIdentity | None = None,
    ) -> None:
        self._catalog = catalog
        self._trusted = tuple(trusted)
        self._metrics = metrics
        self._lookup = lookup
        self._signed = signed if trusted else None  # without trusted proxies nobody may claim an id

    def claim(self, scope: Scope) -> Claim | None:
        """The instance a trusted proxy signed for (``imds.services.proxied``), or None.

        Checked once per request; a bad claim raises each time it is asked for.
        """
        if self._signed is None:
            return None
        known = scope.get(CLAIM)
        if known is not None:
            return known or None
        peer = scope.get("client")
        peer_address = parse_host(peer[0]) if peer else None
        values = [header(scope, name) for name in _SIGNED]
        claim = self._signed.claim(peer_address, *values)
        scope[CLAIM] = claim or False
        return claim

    def address(self, scope: Scope) -> Address | None:
        """The caller's address (see ``imds.services.identify``)."""
        client = scope.get("client")
        peer = client[0] if client else None
        if not self._trusted:
            return caller_address(peer, (), ())
        forwarded = [v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for"]
        return caller_address(peer, forwarded, self._trusted)

    def entry(self, scope: Scope, kind: str = METADATA, *, count: bool = True) -> Entry:
        """The calling instance, or InstanceNotFound (or LookupNeeded in pull mode).

        A miss is counted once per request (hollow's ``*_cache_miss_total``) unless ``count``
        is False; the flavor counts the hit once it has answered.
        """
        claim = self.claim(scope)
        if claim is not None:
            return self._claimed(scope, claim, kind, count=count)
        address = self.address(scope)
        entry = self._catalog.lookup(address) if address is not None else None
        if entry is None and address is not None and self._lookup is not None:
            cached = self._lookup.cached(kind, address)
            entry = self._catalog.get(cached) if cached is not None else None
            if entry is None:
                self._look_up(scope, LookupNeeded(kind, address=address), count=count)
        if entry is None:
            if count and LOOKED_UP not in scope:
                self._metrics.count_read(kind, hit=False)
            raise InstanceNotFound(str(address) if address is not None else None)
        scope[ENTRY] = entry
        return entry

    def _claimed(self, scope: Scope, claim: Claim, kind: str, *, count: bool) -> Entry:
        """The instance named by a verified claim, whatever its addresses (lookup by id in pull mode)."""
        entry = self._catalog.get(claim.instance_id)
        if entry is None and self._lookup is not None:
            self._look_up(scope, LookupNeeded(kind, instance_id=claim.instance_id), count=count)
        if entry is None or not claim.admits(entry.instance):
            # A tenant mismatch answers exactly like an unknown id.
            if count and LOOKED_UP not in scope:
                self._metrics.count_read(kind, hit=False)
            raise InstanceNotFound(f"instance {claim.instance_id}")
        return entry

    def record_missing(self, scope: Scope, missing: RecordNotFound) -> NoReturn:
        """The caller lacks a record type: look it up by id in pull mode, else re-raise."""
        if self._lookup is not None:
            self._look_up(scope, LookupNeeded(missing.kind, instance_id=missing.instance_id), count=True)
        raise missing

    def _look_up(self, scope: Scope, need: LookupNeeded, *, count: bool) -> None:
        outcome = scope.get(LOOKED_UP)
        if outcome is None:
            if count:
                self._metrics.count_read(need.kind, hit=False)
            raise need
        if isinstance(outcome, ImdsError):
            raise outcome


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


@dataclass(frozen=True)
class Pending(Reply):
    """A reply that still needs the request body (an instance's write, e.g. its OpenStack password).

    Handlers stay synchronous: one returns ``Pending(complete=...)`` after identifying the
    caller, and the front awaits ``complete(receive)`` for the real reply.
    """

    status: int = 500
    body: bytes = b""
    complete: Callable[[Receive], Awaitable[Reply]] | None = None
