"""Trees: what the path-based flavors (EC2, later OpenStack and NoCloud) serve.

A tree is a ``Dir`` of keys to leaves (``str``/``bytes``) and sub-``Dir``s. Listings are
derived from the tree, never written by hand: one entry per line, a subtree entry ends in
``/`` (unless its parent is ``bare``, as hollow's 2009-04-04 layout is), and a ``label``
can replace the shown text (AWS lists ``public-keys/0`` as ``0=name``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Leaf = str | bytes


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
