"""The demo instance that ``imds serve --demo`` loads, bound to 127.0.0.1 and ::1."""

from __future__ import annotations

import ipaddress
import json
from importlib import resources

from imds.models import MetadataWrite, UserdataWrite
from imds.services.records.upsert import Records

DEMO_ADDRESSES = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128"))
DEMO_USERDATA = b"#!/bin/sh\necho 'hello from imds'\n"


async def load_demo(records: Records) -> str:
    """Write the example metadata document and a small script; returns the instance id."""
    document = json.loads(resources.files("imds.demo").joinpath("metadata.json").read_text())
    instance_id = str(document["id"])
    await records.put_metadata(MetadataWrite(instance_id, DEMO_ADDRESSES, document), subject="demo")
    await records.put_userdata(UserdataWrite(instance_id, DEMO_ADDRESSES, DEMO_USERDATA), subject="demo")
    return instance_id
