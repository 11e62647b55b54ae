"""Private values are decrypted once per version of the instance, and a write serves the new value at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from factories import next_ipv4
from ganeti_data import os_body, put_os
from helpers import admin_client, client_from, make_settings, push_record, running_app
from imds.services.ganeti.records import PRIVATE_RENDER

pytestmark = pytest.mark.anyio
PARAMS = "/ganeti/latest/os/parameters.json"


async def test_private_values_are_opened_once_per_version(tmp_path: Path, sqlite_url: str):
    """With --private-key-file: served in clear, the opened values kept on the catalog entry, renewed on a write."""
    key_file = tmp_path / "private.keys"
    key_file.write_bytes(Fernet.generate_key() + b"\n")
    ip = next_ipv4()
    async with running_app(make_settings(db=sqlite_url, private_key_file=key_file)) as app, \
            admin_client(app) as admin, client_from(app, ip) as guest:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id, os_type="any"))
        entry = app.services.catalog.get(instance_id)
        assert PRIVATE_RENDER not in entry.rendered
        first = json.loads((await guest.get(PARAMS)).content)
        assert first["root-hash"] == ["private-value", "private"]
        assert entry.rendered[PRIVATE_RENDER] == {("parameters", "root-hash"): "private-value"}
        assert json.loads((await guest.get(PARAMS)).content) == first
        changed = {"root-hash": {"value": "changed-value", "visibility": "private"}}
        await put_os(admin, os_body(instance_id, os_type="any", parameters=changed))
        assert json.loads((await guest.get(PARAMS)).content)["root-hash"] == ["changed-value", "private"]
