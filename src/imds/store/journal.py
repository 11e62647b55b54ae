"""What a write block did, so the writing process can update its catalog without re-reading.

Each ``Store.write()`` block records its primitive operations in a ``Journal`` as the
store carried them out (values as the store holds them, its own timestamps). Blocks
committed together (group commit) share one ordered ``group`` list. ``start`` is the
change-feed position the block began from and ``end`` the position after it: a catalog
that has applied everything up to ``start`` reaches exactly the store's state at ``end``
by replaying ``ops``; otherwise it must catch up from the feed instead. ``before`` is the
group this process committed just before, when this one follows on from it: a caller
that hears of its commit first replays the earlier group too, rather than re-reading
the store (their callers resume in any order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from imds.models import Network

# Record fields an operation can set or clear ("metadata", "userdata", "password", "os").
PUT, REMOVE, ADDRESSES, FORGET = "put", "remove", "addresses", "forget"


@dataclass(frozen=True)
class Op:
    """One primitive the store carried out on ``instance_id``.

    ``put``: set ``field`` to ``value`` (creating the instance), stamped ``at``;
    ``remove``: clear ``field``; ``addresses``: ``value`` is the whole address list and
    ``moved`` the addresses taken from other instances; ``forget``: the instance is gone.
    """

    kind: str
    instance_id: str
    field: str = ""
    value: object = None
    at: datetime | None = None
    moved: dict[Network, str] | None = None


@dataclass(eq=False)
class Journal:
    """The operations of one write block, and where it sits in the change feed."""

    start: int = 0
    end: int = 0
    ops: list[Op] = field(default_factory=list)
    group: list[Journal] = field(default_factory=list)
    applied: bool = False  # set by the catalog that replayed it (or caught up past it)
    before: list[Journal] | None = None  # the group committed just before, if this follows on from it

    def touched(self) -> list[str]:
        """Every instance id an operation of this block changed, first-seen order."""
        ids: dict[str, None] = {}
        for op in self.ops:
            ids[op.instance_id] = None
            ids.update(dict.fromkeys((op.moved or {}).values()))
        return list(ids)
