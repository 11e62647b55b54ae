"""A network-namespace "instance" on a veth pair: what the Ganeti tests run a guest in.

``netns_guest(tag, second)`` makes a namespace with one veth end at ``198.<second>.x.y/30``
(random /30, names carrying ``tag`` and a random suffix), the other end in the root namespace,
yields a ``Guest`` and removes both on the way out, asserting the namespace is gone.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; with ``check``, assert it exited 0 (its stderr in the message)."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr}"
    return done


@dataclass(frozen=True)
class Guest:
    """A netns "instance": its name, its address, and the root namespace's address on the veth pair."""

    netns: str
    address: str
    host: str

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the namespace (never checked: the caller asserts)."""
        return run("ip", "netns", "exec", self.netns, *argv, check=False, timeout=timeout)


@contextmanager
def netns_guest(tag: str, second: int) -> Iterator[Guest]:
    """A fresh namespace "instance" at 198.<second>.x.y/30; both veth ends and the namespace removed after."""
    suffix = secrets.token_hex(3)
    netns, outside, inside = f"{tag}i{suffix}", f"{tag}o{suffix}", f"{tag}v{suffix}"
    base, third = secrets.randbelow(64) * 4, secrets.randbelow(256)
    host, address = f"198.{second}.{third}.{base + 1}", f"198.{second}.{third}.{base + 2}"
    run("ip", "netns", "add", netns)
    try:
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        run("ip", "link", "set", inside, "netns", netns)
        run("ip", "addr", "add", f"{host}/30", "dev", outside)
        run("ip", "link", "set", outside, "up")
        run("ip", "netns", "exec", netns, "ip", "addr", "add", f"{address}/30", "dev", inside)
        run("ip", "netns", "exec", netns, "ip", "link", "set", inside, "up")
        yield Guest(netns, address, host)
    finally:
        run("ip", "link", "del", outside, check=False)
        run("ip", "netns", "del", netns, check=False)
    assert netns not in run("ip", "netns", "list").stdout
