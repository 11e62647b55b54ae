"""The OpenStack password: posted once by the instance, 409 after, size-limited, cleared by an admin; in every store."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from alembic import command

from factories import new_id
from helpers import ADMIN_TOKEN, admin_client, client_from, make_settings, push_record, running_app
from imds.errors import Conflict, RecordNotFound
from imds.metrics import Metrics
from imds.services.catalog.catalog import Catalog
from imds.services.records.upsert import Records
from imds.store import open_store
from imds.store.sql import migrate
from openstack_data import SEED_ID, openstack_document

pytestmark = [pytest.mark.anyio, pytest.mark.stores("memory", "sqlite")]

GUEST = "10.70.17.9"
OTHER = "10.70.18.1"
PASSWORD = b"c2VjcmV0LWVuY3J5cHRlZC13aXRoLXRoZS1zc2gta2V5"  # what nova-password style tools post: base64 text


async def post(app: Any, body: Any, ip: str = GUEST, version: str = "latest", **kwargs: Any) -> httpx.Response:
    async with client_from(app, ip) as guest:
        return await guest.post(f"/openstack/{version}/password", content=body, **kwargs)


async def read(app: Any, ip: str = GUEST, version: str = "latest") -> httpx.Response:
    async with client_from(app, ip) as guest:
        return await guest.get(f"/openstack/{version}/password")


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Any]:
    """The seed instance at GUEST and another at OTHER, on the in-memory store and on migrated SQLite."""
    async with running_app(make_settings(db=db_url)) as running, admin_client(running) as admin:
        await push_record(admin, [GUEST], openstack_document())
        await push_record(admin, [OTHER], {"id": new_id(), "hostname": "other"})
        yield running


async def test_the_instance_posts_its_password_once(app):
    """POST stores it (200, empty body), GET returns it exactly, a second POST is 409 and changes nothing."""
    assert (await read(app)).content == b""
    first = await post(app, PASSWORD)
    assert (first.status_code, first.content) == (200, b"")
    assert (await read(app)).content == PASSWORD
    assert (await read(app, version="2013-04-04")).content == PASSWORD
    again = await post(app, b"another", version="2013-04-04")
    assert again.status_code == 409
    assert again.text.startswith("409 - Conflict: instance ")
    assert again.text.endswith(" already has a password")
    assert (await read(app)).content == PASSWORD
    assert (await read(app, OTHER)).content == b""  # each instance has its own


TOO_LONG = "a password is at most 1020 bytes"


async def test_size_limit_and_empty_bodies():
    """1020 bytes is accepted; 1021 (declared or streamed without a length) and empty bodies are 400, nothing stored."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document())
        for body, why in ((b"x" * 1021, TOO_LONG), (b"", "is empty: post the (encrypted) password")):
            answer = await post(app, body)
            assert (answer.status_code, answer.text) == (400, f"400 - Bad Request: body: {why}")

        async def chunks():
            for _ in range(11):
                yield b"y" * 100

        streamed = await post(app, chunks())
        assert (streamed.status_code, streamed.text) == (400, f"400 - Bad Request: body: {TOO_LONG}")
        assert (await read(app)).content == b""
        assert (await post(app, b"z" * 1020)).status_code == 200
        assert (await read(app)).content == b"z" * 1020


async def test_unknown_callers_and_old_versions_cannot_post():
    """An address no instance holds gets 404; 2012-08-10 has no password (404); nothing is stored."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document())
        assert (await post(app, PASSWORD, ip="10.99.0.1")).status_code == 404
        assert (await post(app, PASSWORD, version="2012-08-10")).status_code == 404
        assert (await read(app)).content == b""


async def test_admin_clears_the_password_so_the_instance_can_post_again(app):
    """DELETE /device-password/{id} (also under /api/v1) clears it: GET is empty, a new POST works; 404 when none."""
    async with admin_client(app) as admin:
        assert (await admin.delete(f"/device-password/{SEED_ID}")).status_code == 404
        assert (await post(app, PASSWORD)).status_code == 200
        cleared = await admin.delete(f"/device-password/{SEED_ID.upper()}")
        assert (cleared.status_code, cleared.json()) == (200, {"id": SEED_ID, "deleted": "password"})
        assert (await read(app)).content == b""
        assert (await post(app, b"new")).status_code == 200
        assert (await read(app)).content == b"new"
        assert (await admin.delete(f"/api/v1/device-password/{SEED_ID}")).status_code == 200
        missing = await admin.delete(f"/device-password/{new_id()}")
        assert missing.status_code == 404
        assert (await admin.delete("/device-password/not-a-uuid")).status_code == 400


async def test_clearing_needs_a_delete_scope(tmp_path):
    """A read-only token gets 403 and the password stays; no token is 401; a delete-scoped token clears it."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"subject": "reader", "token": "read-token", "scopes": ["read"]},
        {"subject": "deleter", "token": "delete-token", "scopes": ["metadata:delete:metadata"]},
    ]}))
    async with running_app(make_settings(admin_tokens_file=tokens)) as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document())
        assert (await post(app, PASSWORD)).status_code == 200
        for token, status in ((None, 401), ("read-token", 403), ("delete-token", 200)):
            async with client_from(app, token=token) as caller:
                assert (await caller.delete(f"/device-password/{SEED_ID}")).status_code == status
            assert (await read(app)).content == (b"" if status == 200 else PASSWORD)


