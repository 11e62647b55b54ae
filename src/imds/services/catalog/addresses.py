"""IP address parsing, normalisation and the longest-prefix-match index.

Addresses are stored as networks: a host address is a /32 (or /128). IPv4-mapped IPv6
addresses (``::ffff:10.0.0.5``) are the IPv4 address they carry, everywhere. An address
written with a prefix and host bits set (``10.70.17.9/31``, as Equinix and hollow list them)
is, unless ``--strict-records``, the network it names (``10.70.17.8/31``) for matching, and
keeps its spelling for storage and display (``imds.models.SpelledIPv4Network``).
"""

from __future__ import annotations

import functools
import ipaddress
import socket

from imds.models import Address, Network, SpelledIPv4Network, SpelledIPv6Network

_BITS = {4: 32, 6: 128}
_SMALL = 8  # an instance with more addresses than this compares them as a set


@functools.lru_cache(maxsize=4096)  # a write's parts and an import's batch repeat addresses; memory stays small
def parse_network(text: str, *, spelled: bool = False) -> Network:
    """Parse a host address or CIDR in any valid textual form into a normalised network.

    A CIDR with host bits set (``10.1.2.3/24``) is refused rather than widened (it is either
    a typo for the network or a host written with its prefix) unless ``spelled``: hollow's
    reading, where ``10.70.17.9/31`` is the address as Equinix lists it and covers the
    network ``10.70.17.8/31``; it is then kept as sent (``models.SpelledIPv4Network``).
    Raises ValueError with a readable message. Memoised (networks are immutable): a write's
    metadata and userdata parts, and an import's two passes, name the same addresses.
    """
    value = text.strip()
    if not value or value != text or "%" in value:
        msg = f"{text!r} is not an IP address or CIDR"
        raise ValueError(msg)
    if "/" not in value:  # a host: one parse (ip_network and ip_interface would parse it twice)
        return _host_network(text, value)
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        msg = f"{text!r} is not an IP address or CIDR"
        raise ValueError(msg) from exc
    given = ipaddress.ip_interface(value).ip
    mapped = network.network_address.ipv4_mapped if isinstance(network, ipaddress.IPv6Network) else None
    if given != network.network_address:
        if not spelled:
            msg = (f"{text!r} has host bits set: write the network {network} or the host {given} "
                   "(a CIDR is never widened)")
            raise ValueError(msg)
        if mapped is not None and isinstance(given, ipaddress.IPv6Address) and given.ipv4_mapped is not None:
            return SpelledIPv4Network(f"{given.ipv4_mapped}/{max(network.prefixlen - 96, 0)}")
        return SpelledIPv6Network(value) if isinstance(network, ipaddress.IPv6Network) else SpelledIPv4Network(value)
    if mapped is not None:
        return ipaddress.ip_network(f"{mapped}/{max(network.prefixlen - 96, 0)}", strict=False)
    return network


def _host_network(text: str, value: str) -> Network:
    try:
        network = ipaddress.ip_network(value)  # a host: its /32 or /128, parsed once
    except ValueError as exc:
        msg = f"{text!r} is not an IP address or CIDR"
        raise ValueError(msg) from exc
    mapped = network.network_address.ipv4_mapped if isinstance(network, ipaddress.IPv6Network) else None
    return network if mapped is None else ipaddress.IPv4Network(mapped)


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


def pack_network(network: Network) -> int:
    """One integer for a network: its address, its prefix length and its IP version."""
    return _packed(int(network.network_address), network.prefixlen, network.version)


def pack_stored(text: str) -> int:
    """``pack_network`` of a stored address, without an ipaddress object.

    Stored texts are normalised (``str(network)``) or an address with a prefix kept as sent
    (``10.70.17.9/31``): the host bits are masked off, so both pack as the network they cover.
    """
    address, _, length = text.partition("/")
    prefixlen = int(length)
    if ":" in address:
        value, bits = int.from_bytes(socket.inet_pton(socket.AF_INET6, address)), 128
        return (value >> (bits - prefixlen) << (bits - prefixlen) << 8 | prefixlen) << 1 | 1
    value, bits = int.from_bytes(socket.inet_aton(address)), 32
    return (value >> (bits - prefixlen) << (bits - prefixlen) << 8 | prefixlen) << 1


