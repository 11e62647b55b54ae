"""What the instance-facing flavors share: the reply type and finding the calling instance."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from imds.errors import InstanceNotFound
from imds.models import Address, Network
from imds.services.catalog import Catalog, Entry
from imds.services.identify import caller_address

Scope = MutableMapping[str, Any]
TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"
BINARY = b"application/octet-stream"
READ_METHODS = frozenset({"GET", "HEAD"})


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
    """Finds the calling instance from the socket peer (and trusted proxies only)."""

    def __init__(self, catalog: Catalog, trusted: Sequence[Network]) -> None:
        self._catalog = catalog
        self._trusted = tuple(trusted)

    def address(self, scope: Scope) -> Address | None:
        """The caller's address (see ``imds.services.identify``)."""
        client = scope.get("client")
        peer = client[0] if client else None
        if not self._trusted:
            return caller_address(peer, (), ())
        forwarded = [v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for"]
        return caller_address(peer, forwarded, self._trusted)

    def entry(self, scope: Scope) -> Entry:
        """The calling instance, or InstanceNotFound."""
        address = self.address(scope)
        entry = self._catalog.lookup(address) if address is not None else None
        if entry is None:
            raise InstanceNotFound(str(address) if address is not None else None)
        return entry
