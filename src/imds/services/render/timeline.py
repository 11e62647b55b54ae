"""What a notice is at a moment: its state as guests see it, and when that can next change.

A notice's stored state is what the host last wrote; the clock moves it on:

| stored | and | guests see |
|---|---|---|
| canceled, completed | | the same (history) |
| scheduled, active | ``window_end`` has passed | completed (history) |
| active | | active |
| scheduled | ``time`` has passed | active |
| scheduled | | scheduled |

A notice without ``window_end`` stays current until the host completes or cancels it (a spot
stop, once its time has come, is what the instance lives through, not history). Pure functions
of the notice and ``now``: every replica computes the same from the same record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from imds.models import ACTIVE, CANCELED, COMPLETED, SCHEDULED, Notice

HISTORY = frozenset({CANCELED, COMPLETED})
CURRENT = frozenset({SCHEDULED, ACTIVE})
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True)
class Seen:
    """A notice and the state guests see at the moment it was looked at."""

    notice: Notice
    status: str

    @property
    def current(self) -> bool:
        """Scheduled or active (not history)."""
        return self.status in CURRENT


def status(notice: Notice, now: datetime) -> str:
    """The state guests see at ``now`` (see the module docstring)."""
    if notice.state in HISTORY:
        return notice.state
    if notice.window_end is not None and notice.window_end <= now:
        return COMPLETED
    if notice.state == ACTIVE or notice.time <= now:
        return ACTIVE
    return SCHEDULED


def seen(notices: Iterable[Notice], now: datetime) -> tuple[Seen, ...]:
    """Each notice with its state at ``now``, oldest ``time`` first (then by id: the same order everywhere)."""
    return tuple(Seen(n, status(n, now)) for n in sorted(notices, key=lambda n: (n.time, n.id)))


def next_change(notices: Iterable[Notice], now: datetime) -> datetime | None:
    """The first moment after ``now`` at which what any of ``notices`` shows may change, or None."""
    later = [moment for n in notices for moment in (n.time, n.window_end) if moment is not None and moment > now]
    return min(later, default=None)


def rfc3339(moment: datetime) -> str:
    """``2017-09-18T08:22:00Z`` (EC2's spot and rebalance times, GCE's windows, the JSON flavors)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def aws_event_date(moment: datetime) -> str:
    """``21 Jan 2019 09:00:43 GMT``: EC2's scheduled-event dates (Go layout ``2 Jan 2006 15:04:05 GMT``)."""
    t = moment.astimezone(UTC)
    return f"{t.day} {_MONTHS[t.month - 1]} {t.year} {t:%H:%M:%S} GMT"
