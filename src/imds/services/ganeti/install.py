"""The end of a Ganeti OS installation: the instance's final ``succeeded`` event returns its record to ``run``.

The instance reports progress through ``POST /ganeti/<v>/write`` (``{"state", "code"?,
"message"?}``); the documented states are ``STATES`` (any other is stored too). A
``succeeded`` event while the OS record's mode is ``install`` or ``self_install`` switches
the record to mode ``run`` (``OsRecords.end_install``: one durable transaction, audited
with subject ``instance``, carried to the other replicas by the change feed), and imds
adds ``{"state": "mode", "message": "run"}`` to the instance's event stream after it.
``failed`` (and every other state) leaves the mode as it is. With ``communication`` off,
the instance's next read of a ``/ganeti`` path is 404.
"""

from __future__ import annotations

from imds.models import Event
from imds.services.channel import Channel
from imds.services.ganeti.records import RUN, OsRecords

STATES = ("started", "image", "package", "script", "succeeded", "failed")
SUCCEEDED = "succeeded"
MODE_EVENT = "mode"  # the host-side event saying the mode changed; its message is the new mode
SUBJECT = "instance"  # the audit subject of a mode change the instance caused


async def report(channel: Channel, os_records: OsRecords, instance_id: str, raw: bytes) -> Event:
    """Store the instance's event (already admitted); a ``succeeded`` one ends an installation under way."""
    event = await channel.post(instance_id, raw)
    if event.state == SUCCEEDED:
        left = await os_records.end_install(instance_id, subject=SUBJECT, why=f"event {event.cursor}: {SUCCEEDED}")
        if left is not None:
            await channel.host_event(instance_id, MODE_EVENT, RUN)
    return event
