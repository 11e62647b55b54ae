"""How ``imds proxy`` learns which instance is calling: the ``Identifier`` protocol.

An identification mode is one small class. ``imds proxy`` builds exactly one, starts it
before serving, asks it about every request's socket peer, and stops it on shutdown:

- ``--map FILE``: ``imds.proxy.mapfile.MapIdentifier`` (source IP on an isolated network);
- ``--ovsdb unix:PATH --inport``: the Dragonflow scheme (source IP ``128.0.0.0 | ofport``,
  ofport → Interface ``external_ids:vm-uuid`` live from OVSDB), added in its own module.

To add a mode: write a class satisfying ``Identifier`` in a new module, add its options to
``imds.config.PROXY_OPTIONS`` and one branch to ``imds.cli.proxy.identifier_for``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from imds.models import Address


@dataclass(frozen=True)
class Identity:
    """Who a request comes from: the instance id and, when known, its tenant (project) id."""

    instance_id: str
    tenant_id: str | None = None


class Identifier(Protocol):
    """Maps a request's socket peer address to the instance behind it.

    ``identify`` is awaited once per request on the proxy's event loop, so it must answer
    from memory (a dict lookup): keep OVSDB monitors, file watches and the like in a
    background task started by ``start`` and cancelled by ``stop``. It receives the peer
    as a parsed address (IPv6 zone dropped, IPv4-mapped IPv6 unwrapped) and returns None
    for a peer it does not know; the proxy then answers 404 without contacting upstream.
    Only the socket peer is ever passed: headers the VM sent are never consulted.
    """

    async def start(self) -> None:
        """Load the initial state (raise ``imds.errors.ConfigError`` if it is unusable) and start watching."""

    async def stop(self) -> None:
        """Stop watching; called once on shutdown."""

    async def identify(self, peer: Address) -> Identity | None:
        """The instance behind ``peer``, or None."""
