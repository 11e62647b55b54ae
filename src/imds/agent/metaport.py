"""``tap-meta``: the internal port haproxy listens behind, placed and addressed with ``ip``.

The userspace datapath creates internal ports as tap devices in the host's namespace. With
``--meta-netns`` the agent moves it into that namespace; after an ovs-vswitchd restart the
switch creates a fresh one in the host's namespace again, so ``ensure`` deletes the stale
copy in the namespace and moves the new one in. Addresses are (re)applied every time:
``replace`` is idempotent, and IPv6 goes on with ``nodad`` so haproxy can bind at once.
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
    routes: tuple[str, ...] = ()  # extra on-link prefixes (in-port mode: 128.0.0.0/16)

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
        for prefix in self.routes:
            _ip(self.netns, "route", "replace", prefix, "dev", self.name)


def _exists_netns(name: str) -> bool:
    return name in run("ip", "netns", "list").split()