def unpack_network(key: int) -> Network:
    """The network ``pack_network`` packed into ``key``."""
    value, prefixlen = key >> 9, (key >> 1) & 0xFF
    if key & 1:
        return ipaddress.IPv6Network((value, prefixlen))
    return ipaddress.IPv4Network((value, prefixlen))


def _packed(value: int, prefixlen: int, version: int) -> int:
    return (value << 8 | prefixlen) << 1 | (version == 6)


class AddressIndex:
    """Longest-prefix match from an address to the id of the instance holding it.

    One dict maps each packed network (``pack_network``: value, prefix length, version) to
    its holder; a lookup tries the prefix lengths present, longest first. Hosts and CIDRs,
    v4 and v6, are handled alike. An instance's packed tuple is shared with its catalog
    entry (``assign_packed``), so an address costs one int and one dict slot.
    """

    def __init__(self) -> None:
        self._tables: dict[int, str] = {}
        self._lengths: dict[int, list[int]] = {4: [], 6: []}
        self._counts: dict[int, int] = {}  # networks held per (prefix length << 1 | is IPv6)
        self._held: dict[str, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._tables)

    def assign(self, instance_id: str, addresses: tuple[Network, ...]) -> None:
        """Make ``addresses`` the instance's addresses; they are taken from any other holder."""
        self.assign_packed(instance_id, tuple(dict.fromkeys(pack_network(network) for network in addresses)))

    def assign_packed(self, instance_id: str, keys: tuple[int, ...]) -> list[tuple[int, str]]:
        """``assign`` with the addresses packed (``pack_network``) and without duplicates.

        Returns the (address, holder) pairs it took from another instance.
        """
        taken: list[tuple[int, str]] = []
        wanted: tuple[int, ...] | set[int] = keys if len(keys) <= _SMALL else set(keys)
        for key in self._held.get(instance_id, ()):
            if key not in wanted:
                self._remove(key, instance_id)
        for key in keys:
            previous = self._tables.get(key)
            if previous is None:
                self._count(key, 1)
            elif previous != instance_id:
                taken.append((key, previous))
                rest = tuple(held for held in self._held.get(previous, ()) if held != key)
                if rest:
                    self._held[previous] = rest
                else:
                    self._held.pop(previous, None)
            self._tables[key] = instance_id
        if keys:
            self._held[instance_id] = keys
        else:
            self._held.pop(instance_id, None)
        return taken

    def forget(self, instance_id: str) -> None:
        """Remove every address the instance holds."""
        self.assign_packed(instance_id, ())

    def lookup(self, address: Address) -> str | None:
        """The holder of the longest prefix containing ``address``, or None."""
        version = address.version
        value = int(address)
        bits = _BITS[version]
        for length in self._lengths[version]:
            holder = self._tables.get(_packed(value >> (bits - length) << (bits - length), length, version))
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
            key = _packed(value >> (bits - length) << (bits - length), length, version)
            holder = self._tables.get(key)
            if holder is not None:
                found.append((unpack_network(key), holder))
        return found

    def _count(self, key: int, delta: int) -> None:
        kind = key & 0x1FF
        count = self._counts.get(kind, 0) + delta
        if count:
            self._counts[kind] = count
        else:
            del self._counts[kind]
        if count in (0, 1):
            v6 = kind & 1
            self._lengths[6 if v6 else 4] = sorted((k >> 1 for k in self._counts if k & 1 == v6), reverse=True)

    def _remove(self, key: int, instance_id: str) -> None:
        if self._tables.get(key) != instance_id:
            return
        del self._tables[key]
        self._count(key, -1)
