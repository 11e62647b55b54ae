"""Who is asking: the caller's address, from the socket peer and trusted proxies only.

The socket peer is the caller unless it lies inside a configured trusted-proxy network.
Only then is ``X-Forwarded-For`` read, right to left, and the first address that is not
itself a trusted proxy is the caller: every entry left of it could have been written by
the client. No proxy is trusted by default.
"""

from __future__ import annotations

from collections.abc import Sequence

from imds.errors import InvalidInput
from imds.models import Address, Network
from imds.services.catalog.addresses import parse_host


def is_trusted(address: Address, trusted: Sequence[Network]) -> bool:
    """Whether ``address`` lies inside a trusted-proxy network."""
    return any(address.version == net.version and address in net for net in trusted)


def caller_address(peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[Network]) -> Address | None:
    """The address to identify the caller by; None when the peer is not an IP address.

    ``forwarded_for`` holds the raw ``X-Forwarded-For`` header values in order. A
    malformed entry that would decide the answer raises InvalidInput.
    """
    address = parse_host(peer) if peer else None
    if address is None or not trusted or not is_trusted(address, trusted):
        return address
    entries = [item.strip() for value in forwarded_for for item in value.split(",") if item.strip()]
    for entry in reversed(entries):
        hop = parse_host(entry)
        if hop is None:
            raise InvalidInput.one("X-Forwarded-For", f"{entry!r} is not an IP address")
        if not is_trusted(hop, trusted):
            return hop
        address = hop
    return address