async def test_the_password_outlives_record_rewrites_but_not_the_instance(app):
    """Re-pushing metadata keeps the password; deleting both records removes the instance and its password."""
    assert (await post(app, PASSWORD)).status_code == 200
    async with admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document(hostname="renamed"), "#!/bin/sh\n",
                          userdata_encoding="text")
        assert (await read(app)).content == PASSWORD
        assert (await admin.delete(f"/device-metadata/{SEED_ID}")).status_code == 200
        assert (await admin.delete(f"/device-userdata/{SEED_ID}")).status_code == 200
        await push_record(admin, [GUEST], openstack_document())
    assert (await read(app)).content == b""


# --- the store primitives and the service, on memory, SQLite and PostgreSQL --------------------------------------


@pytest.mark.stores("memory", "sqlite", "postgres")
async def test_password_primitives_and_records_in_every_store(store):
    """put_password sets once, remove_password clears, get() carries it, and each change lands in the feed."""
    records = Records(store, Catalog(store), Metrics())
    instance_id = new_id()
    with pytest.raises(RecordNotFound):
        await records.set_password(instance_id, b"pw")  # no such instance
    async with store.write() as tx:
        await tx.put_records([(instance_id, {"id": instance_id})], [])
        await tx.mark_changed([instance_id])
    _, before = await store.snapshot()
    await records.set_password(instance_id, b"pw")
    with pytest.raises(Conflict):
        await records.set_password(instance_id, b"other")
    assert (await store.get(instance_id)).password == b"pw"  # type: ignore[union-attr]
    async with store.write() as tx:
        assert await tx.put_password(instance_id, b"x") is False
    await records.clear_password(instance_id, subject="test")
    with pytest.raises(RecordNotFound):
        await records.clear_password(instance_id, subject="test")
    assert (await store.get(instance_id)).password is None  # type: ignore[union-attr]
    assert [c.instance_id for c in await store.changes_since(before)] == [instance_id, instance_id]
    async with store.write() as tx:
        assert await tx.put_password(instance_id, b"again") is True
        await tx.forget_instance(instance_id)
    assert await store.get(instance_id) is None


@pytest.mark.stores("memory", "sqlite", "postgres")
async def test_racing_posts_store_exactly_one_password(store):
    """Ten concurrent set_password calls for one instance: one succeeds, nine are Conflicts."""
    records = Records(store, Catalog(store), Metrics())
    instance_id = new_id()
    async with store.write() as tx:
        await tx.put_records([(instance_id, {"id": instance_id})], [])
    outcomes = await asyncio.gather(*(records.set_password(instance_id, b"p%d" % n) for n in range(10)),
                                    return_exceptions=True)
    assert sum(o is None for o in outcomes) == 1
    assert all(isinstance(o, Conflict) for o in outcomes if o is not None)


def test_migration_0002_adds_the_table_and_keeps_existing_records(tmp_path):
    """A database at 0001 with a record upgrades to 0002 (record intact), and downgrades back without the table."""
    url = f"sqlite:///{tmp_path / 'imds.db'}"
    migrate.upgrade(url, "0001")
    with sqlite3.connect(tmp_path / "imds.db") as conn:
        conn.execute("INSERT INTO instances (id) VALUES (?)", (SEED_ID,))
        conn.execute("INSERT INTO instance_userdata (instance_id, userdata, updated_at) VALUES (?, ?, ?)",
                     (SEED_ID, b"#!", "2026-01-01 00:00:00"))
    conn.close()
    migrate.upgrade(url)
    migrate.check(url)

    async def check() -> None:
        store = open_store(url)
        try:
            instance = await store.get(SEED_ID)
            assert instance is not None
            assert (instance.userdata, instance.password) == (b"#!", None)
            async with store.write() as tx:
                assert await tx.put_password(SEED_ID, b"pw")
            assert (await store.get(SEED_ID)).password == b"pw"  # type: ignore[union-attr]
        finally:
            await store.close()

    asyncio.run(check())
    command.downgrade(migrate.alembic_config(url), "0001")
    with sqlite3.connect(tmp_path / "imds.db") as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "instance_passwords" not in tables
        assert conn.execute("SELECT userdata FROM instance_userdata").fetchall() == [(b"#!",)]
    conn.close()


async def test_the_admin_token_is_not_needed_by_the_instance():
    """The instance's POST carries no credentials at all; an admin token on it changes nothing."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document())
        answer = await post(app, PASSWORD, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert answer.status_code == 200
        assert (await read(app)).content == PASSWORD
