"""``tap-meta``: the internal port haproxy listens behind, placed and addressed with ``ip``.

The userspace datapath creates internal ports as tap devices in the host's namespace. With
``--meta-netns`` the agent moves it into that namespace; after an ovs-vswitchd restart the
switch creates a fresh one in the host's namespace again, so ``ensure`` deletes the stale
copy in the namespace and moves the new one in. Addresses are (re)applied every time:
``replace`` is idempotent, and IPv6 goes on with ``nodad`` so haproxy can bind at once.

Extra prefixes routed to the device (in-port mode's ``128.0.0.0/16``, the source addresses
the flows write) never go into the main table, which would take that ordinary unicast block
from the host itself: they go into a table of their own, consulted by policy rules for
traffic sourced from tap-meta's address (the proxy's answers) or sent out of the device (a
socket bound to it), as Dragonflow's ``ip rule ... oif tap-metadata lookup N`` does. Every
other packet of the host follows its own routes. ``teardown`` removes both rules and the
table when the agent stops.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from imds.agent.command import run


def _exists(name: str, netns: str | None) -> bool:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    result = subprocess.run(  # noqa: S603 - ip(8) with an interface name
        [*prefix, "ip", "link", "show", "dev", name], capture_output=True, check=False, timeout=30
    )
    return result.returncode == 0


def _ip(netns: str | None, *args: str) -> str:
    prefix = ("ip", "netns", "exec", netns) if netns else ()
    return run(*prefix, "ip", *args)


@dataclass(frozen=True)
class MetaPort:
    """Where tap-meta lives and the addresses it carries (``240.0.0.1/16``, ``fd00:a9fe::1/64``)."""

    name: str
    netns: str | None
    address: str
    address6: str | None
    routes: tuple[str, ...] = ()  # extra on-link prefixes (in-port mode: 128.0.0.0/16), in ``table``
    table: int = 0  # the routing table (and rule priority) ``routes`` live in; 0: no routes

    def _rules(self) -> list[tuple[str, ...]]:
        """The policy rules sending tap-meta's own traffic to ``table`` (each an ``ip rule`` selector)."""
        source = self.address.split("/", 1)[0]
        return [("from", source), ("oif", self.name)]

    def present(self) -> bool:
        """Whether the device exists where it should (the switch has created it)."""
        return _exists(self.name, self.netns)

    def ensure(self) -> None:
        """Put the device in its namespace (replacing a stale copy), address it and bring it up."""
        if self.netns:
            if not _exists_netns(self.netns):
                run("ip", "netns", "add", self.netns)
                _ip(self.netns, "link", "set", "lo", "up")
            if _exists(self.name, None):
                if _exists(self.name, self.netns):
                    _ip(self.netns, "link", "del", self.name)
                run("ip", "link", "set", self.name, "netns", self.netns)
        _ip(self.netns, "addr", "replace", self.address, "dev", self.name)
        if self.address6:
            _ip(self.netns, "addr", "replace", self.address6, "dev", self.name, "nodad")
        _ip(self.netns, "link", "set", self.name, "up")
        if not self.routes:
            return
        for prefix in self.routes:
            _ip(self.netns, "route", "replace", prefix, "dev", self.name, "table", str(self.table))
        present = _ip(self.netns, "rule", "show", "table", str(self.table))
        for selector in self._rules():
            if " ".join(selector) not in present:
                _ip(self.netns, "rule", "add", *selector, "lookup", str(self.table), "pref", str(self.table))

    def teardown(self) -> None:
        """Remove the policy rules and the table ``ensure`` added (best effort: the agent is stopping)."""
        if not self.routes:
            return
        for selector in self._rules():
            _try(self.netns, "rule", "del", *selector, "lookup", str(self.table), "pref", str(self.table))
        _try(self.netns, "route", "flush", "table", str(self.table))


def _try(netns: str | None, *args: str) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *args], capture_output=True, check=False, timeout=30)  # noqa: S603 - ip(8)


def _exists_netns(name: str) -> bool:
    return name in run("ip", "netns", "list").split()
