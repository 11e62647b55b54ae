"""Meta addresses: one IPv4, one IPv6 and one MAC per VM port, from the provider ranges.

Every address a port gets is derived from one *offset* into the ranges: offset ``n`` is
``provider_cidr[n]``, ``provider_cidr6[n]`` and ``provider_base_mac + n``. Offset 1 is the
gateway (``tap-meta``: haproxy's address, MAC ``…:01``), offset 0 and the IPv4 broadcast are
never handed out. The agent stores ``provider_ip``/``provider_mac``/``provider_ip6`` in the
OVS Interface's ``other_config``; a restarted agent reads them back (``offset_of``) and keeps
them, so a VM's Meta addresses only change when its port goes away.

Usage::

    pool = Pool.parse("240.0.0.0/16", "fd00:a9fe::/64", "fa:16:ee:00:00:00")
    given = allocate(pool, {"tap1": None, "tap2": 7})   # {"tap1": Meta(2, ...), "tap2": Meta(7, ...)}
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from imds.errors import ConfigError, PoolExhausted

GATEWAY_OFFSET = 1
FIRST_OFFSET = 2
_MAC_ROOM = 0xFFFFFF


def format_mac(value: int) -> str:
    """``0xfa16ee000001`` → ``fa:16:ee:00:00:01``."""
    raw = f"{value:012x}"
    return ":".join(raw[i : i + 2] for i in range(0, 12, 2))


def parse_mac(text: str) -> int:
    """``fa:16:ee:00:00:01`` → its integer; ValueError when it is not a MAC."""
    parts = text.strip().lower().split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        raise ValueError(text)
    return int("".join(parts), 16)


@dataclass(frozen=True)
class Meta:
    """The Meta addresses of one port (or of the gateway, at offset 1)."""

    offset: int
    ip: ipaddress.IPv4Address
    ip6: ipaddress.IPv6Address
    mac: str


@dataclass(frozen=True)
class Pool:
    """The provider ranges the agent hands Meta addresses out of."""

    cidr: ipaddress.IPv4Network
    cidr6: ipaddress.IPv6Network
    base_mac: int

    @classmethod
    def parse(cls, cidr: str, cidr6: str, base_mac: str) -> Pool:
        """Validate the three options; ConfigError naming the flag at fault."""
        try:
            net = ipaddress.IPv4Network(cidr, strict=True)
        except ValueError as exc:
            raise ConfigError(f"--provider-cidr: {cidr!r} is not an IPv4 network (e.g. 240.0.0.0/16)") from exc
        try:
            net6 = ipaddress.IPv6Network(cidr6, strict=True)
        except ValueError as exc:
            raise ConfigError(f"--provider-cidr6: {cidr6!r} is not an IPv6 network (e.g. fd00:a9fe::/64)") from exc
        try:
            mac = parse_mac(base_mac)
        except ValueError as exc:
            raise ConfigError(f"--provider-base-mac: {base_mac!r} is not a MAC (e.g. fa:16:ee:00:00:00)") from exc
        if mac >> 40 & 1:
            raise ConfigError(f"--provider-base-mac: {base_mac} is a multicast MAC")
        pool = cls(net, net6, mac)
        if pool.capacity < 1:
            raise ConfigError(f"--provider-cidr: {cidr} leaves no address for a VM (a /30 or wider is needed)")
        return pool

    @property
    def last_offset(self) -> int:
        """The highest offset every range still has room for."""
        v4 = self.cidr.num_addresses - 2  # the broadcast address is never handed out
        v6 = self.cidr6.num_addresses - 1
        mac = _MAC_ROOM - (self.base_mac & _MAC_ROOM)  # never carry into the prefix (the first three octets)
        return min(v4, v6, mac)

    @property
    def capacity(self) -> int:
        """How many VM ports can get Meta addresses."""
        return max(0, self.last_offset - FIRST_OFFSET + 1)

    @property
    def gateway(self) -> Meta:
        """``tap-meta``'s addresses: the first host of each range."""
        return self.meta(GATEWAY_OFFSET)

    def meta(self, offset: int) -> Meta:
        """The addresses at ``offset``."""
        return Meta(offset, self.cidr[offset], self.cidr6[offset], format_mac(self.base_mac + offset))

    def offset_of(self, stored: str | None) -> int | None:
        """The offset of a stored ``provider_ip``, or None when it is absent or outside this pool."""
        if not stored:
            return None
        try:
            address = ipaddress.IPv4Address(stored)
        except ValueError:
            return None
        if address not in self.cidr:
            return None
        offset = int(address) - int(self.cidr.network_address)
        return offset if FIRST_OFFSET <= offset <= self.last_offset else None


def allocate(pool: Pool, ports: Mapping[str, int | None]) -> dict[str, Meta | PoolExhausted]:
    """Meta addresses for every port: its stored offset when valid and unique, else the lowest free one.

    ``ports`` maps a port name to the offset read back from OVSDB (None: never allocated).
    Ports are handled in name order, so the outcome does not depend on discovery order; a
    port that finds the pool full gets a ``PoolExhausted`` (the others are still served).
    """
    taken: dict[int, str] = {}
    result: dict[str, Meta | PoolExhausted] = {}
    waiting: list[str] = []
    for name in sorted(ports):
        offset = ports[name]
        if offset is not None and offset not in taken:
            taken[offset] = name
            result[name] = pool.meta(offset)
        else:
            waiting.append(name)
    free = (n for n in range(FIRST_OFFSET, pool.last_offset + 1) if n not in taken)
    for name in waiting:
        offset = next(free, None)
        if offset is None:
            result[name] = PoolExhausted(name, str(pool.cidr), pool.capacity)
            continue
        taken[offset] = name
        result[name] = pool.meta(offset)
    return result
