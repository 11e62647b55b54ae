"""The journal chain (``imds.store.journal.Group``): how writers link groups and how a catalog walks them."""

from __future__ import annotations

from datetime import UTC, datetime

from imds.models import Notice, NoticeKey, ProjectAttributes, ProjectKey
from imds.store.journal import NOTICE, PROJECT, PUT, REMOVE, Group, Journal, notice_op, project_op


def committed(start: int, *ends: int, previous: Group | None = None) -> Group:
    """A group starting at ``start`` whose members end at ``ends`` (in commit order), committed after ``previous``."""
    group = Group(start)
    at = start
    for end in ends:
        group.add(Journal(start=at, end=end))
        at = end
    group.follow(previous)
    return group


def test_add_makes_the_journal_a_member_and_moves_the_end() -> None:
    """``add`` keeps commit order, sets each journal's group, and the group ends where its last member ends."""
    group = committed(4, 5, 5, 7)
    assert [(member.start, member.end) for member in group.members] == [(4, 5), (5, 5), (5, 7)]
    assert all(member.group is group for member in group.members)
    assert (group.start, group.end) == (4, 7)


def test_follow_links_only_a_group_that_starts_where_the_previous_ended() -> None:
    """Contiguous in the feed: linked. A gap (another process wrote in between) or no previous group: not."""
    first = committed(0, 2)
    second = committed(2, 3, previous=first)
    after_a_gap = committed(5, 6, previous=second)
    assert second.before is first
    assert after_a_gap.before is None
    assert committed(0, 1).before is None


def test_pending_walks_back_to_the_last_applied_group_oldest_first_and_cuts_the_links() -> None:
    """Unapplied groups along ``before``, oldest first; a fully applied group ends the walk; walked links are cut."""
    done = committed(0, 1)
    done.members[0].applied = True
    older = committed(1, 2, 3, previous=done)
    newer = committed(3, 4, previous=older)
    assert newer.members[0].pending() == [older, newer]
    assert (older.before, newer.before) == (None, None)
    assert newer.pending() == [newer]  # cut: the chain is not walked twice
    older.members[0].applied = True
    assert older.pending() == [older]  # a group with one journal left to apply is still pending
    older.members[1].applied = True
    assert older.pending() == []


def test_a_journal_that_joined_no_group_stands_alone() -> None:
    """``Journal.pending`` of a journal outside any group: a group of its own."""
    journal = Journal(start=3, end=4)
    (group,) = journal.pending()
    assert group.members == [journal]
    assert journal.group is group


def test_side_record_ops_carry_the_feed_key_and_give_back_the_record_id() -> None:
    """A project's or notice's op names it by its feed key (what the feed and ``touched`` see); ``record_id`` its id."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    record = ProjectAttributes("acme", {"a": "1"}, 1, at)
    put, removed = project_op("acme", record), project_op("acme", None)
    assert (put.kind, put.instance_id, put.field, put.value) == (PUT, str(ProjectKey("acme")), PROJECT, record)
    assert (removed.kind, removed.instance_id, removed.value) == (REMOVE, str(ProjectKey("acme")), None)
    notice = Notice("instance", "i-1", "stop", at, id="0123456789abcdef0")
    op = notice_op(notice.id, notice)
    assert (op.kind, op.instance_id, op.field, op.value) == (PUT, str(NoticeKey(notice.id)), NOTICE, notice)
    assert notice_op(notice.id, None).kind == REMOVE
    assert [put.record_id, removed.record_id, op.record_id] == ["acme", "acme", notice.id]
    assert put.instance_id != "acme"  # never an instance id: the prefix keeps the two apart
