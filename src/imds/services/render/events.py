"""Lifecycle notices the way each cloud's clients read them: EC2's, GCE's and one JSON document.

Every rendering takes the notices reaching an instance as seen at one moment
(``imds.services.render.timeline``), so all flavors say the same thing about the same record:

| kind | EC2 (``meta-data/``) | GCE (``instance/``) |
|---|---|---|
| stop, terminate, hibernate | ``spot/instance-action``, ``termination-time`` (current) | ``preempted`` once active |
| preemption | the same, action ``terminate`` | the same |
| reboot | ``events/maintenance/scheduled``, code ``instance-reboot`` | ``maintenance-event`` (1), upcoming (3) |
| maintenance | the same, code ``system-maintenance`` | the same |
| migrate | the same, code ``system-maintenance`` | ``maintenance-event`` (2), upcoming (3) |
| rebalance | ``events/recommendations/rebalance`` ``{"noticeTime"}`` once active | |
| lifecycle | ``autoscaling/target-lifecycle-state`` (the newest active one) | |

(1) ``TERMINATE_ON_HOST_MAINTENANCE`` while active (else ``NONE``); (2) ``MIGRATE_ON_HOST_MAINTENANCE``
likewise; (3) ``upcoming-maintenance`` while current: GCE's fields, ``maintenance_status`` ``PENDING``
then ``ONGOING``, absent (404) when nothing is coming. ``preempted`` is ``FALSE`` without an active one.

EC2's scheduled events list the current ones (``State`` ``active``, as AWS shows an upcoming
event) and, until their window would have ended, the canceled ones (``State`` ``canceled``:
aws-node-termination-handler uncordons on it); ``history`` lists the canceled and completed
ones. Both answer ``[]`` when empty; their dates are AWS's (``21 Jan 2019 09:00:43 GMT``), the
others RFC 3339. An EC2 event id is ``instance-event-`` and the notice id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from imds.models import ACTIVE, CANCELED
from imds.services.render.context import Context
from imds.services.render.pretty import pretty
from imds.services.render.timeline import Seen, aws_event_date, rfc3339
from imds.services.render.tree import Dir, Leaf

INTERRUPTIONS = {"stop": "stop", "terminate": "terminate", "hibernate": "hibernate", "preemption": "terminate"}
EVENT_CODES = {"reboot": "instance-reboot", "maintenance": "system-maintenance", "migrate": "system-maintenance"}
DESCRIPTIONS = {"reboot": "scheduled reboot", "maintenance": "scheduled system maintenance",
                "migrate": "scheduled live migration"}
GCE_EVENTS = {"migrate": "MIGRATE_ON_HOST_MAINTENANCE", "maintenance": "TERMINATE_ON_HOST_MAINTENANCE",
              "reboot": "TERMINATE_ON_HOST_MAINTENANCE"}
NO_EVENT = "NONE"
EVENT_ID_PREFIX = "instance-event-"


def _pretty(value: object) -> bytes:
    return pretty(value).encode()  # json.dumps(indent=2)'s text from the C encoder


def ec2_event(seen: Seen) -> dict[str, str]:
    """One scheduled event as EC2 lists it (field names and order as AWS, ``NotAfter`` when the notice has one)."""
    notice = seen.notice
    description = notice.description or DESCRIPTIONS[notice.kind]
    if not seen.current:
        description = f"[{seen.status.capitalize()}] {description}"
    event = {"NotBefore": aws_event_date(notice.time), "Code": EVENT_CODES[notice.kind], "Description": description,
             "EventId": EVENT_ID_PREFIX + notice.id}
    if notice.window_end is not None:
        event["NotAfter"] = aws_event_date(notice.window_end)
    event["State"] = ACTIVE if seen.current else seen.status
    return event


def _still_ahead(seen: Seen, now: datetime | None) -> bool:
    end = seen.notice.window_end or seen.notice.time
    return now is not None and end > now


def scheduled(notices: Iterable[Seen], now: datetime | None) -> list[dict[str, str]]:
    """``events/maintenance/scheduled``: the current events, and the canceled ones whose window is still ahead."""
    return [ec2_event(s) for s in notices if s.notice.kind in EVENT_CODES
            and (s.current or (s.status == CANCELED and _still_ahead(s, now)))]


def history(notices: Iterable[Seen]) -> list[dict[str, str]]:
    """``events/maintenance/history``: the canceled and completed events."""
    return [ec2_event(s) for s in notices if s.notice.kind in EVENT_CODES and not s.current]


def interruption(notices: Iterable[Seen]) -> Seen | None:
    """The current interruption (spot stop, terminate, hibernate, preemption) that comes first, if any."""
    return next((s for s in notices if s.notice.kind in INTERRUPTIONS and s.current), None)


def _active(notices: Iterable[Seen], kind: str) -> list[Seen]:
    return [s for s in notices if s.notice.kind == kind and s.status == ACTIVE]


def ec2_items(context: Context) -> dict[str, Leaf | Dir]:
    """What notices add to EC2's ``meta-data/``: ``events/`` always, ``spot/`` and ``autoscaling/`` when they say so.

    Without notices (most instances) ``events/`` is the same tree for everyone: one, shared (never modified).
    """
    notices = context.notices
    if not notices:
        return {"events": _QUIET}
    maintenance = Dir([("history", _pretty(history(notices))), ("scheduled", _pretty(scheduled(notices, context.now)))])
    events: list[tuple[str, Leaf | Dir]] = [("maintenance", maintenance)]
    if rebalance := _active(notices, "rebalance"):
        signal = json.dumps({"noticeTime": rfc3339(rebalance[0].notice.time)}).encode()
        events.append(("recommendations", Dir([("rebalance", signal)])))
    items: dict[str, Leaf | Dir] = {"events": Dir(events)}
    if (spot := interruption(notices)) is not None:
        action = {"action": INTERRUPTIONS[spot.notice.kind], "time": rfc3339(spot.notice.time)}
        items["spot"] = Dir([("instance-action", json.dumps(action).encode()),
                             ("termination-time", rfc3339(spot.notice.time))])
    if lifecycle := _active(notices, "lifecycle"):
        newest = max(lifecycle, key=lambda s: (s.notice.time, s.notice.id))
        items["autoscaling"] = Dir([("target-lifecycle-state", newest.notice.target_state or "")])
    return items


_QUIET = Dir([("maintenance", Dir([("history", _pretty([])), ("scheduled", _pretty([]))]))])  # no notice


def gce_items(context: Context) -> dict[str, object]:
    """What notices add to GCE's ``instance/``: ``maintenance-event``, ``preempted``, ``upcoming-maintenance``."""
    notices = context.notices
    active = [s for s in notices if s.status == ACTIVE and s.notice.kind in GCE_EVENTS]
    items: dict[str, object] = {
        "maintenance-event": GCE_EVENTS[active[0].notice.kind] if active else NO_EVENT,
        "preempted": "TRUE" if any(s.status == ACTIVE for s in notices if s.notice.kind in INTERRUPTIONS) else "FALSE",
    }
    upcoming = next((s for s in notices if s.current and s.notice.kind in GCE_EVENTS), None)
    if upcoming is not None:
        notice = upcoming.notice
        items["upcoming-maintenance"] = {
            "can_reschedule": False,
            "latest_window_start_time": rfc3339(notice.time),
            "maintenance_status": "ONGOING" if upcoming.status == ACTIVE else "PENDING",
            "type": "SCHEDULED",
            "window_end_time": rfc3339(notice.window_end or notice.time),
            "window_start_time": rfc3339(notice.time),
        }
    return items


def _entry(seen: Seen) -> dict[str, object]:
    notice = seen.notice
    return {"id": notice.id, "kind": notice.kind, "scope": notice.scope, "state": seen.status,
            "time": rfc3339(notice.time),
            "window_end": None if notice.window_end is None else rfc3339(notice.window_end),
            "description": notice.description, "target_state": notice.target_state}


def notices_document(context: Context) -> bytes:
    """The JSON and OpenStack flavors' ``notices`` document: the current notices and the history, oldest first."""
    notices = context.notices
    return json.dumps({"notices": [_entry(s) for s in notices if s.current],
                       "history": [_entry(s) for s in notices if not s.current]}, separators=(",", ":")).encode()
