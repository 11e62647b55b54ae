"""No secret outlives its OS record: the vault forgets it whenever the catalog drops the record.

Deleting the instance's records through the admin API, deleting them on another replica
(this one learns it from the change feed), or replacing the record: afterwards the vault
of every replica holds nothing for that instance, and a re-created record reports the
secret ``lost`` instead of finding an old copy.
"""

from __future__ import annotations

import json

import pytest

from factories import next_ipv4
from ganeti_data import os_body, put_os, two_replicas
from helpers import admin_client, client_from, make_settings, push_record, running_app

pytestmark = pytest.mark.anyio
PARAMS = "/ganeti/latest/os/parameters.json"


async def served(app: object, ip: str) -> dict[str, object]:
    async with client_from(app, ip) as guest:  # type: ignore[arg-type]
        answer = await guest.get(PARAMS)
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = json.loads(answer.content)
    return result


async def test_deleting_the_instance_records_forgets_its_secrets(sqlite_url: str):
    """DELETE /device-metadata drops the OS record too: the vault holds nothing, and nothing old comes back."""
    ip = next_ipv4()
    async with running_app(make_settings(db=sqlite_url)) as app, admin_client(app) as admin:
        vault = app.services.os.vault
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id, os_type="any"))
        assert vault.holds(instance_id)
        assert (await served(app, ip))["root-password"] == ["secret-value", "secret"]
        assert (await admin.delete(f"/device-metadata/{instance_id}")).status_code == 200  # the OS record goes too
        assert (await admin.get(f"/device-os/{instance_id}")).status_code == 404
        assert app.services.catalog.get(instance_id) is None
        assert not vault.holds(instance_id)
        await push_record(admin, [ip], instance_id=instance_id)
        secretless = os_body(instance_id, os_type="any")
        del secretless["parameters"]["root-password"]
        await put_os(admin, secretless)
        assert "root-password" not in await served(app, ip)
        assert not vault.holds(instance_id)


async def test_a_delete_on_another_replica_empties_this_vault(sqlite_url: str):
    """A holds the secret; B deletes the OS record, then the instance: A forgets it once it follows the feed."""
    async with two_replicas(sqlite_url, os_type="any") as (a, b, admin_a, admin_b, _, instance_id):
        assert a.services.os.vault.holds(instance_id)
        assert not b.services.os.vault.holds(instance_id)
        assert (await admin_b.delete(f"/device-os/{instance_id}")).status_code == 200
        assert a.services.os.vault.holds(instance_id)  # A has not followed the feed yet
        await a.services.catalog.catch_up()
        assert not a.services.os.vault.holds(instance_id)
        # Again through a whole-instance delete.
        await put_os(admin_a, os_body(instance_id, os_type="any"))
        await b.services.catalog.catch_up()
        assert a.services.os.vault.holds(instance_id)
        assert (await admin_b.delete(f"/device-metadata/{instance_id}")).status_code == 200
        await a.services.catalog.catch_up()
        assert a.services.catalog.get(instance_id) is None
        assert not a.services.os.vault.holds(instance_id)


async def test_a_newer_write_elsewhere_drops_the_older_secret(sqlite_url: str):
    """B replaces the record A's secret belonged to: A frees it (it could never be served again)."""
    async with two_replicas(sqlite_url, os_type="any") as (a, b, _admin_a, admin_b, ip, instance_id):
        await put_os(admin_b, os_body(instance_id, os_type="any"))
        assert a.services.os.vault.holds(instance_id)
        await a.services.catalog.catch_up()
        assert not a.services.os.vault.holds(instance_id)
        assert b.services.os.vault.holds(instance_id)
        assert (await served(b, ip))["root-password"] == ["secret-value", "secret"]
        assert "root-password" not in await served(a, ip)
