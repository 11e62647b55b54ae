"""The answers to an instance's first reads, made and kept in the read memo before a guest asks.

Building renderings ahead (``imds.services.catalog.ahead``) leaves a boot's first reads the
handler's own work: the flavor's routing, the caller's lookup, the token check, the reply
and its headers, the memo keeping the answer. In a boot storm every read is a first read,
and that work was most of what a read cost (a 2,000-crawl storm: ~200 µs of server CPU per
request, ~120 µs when the same crawls came again). So once an instance's EC2 tree is built,
``AnswersAhead`` runs the real handler on each read a guest's crawl makes of it (every path
of the tree, ``Ec2Flavor.ahead_reads``) as if from the instance's own address
(``InstanceFront.prepare``), and the memo keeps each answer as that read would have. The
guest's first read is then answered as a repeat is: from the memo, its bookkeeping done
(hollow's counters counted, the token checked by the gate).

Nothing else changes: an answer is kept only if the memo would have kept the guest's
(``ReadMemo.keep``: a fixed 200, made from the entry the address resolves to now), and it
goes with the entry's renderings (a new version, an eviction). It is built in the same
slices, under the same share of the render cache (each answer is charged to it). The
identity signatures are made on their thread first: an entry waiting for them is built
again later (``Builder.build`` returns False).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from imds.services.catalog.catalog import Entry
from imds.web.memo import ReadMemo

Reads = tuple[list[str], list[tuple[bytes, bytes]]]  # paths, and the headers a guest's read of each carries
Scope = dict[str, Any]


class AnswersAhead:
    """A ``Builder`` (``imds.services.catalog.ahead``): the answers to ``reads_of(entry)``, made by ``prepare``."""

    def __init__(self, memo: ReadMemo, reads_of: Callable[[Entry], Reads | None],
                 prepare: Callable[[Scope], bool | None]) -> None:
        self._memo = memo
        self._reads_of = reads_of
        self._prepare = prepare
        self.made = 0  # answers made ahead so far

    def ready(self) -> bool:
        """Always: it waits on nothing of its own (signatures: ``build`` says False)."""
        return True

    def build(self, entry: Entry) -> bool:
        """Keep the answers to ``entry``'s reads not held yet; False when one must wait (a signature being made)."""
        reads = self._reads_of(entry)
        if reads is None:
            return False
        memo = self._memo
        host = memo.host_of(entry)
        if host is None:  # no address of its own resolves to it (another instance's is more specific)
            return True
        paths, headers = reads
        for path in paths:
            read = memo.key(path, headers)
            if read is None or memo.holds(entry, read[0]):
                continue
            made = self._prepare(_scope(path, headers, host))
            if made is False:
                return False
            self.made += made is True
        return True


def _scope(path: str, headers: list[tuple[bytes, bytes]], host: str) -> Scope:
    """The ASGI scope of a guest's plain GET of ``path`` from ``host``, as a server makes it."""
    return {"type": "http", "http_version": "1.1", "scheme": "http", "method": "GET", "path": path,
            "raw_path": path.encode("ascii"), "query_string": b"", "root_path": "", "headers": headers,
            "client": (host, 0), "server": None}
