"""IP address parsing, normalisation and the longest-prefix-match index.

Addresses are stored as networks: a host address is a /32 (or /128). IPv4-mapped IPv6
addresses (``::ffff:10.0.0.5``) are the IPv4 address they carry, everywhere.
"""

from __future__ import annotations

import functools
import ipaddress

from imds.models import Address, Network

_BITS = {4: 32, 6: 128}


def parse_network(text: str) -> Network:
    """Parse a host address or CIDR in any valid textual form into a normalised network.

    A CIDR with host bits set (``10.1.2.3/24``) is refused rather than widened: it is
    either a typo for the network or a host written with its prefix, and guessing which
    would bind a different set of callers. Raises ValueError with a readable message.
    """
    value = text.strip()
    if not value or value != text or "%" in value:
        msg = f"{text!r} is not an IP address or CIDR"
        raise ValueError(msg)
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        msg = f"{text!r} is not an IP address or CIDR"
        raise ValueError(msg) from exc
    given = ipaddress.ip_interface(value).ip
    if given != network.network_address:
        msg = (f"{text!r} has host bits set: write the network {network} or the host {given} "
               "(a CIDR is never widened)")
        raise ValueError(msg)
    if isinstance(network, ipaddress.IPv6Network) and network.network_address.ipv4_mapped is not None:
        mapped = network.network_address.ipv4_mapped
        prefix = max(network.prefixlen - 96, 0)
        return ipaddress.ip_network(f"{mapped}/{prefix}", strict=False)
    return network


@functools.lru_cache(maxsize=65536)
def parse_host(text: str) -> Address | None:
    """Parse a caller address (a socket peer or an X-Forwarded-For entry); None if invalid.

    Accepts an optional port (``1.2.3.4:80``, ``[::1]:80``) and an IPv6 zone
    (``fe80::1%eth0``), and unwraps IPv4-mapped IPv6. Memoised: it runs on every instance
    read, and the set of callers is bounded (their parsing was a quarter of the hot path).
    """
    value = text.strip()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    value = value.split("%", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def display(network: Network) -> str:
    """How an address is shown in the API: hosts without a prefix, networks with one."""
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return str(network)


class AddressIndex:
    """Longest-prefix match from an address to the id of the instance holding it.

    One dict per (IP version, prefix length) maps the masked network integer to the
    holder; a lookup tries the prefix lengths present, longest first. Hosts and CIDRs,
    v4 and v6, are handled alike.
    """

    def __init__(self) -> None:
        self._tables: dict[tuple[int, int], dict[int, str]] = {}
        self._lengths: dict[int, list[int]] = {4: [], 6: []}
        self._held: dict[str, set[Network]] = {}

    def __len__(self) -> int:
        return sum(len(table) for table in self._tables.values())

    def assign(self, instance_id: str, addresses: tuple[Network, ...]) -> None:
        """Make ``addresses`` the instance's addresses; they are taken from any other holder."""
        wanted = set(addresses)
        for network in self._held.get(instance_id, set()) - wanted:
            self._remove(network, instance_id)
        for network in wanted:
            previous = self._table(network).get(int(network.network_address))
            if previous is not None and previous != instance_id:
                self._held.get(previous, set()).discard(network)
            self._table(network)[int(network.network_address)] = instance_id
        if wanted:
            self._held[instance_id] = wanted
        else:
            self._held.pop(instance_id, None)

    def forget(self, instance_id: str) -> None:
        """Remove every address the instance holds."""
        self.assign(instance_id, ())

    def lookup(self, address: Address) -> str | None:
        """The holder of the longest prefix containing ``address``, or None."""
        version = address.version
        value = int(address)
        bits = _BITS[version]
        for length in self._lengths[version]:
            holder = self._tables[(version, length)].get(value >> (bits - length) << (bits - length))
            if holder is not None:
                return holder
        return None

    def containing(self, address: Address) -> list[tuple[Network, str]]:
        """Every stored entry (network, holder) containing ``address``, longest prefix first.

        The first is the one ``lookup`` answers with; the rest also contain the address.
        """
        version, value, bits = address.version, int(address), _BITS[address.version]
        found: list[tuple[Network, str]] = []
        for length in self._lengths[version]:
            masked = value >> (bits - length) << (bits - length)
            holder = self._tables[(version, length)].get(masked)
            if holder is not None:
                network: Network = (ipaddress.IPv4Network((masked, length)) if version == 4
                                    else ipaddress.IPv6Network((masked, length)))
                found.append((network, holder))
        return found

    def _table(self, network: Network) -> dict[int, str]:
        key = (network.version, network.prefixlen)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
            self._lengths[network.version] = sorted({*self._lengths[network.version], network.prefixlen}, reverse=True)
        return table

    def _remove(self, network: Network, instance_id: str) -> None:
        key = (network.version, network.prefixlen)
        table = self._tables.get(key)
        if table is None or table.get(int(network.network_address)) != instance_id:
            return
        del table[int(network.network_address)]
        if not table:
            del self._tables[key]
            self._lengths[network.version].remove(network.prefixlen)
