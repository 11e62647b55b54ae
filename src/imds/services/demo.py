"""The demo instance that ``imds serve --demo`` loads, bound to 127.0.0.1 and ::1."""

from __future__ import annotations

import ipaddress
import json
from importlib import resources

from imds.errors import RecordNotFound
from imds.models import METADATA, USERDATA, MetadataWrite, UserdataWrite
from imds.services.records.upsert import Records

DEMO_ADDRESSES = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128"))
DEMO_USERDATA = b"#!/bin/sh\necho 'hello from imds'\n"


async def load_demo(records: Records) -> tuple[str, list[str]]:
    """Write the example metadata document and a small script where they differ from what is stored.

    Returns the instance id and the record types written (none when a previous start's are
    still there as they were: a restart adds nothing to the audit log or the change feed).
    """
    document = json.loads(resources.files("imds.demo").joinpath("metadata.json").read_text())
    instance_id = str(document["id"])
    try:
        stored = await records.get(METADATA, instance_id)
    except RecordNotFound:
        stored = None
    if stored is not None and set(stored.addresses) != set(DEMO_ADDRESSES):
        stored = None  # moved elsewhere: both records are written again, with the demo's addresses
    written: list[str] = []
    if stored is None or stored.metadata != document:
        await records.put_metadata(MetadataWrite(instance_id, DEMO_ADDRESSES, document), subject="demo")
        written.append(METADATA)
    if stored is None or stored.userdata != DEMO_USERDATA:
        await records.put_userdata(UserdataWrite(instance_id, DEMO_ADDRESSES, DEMO_USERDATA), subject="demo")
        written.append(USERDATA)
    return instance_id, written
