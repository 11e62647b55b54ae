"""Trees: what the path-based flavors (EC2, later OpenStack and NoCloud) serve.

A tree is a ``Dir`` of keys to leaves (``str``/``bytes``, or ``Later``: made when first read)
and sub-``Dir``s. Listings are
derived from the tree, never written by hand: one entry per line, a subtree entry ends in
``/`` (unless its parent is ``bare``, as hollow's 2009-04-04 layout is), and a ``label``
can replace the shown text (AWS lists ``public-keys/0`` as ``0=name``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future


class Later:
    """A leaf whose text is made apart from the tree (``make``, called once; then kept in ``value``).

    For what is too costly to make while a server's event loop waits: an identity signature
    is a private-key operation (half a millisecond or more). ``start`` has an executor make it
    (``pending`` is that job); ``body`` makes it in place if nobody did.
    """

    __slots__ = ("_make", "pending", "value")

    def __init__(self, make: Callable[[], str]) -> None:
        self._make = make
        self.value: str | None = None
        self.pending: Future[str] | None = None

    def made(self) -> str:
        """The leaf's text, made now if it was not yet (safe on a worker thread: at worst made twice, kept once)."""
        value = self.value
        if value is None:
            value = self.value = self._make()
        return value

    def start(self, executor: Executor) -> Future[str]:
        """The job making it on ``executor``: submitted by the first call, the same one after."""
        pending = self.pending
        if pending is None:
            pending = self.pending = executor.submit(self.made)
        return pending


Leaf = str | bytes | Later


class Dir(dict[str, "Leaf | Dir"]):
    """A directory node.

    Args:
        items: the children, in listing order.
        labels: key → text shown in the listing instead of the key (and without a slash).
        bare: list subtrees without the trailing ``/``.
    """

    def __init__(
        self,
        items: Mapping[str, Leaf | Dir] | Iterable[tuple[str, Leaf | Dir]] = (),
        *,
        labels: Mapping[str, str] | None = None,
        bare: bool = False,
    ) -> None:
        super().__init__(items)
        self.labels = dict(labels or {})
        self.bare = bare

    def listing(self) -> str:
        """The directory listing: one entry per line, no trailing newline."""
        lines = []
        for key, child in self.items():
            if key in self.labels:
                lines.append(self.labels[key])  # a label is shown as is (AWS: "0=name", no slash)
            else:
                lines.append(key + "/" if isinstance(child, Dir) and not self.bare else key)
        return "\n".join(lines)


def resolve(root: Dir, path: str) -> Leaf | Dir | None:
    """The node at a ``/``-separated path; empty segments (a trailing slash) are ignored."""
    node: Leaf | Dir = root
    for part in path.split("/"):
        if not part:
            continue
        if not isinstance(node, Dir) or part not in node:
            return None
        node = node[part]
    return node


def body(node: Leaf | Dir) -> bytes:
    """What a GET of this node answers: the listing of a Dir, or the leaf's bytes."""
    if isinstance(node, Dir):
        return node.listing().encode()
    if isinstance(node, Later):
        return text_bytes(node.made())
    return text_bytes(node) if isinstance(node, str) else node


def text_bytes(text: str) -> bytes:
    """UTF-8 bytes of a leaf; a lone surrogate (only in records stored before writes refused them) becomes ``?``."""
    return text.encode("utf-8", "replace")


def walk(root: Dir, prefix: str = "") -> Iterable[tuple[str, Leaf | Dir]]:
    """Every (path, node) under ``root``, depth first, listing order."""
    for key, child in root.items():
        path = f"{prefix}{key}"
        yield path, child
        if isinstance(child, Dir):
            yield from walk(child, path + "/")
