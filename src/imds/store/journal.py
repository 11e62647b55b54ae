"""What a write block did, so the writing process can update its catalog without re-reading.

Each ``Store.write()`` block records its primitive operations in a ``Journal`` as the
store carried them out (values as the store holds them, its own timestamps). ``start``
is the change-feed position the block began from and ``end`` the position after it: a
catalog that has applied everything up to ``start`` reaches exactly the store's state at
``end`` by replaying ``ops``; otherwise it must catch up from the feed instead.

The journal chain, and its one owner type, ``Group``:

- Who appends: the store. Every journal that commits joins exactly one ``Group`` (the
  blocks committed in one transaction; a group commit may hold many, the memory store
  makes one group per block) with ``Group.add``, in commit order. Once a group is
  committed, the SQL group commit calls ``Group.follow(previous)`` with the group it
  committed just before; the group links to it (``before``) only when it starts exactly
  where that one ended. (The memory store links nothing: a journal of it that does not
  start at the catalog's position makes the catalog catch up from the feed instead.)
- Who walks: the writing process's catalog (``Catalog.written``), after the block's
  ``write()`` has exited. ``Group.pending()`` hands it the groups it has not fully
  applied yet, from the journal's own group back along ``before``, oldest first, and
  cuts the links it walked.
- The invariant: along ``before``, groups are contiguous in the feed (each starts where
  the one before it ended) and in commit order, and their members are in commit order;
  so a catalog at the start of the oldest pending group reaches the end of the newest by
  replaying every member in turn. Blocks' callers resume in any order: one that hears of
  its commit first replays the earlier groups too, rather than re-reading the store.
  Links are cut once walked, so the chain only ever holds groups whose callers have not
  all resumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from imds.models import Network, Notice, NoticeKey, ProjectAttributes, ProjectKey, SideKey

# Operation kinds. The fields a put or remove sets or clears are ``Instance`` fields:
# the record kinds ("metadata", "userdata"), PASSWORD and OS; or PROJECT, a project's
# attributes (``instance_id`` is then the project's feed id, ``project:<id>``), or NOTICE, a
# lifecycle notice (``instance_id`` is the notice's feed id, ``notice:<id>``; the value a ``Notice``).
PUT, REMOVE, ADDRESSES, FORGET = "put", "remove", "addresses", "forget"
PASSWORD, OS, PROJECT, NOTICE = "password", "os", "project", "notice"


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

    @property
    def record_id(self) -> str:
        """A PROJECT or NOTICE operation's project or notice id (``instance_id`` holds its feed key)."""
        key = _SIDE_KEYS[self.field].parse(self.instance_id)
        return key.id if key is not None else ""


_SIDE_KEYS: dict[str, type[SideKey]] = {PROJECT: ProjectKey, NOTICE: NoticeKey}


def project_op(project_id: str, record: ProjectAttributes | None) -> Op:
    """A project's attributes put (``record``) or removed (None), under the project's feed key."""
    return Op(REMOVE if record is None else PUT, str(ProjectKey(project_id)), PROJECT, record)


def notice_op(notice_id: str, notice: Notice | None) -> Op:
    """A lifecycle notice put (``notice``) or removed (None), under the notice's feed key."""
    return Op(REMOVE if notice is None else PUT, str(NoticeKey(notice_id)), NOTICE, notice)


@dataclass(eq=False)
class Journal:
    """The operations of one write block, and where it sits in the change feed."""

    start: int = 0
    end: int = 0
    ops: list[Op] = field(default_factory=list)
    group: Group | None = None  # the group it committed in (set by ``Group.add``)
    applied: bool = False  # set by the catalog that replayed it (or caught up past it)
    keeps: bool = True  # False: the store records no ops (no catalog in this process replays its writes)

    def touched(self) -> list[str]:
        """Every instance id an operation of this block changed, first-seen order."""
        ids: dict[str, None] = {}
        for op in self.ops:
            ids[op.instance_id] = None
            ids.update(dict.fromkeys((op.moved or {}).values()))
        return list(ids)

    def pending(self) -> list[Group]:
        """``Group.pending`` of this journal's group (a journal that joined none stands alone)."""
        return (self.group or Group(self.start).add(self)).pending()


class Group:
    """The journals committed in one transaction, in commit order; one link of the journal chain."""

    __slots__ = ("before", "end", "members", "start")

    def __init__(self, start: int) -> None:
        self.start = self.end = start
        self.members: list[Journal] = []
        self.before: Group | None = None  # the group committed just before, when this one follows on from it

    def add(self, journal: Journal) -> Group:
        """Writer: ``journal`` committed (or is committing) in this group, after the members so far."""
        journal.group = self
        self.members.append(journal)
        self.end = journal.end
        return self

    def follow(self, previous: Group | None) -> None:
        """Writer: this group was committed right after ``previous``; link them if the feed runs on."""
        if previous is not None and previous.end == self.start:
            self.before = previous

    def pending(self) -> list[Group]:
        """Walker: this group and those before it holding a journal not yet applied, oldest first.

        The links walked are cut: whatever the caller does with them, they are not needed again.
        """
        chain: list[Group] = []
        group: Group | None = self
        while group is not None and not all(member.applied for member in group.members):
            chain.append(group)
            group, chain[-1].before = group.before, None
        chain.reverse()
        return chain
