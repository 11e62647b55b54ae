"""Notices on the admin API's wire: what a write may say, and how a notice is shown and exported.

A new notice (``POST /device-notices``)::

    {"instance_id": "7d0a…" | "project_id": "acme" | "facility": "da11",   (exactly one)
     "kind": "maintenance", "time": "2026-12-01T02:00:00Z", "window_end": "2026-12-01T04:00:00Z",
     "state": "scheduled", "description": "host kernel update", "target_state": null}

| field | rule |
|---|---|
| the scope | one of ``instance_id`` (a UUID), ``project_id`` (GCE's), ``facility`` (1-64 of ``A-Za-z0-9._-``) |
| ``kind`` | ``stop``, ``terminate``, ``hibernate``, ``preemption``, ``reboot``, ``maintenance``, ``migrate``, |
| | ``rebalance`` or ``lifecycle`` |
| ``time`` | RFC 3339 with a time zone (``Z`` or an offset), years 2000-9999; kept to the second |
| ``window_end`` | the same form, after ``time``; required for ``maintenance`` |
| ``state`` | ``scheduled`` (default) or ``active``; a change may also say ``canceled`` or ``completed`` |
| ``description`` | text, at most 255 characters |
| ``target_state`` | ``lifecycle`` only, and required there: an Auto Scaling target lifecycle state |

A change (``PATCH /device-notices/{id}``) names only what changes among ``state``, ``time``,
``window_end`` (null clears it), ``description`` and ``target_state``; the scope and kind of a
notice never change. Every problem is named by its field; nothing is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from imds.errors import InvalidInput, Problem
from imds.models import (
    ACTIVE,
    CANCELED,
    COMPLETED,
    FACILITY_SCOPE,
    INSTANCE_SCOPE,
    NOTICE_KINDS,
    NOTICE_STATES,
    PROJECT_SCOPE,
    SCHEDULED,
    Acknowledgement,
    Notice,
    NoticeDraft,
)
from imds.services.records.limits import check_document
from imds.services.records.projects import PROJECT_ID
from imds.services.records.wire import DEFAULT_LIMITS, parse_instance_id
from imds.services.render.timeline import HISTORY, rfc3339, status

SCOPE_FIELDS = {"instance_id": INSTANCE_SCOPE, "project_id": PROJECT_SCOPE, "facility": FACILITY_SCOPE}
FIELD_OF_SCOPE = {scope: field for field, scope in SCOPE_FIELDS.items()}
LIFECYCLE_STATES = ("InService", "Standby", "Detached", "Terminated", "Warmed:Hibernated", "Warmed:Running",
                    "Warmed:Stopped", "Warmed:Terminated")  # EC2's autoscaling/target-lifecycle-state values
WINDOWED = frozenset({"maintenance"})  # kinds that need a window end
DESCRIPTION_MAX = 255
NOTICE_ID = re.compile(r"[0-9a-f]{17}")  # the hex digits after EC2's "instance-event-"
FACILITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_CHANGEABLE = ("state", "time", "window_end", "description", "target_state")
_CREATE = frozenset({*SCOPE_FIELDS, "kind", "time", "window_end", "state", "description", "target_state"})
_EXPORTED = _CREATE | {"id", "revision", "created_at", "updated_at", "acknowledgements"}
_EARLIEST, _LATEST = datetime(2000, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)


def parse_notice_id(value: Any, field: str = "notice_id") -> str:
    """A notice id (17 lower-case hex digits; EC2's ``instance-event-`` prefix is accepted), or InvalidInput."""
    text = value.removeprefix("instance-event-") if isinstance(value, str) else None
    if text is None or NOTICE_ID.fullmatch(text) is None:
        raise InvalidInput.one(field, "must be a notice id: 17 lower-case hex digits")
    return text


def parse_time(value: Any, field: str, problems: list[Problem]) -> datetime | None:
    """An RFC 3339 moment with a time zone, in UTC, to the second; None (and a problem) otherwise."""
    moment = None
    if isinstance(value, str) and "T" in value.upper():
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
    if moment is None or moment.tzinfo is None:
        problems.append(Problem(field, "must be an RFC 3339 time with a time zone, e.g. 2026-12-01T02:00:00Z"))
        return None
    moment = moment.astimezone(UTC).replace(microsecond=0)
    if not _EARLIEST <= moment < _LATEST:
        problems.append(Problem(field, "must be from the year 2000 to 9998"))
        return None
    return moment


def _target(body: Mapping[str, Any], problems: list[Problem]) -> tuple[str, str] | None:
    given = [field for field in SCOPE_FIELDS if field in body]
    if len(given) != 1:
        problems.append(Problem("instance_id", "exactly one of instance_id, project_id or facility names whom the "
                                               "notice reaches"))
        return None
    field = given[0]
    value = body[field]
    if field == "instance_id":
        try:
            return INSTANCE_SCOPE, parse_instance_id(value, field)
        except InvalidInput as exc:
            problems += exc.problems
            return None
    pattern = PROJECT_ID if field == "project_id" else FACILITY
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        shape = "GCE's project id (1-28 of a-z, 0-9, '-', '_')" if field == "project_id" else \
            "1-64 of letters, digits, '.', '_' and '-'"
        problems.append(Problem(field, f"must be {shape}"))
        return None
    return SCOPE_FIELDS[field], value


def _choice(body: Mapping[str, Any], field: str, allowed: Iterable[str], problems: list[Problem]) -> str | None:
    value = body.get(field)
    allowed = tuple(allowed)
    if value not in allowed:
        problems.append(Problem(field, f"must be one of {', '.join(allowed)}"))
        return None
    return str(value)


def _text(body: Mapping[str, Any], problems: list[Problem]) -> str:
    value = body.get("description", "")
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > DESCRIPTION_MAX:
        problems.append(Problem("description", f"must be text of at most {DESCRIPTION_MAX} characters"))
        return ""
    problems += check_document(value, "description", DEFAULT_LIMITS)
    return value


def _unknown(body: Mapping[str, Any], known: Iterable[str]) -> list[Problem]:
    return [Problem(str(name), "unknown field") for name in sorted(set(body) - set(known), key=str)]


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInput.one("body", "must be a JSON object")
    return body


def rules(kind: str, time: datetime, window_end: datetime | None, target_state: str | None) -> list[Problem]:
    """The rules between fields that every stored notice keeps (after a create or a change)."""
    problems = []
    if kind in WINDOWED and window_end is None:
        problems.append(Problem("window_end", f"is required for a {kind} notice (the end of its window)"))
    if window_end is not None and window_end <= time:
        problems.append(Problem("window_end", "must be after time"))
    if kind == "lifecycle" and target_state not in LIFECYCLE_STATES:
        problems.append(Problem("target_state", f"a lifecycle notice needs one of {', '.join(LIFECYCLE_STATES)}"))
    if kind != "lifecycle" and target_state is not None:
        problems.append(Problem("target_state", "is only for lifecycle notices"))
    return problems


def parse_create(body: Any) -> NoticeDraft:
    """A ``POST /device-notices`` body → NoticeDraft, or InvalidInput naming every bad field."""
    body = _object(body)
    problems = _unknown(body, _CREATE)
    target = _target(body, problems)
    kind = _choice(body, "kind", NOTICE_KINDS, problems)
    time = parse_time(body.get("time"), "time", problems)
    window_end = parse_time(body["window_end"], "window_end", problems) if body.get("window_end") is not None \
        else None
    state = _choice(body, "state", (SCHEDULED, ACTIVE), problems) if "state" in body else SCHEDULED
    description = _text(body, problems)
    target_state = body.get("target_state")
    if target_state is not None and not isinstance(target_state, str):
        problems.append(Problem("target_state", "must be text"))
    if not problems and kind is not None and time is not None:
        problems += rules(kind, time, window_end, target_state)
    if problems or target is None or kind is None or time is None or state is None:
        raise InvalidInput(problems)
    return NoticeDraft(target[0], target[1], kind, time, state, window_end, description, target_state)


def parse_changes(body: Any) -> dict[str, Any]:
    """A ``PATCH /device-notices/{id}`` body → the changed fields (Notice field names), or InvalidInput."""
    body = _object(body)
    fixed = [Problem(name, "never changes: delete the notice and create another") for name in
             ("kind", *SCOPE_FIELDS) if name in body]
    problems = fixed + _unknown(body, (*_CHANGEABLE, "kind", *SCOPE_FIELDS))
    if not body:
        problems.append(Problem("body", f"names nothing to change: {', '.join(_CHANGEABLE)}"))
    changes: dict[str, Any] = {}
    if "state" in body:
        changes["state"] = _choice(body, "state", NOTICE_STATES, problems)
    if "time" in body:
        changes["time"] = parse_time(body["time"], "time", problems)
    if "window_end" in body:
        changes["window_end"] = None if body["window_end"] is None else \
            parse_time(body["window_end"], "window_end", problems)
    if "description" in body:
        changes["description"] = _text(body, problems)
    if "target_state" in body:
        value = body["target_state"]
        if value is not None and not isinstance(value, str):
            problems.append(Problem("target_state", "must be text"))
        changes["target_state"] = value
    if problems:
        raise InvalidInput(problems)
    return changes


def notice_view(notice: Notice, now: datetime, acks: Iterable[Acknowledgement] = ()) -> dict[str, Any]:
    """A notice as the admin API shows it: ``state`` as guests see it now, ``history`` once it is past."""
    shown = status(notice, now)
    return {**_fields(notice), "state": shown, "history": shown in HISTORY,
            "acknowledgements": [{"instance_id": a.instance_id, "at": rfc3339(a.at)} for a in acks]}


def notice_wire(notice: Notice, acks: Iterable[Acknowledgement] = ()) -> dict[str, Any]:
    """A notice as ``imds export`` writes it (the stored state) and ``imds import`` reads it."""
    return {**_fields(notice), "acknowledgements": [{"instance_id": a.instance_id, "at": rfc3339(a.at)}
                                                     for a in acks]}


def _fields(notice: Notice) -> dict[str, Any]:
    return {
        "id": notice.id, "scope": notice.scope, FIELD_OF_SCOPE[notice.scope]: notice.target, "kind": notice.kind,
        "time": rfc3339(notice.time), "window_end": None if notice.window_end is None else rfc3339(notice.window_end),
        "state": notice.state, "description": notice.description, "target_state": notice.target_state,
        "revision": notice.revision,
        "created_at": None if notice.created_at is None else rfc3339(notice.created_at),
        "updated_at": None if notice.updated_at is None else rfc3339(notice.updated_at),
    }


def parse_exported(body: Any) -> tuple[Notice, list[Acknowledgement]]:
    """One exported notice (``notice_wire``) → the notice and its acknowledgements, or InvalidInput."""
    body = _object(body)
    creatable = {k: v for k, v in body.items() if k in _CREATE and k != "state"}
    problems = _unknown({k: v for k, v in body.items() if k != "scope"}, _EXPORTED)
    try:
        draft = parse_create(creatable)
    except InvalidInput as exc:
        problems += exc.problems
        draft = None
    notice_id = None
    try:
        notice_id = parse_notice_id(body.get("id"), "id")
    except InvalidInput as exc:
        problems += exc.problems
    state = _choice(body, "state", NOTICE_STATES, problems)
    revision = body.get("revision", 1)
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        problems.append(Problem("revision", "must be a whole number from 1"))
    created = _optional_time(body, "created_at", problems)
    updated = _optional_time(body, "updated_at", problems)
    acks = _acks(body.get("acknowledgements", []), problems)
    if problems or draft is None or notice_id is None or state is None:
        raise InvalidInput(problems)
    notice = Notice.of(draft, id=notice_id, state=state, revision=revision, created_at=created, updated_at=updated)
    return notice, [Acknowledgement(notice_id, instance_id, at) for instance_id, at in acks]


def _optional_time(body: Mapping[str, Any], field: str, problems: list[Problem]) -> datetime | None:
    return None if body.get(field) is None else parse_time(body[field], field, problems)


def _acks(value: Any, problems: list[Problem]) -> list[tuple[str, datetime]]:
    if not isinstance(value, list):
        problems.append(Problem("acknowledgements", "must be a list of {instance_id, at}"))
        return []
    found = []
    for index, item in enumerate(value):
        where = f"acknowledgements[{index}]"
        if not isinstance(item, dict):
            problems.append(Problem(where, "must be {instance_id, at}"))
            continue
        try:
            instance_id = parse_instance_id(item.get("instance_id"), f"{where}.instance_id")
        except InvalidInput as exc:
            problems += exc.problems
            continue
        at = parse_time(item.get("at"), f"{where}.at", problems)
        if at is not None:
            found.append((instance_id, at))
    return found


FINAL = frozenset({CANCELED, COMPLETED})  # a stored state no change leaves
