"""Which listen addresses ``imds serve`` binds: the default's ``[::1]`` only where the host has it."""

from __future__ import annotations

import socket

from imds import log
from imds.config import OPTIONS, Settings, parse_listen

_DEFAULT = tuple(parse_listen(value) for value in next(o for o in OPTIONS if o.name == "listen").default)


def has_ipv6_loopback() -> bool:
    """Whether ``::1`` can be bound here (no IPv6 support, or IPv6 disabled, says no)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def listen_addresses(settings: Settings, *, ipv6_loopback: bool | None = None) -> tuple[tuple[str, int], ...]:
    """``settings.listen``, minus the default ``[::1]`` listener on a host without IPv6 loopback.

    Addresses given with ``--listen`` / ``IMDS_LISTEN`` are always bound (a failure is an error).
    """
    if settings.http.listen != _DEFAULT:
        return settings.http.listen
    available = has_ipv6_loopback() if ipv6_loopback is None else ipv6_loopback
    if available:
        return settings.http.listen
    log.get("serve").warning("listen.ipv6_skipped", reason="this host has no IPv6 loopback (::1)")
    return tuple(address for address in settings.http.listen if address[0] != "::1")
