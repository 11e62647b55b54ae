"""Warnings about instances inside a trusted-proxy network.

A peer inside a ``--trusted-proxy`` network is believed when it names another caller in
``X-Forwarded-For``; an instance whose address lies in such a network can therefore read
any other instance's data. That is a configuration mistake imds cannot fix for the
operator, so it says so: once at startup for what is stored, and on every write that
binds such an address (a ``warnings`` list in the answer, and a log line).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from imds import log
from imds.models import Network
from imds.services.catalog.addresses import display

_log = log.get("proxytrust")


def inside_trusted(addresses: Iterable[Network], trusted: Sequence[Network]) -> list[str]:
    """A warning per address that overlaps a trusted-proxy network."""
    return [
        f"{display(address)} overlaps the trusted-proxy network {proxy}: a caller there can impersonate "
        "any instance with X-Forwarded-For (see SECURITY.md)"
        for address in addresses
        for proxy in trusted
        if address.version == proxy.version and address.overlaps(proxy)
    ]


def warn_stored(holdings: Iterable[tuple[str, tuple[Network, ...]]], trusted: Sequence[Network]) -> int:
    """Log one warning per stored instance holding an address in a trusted-proxy network; how many."""
    if not trusted:
        return 0
    count = 0
    for instance_id, addresses in holdings:
        found = inside_trusted(addresses, trusted)
        if found:
            count += 1
            _log.warning("instance.inside_trusted_proxy", instance_id=instance_id, problems=found)
    return count
