"""The OS-record part of the Store contract: memory://, SQLite and PostgreSQL behave the same."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from factories import new_id
from imds.models import OsRecord, StoredParam
from imds.store import Store

pytestmark = pytest.mark.anyio


def record(generation: str = "g1", **overrides: object) -> OsRecord:
    values: dict[str, object] = {
        "os_type": "debootstrap+default",
        "mode": "install",
        "communication": False,
        "parameters": {
            "hostname": StoredParam("public", "web-1"),
            "root-hash": StoredParam("private", "gAAAA-token", encrypted=True),
            "root-password": StoredParam("secret"),
        },
        "install_parameters": {"disk": StoredParam("public", "/dev/vda")},
        "package_url": "http://192.0.2.1/p.tar.gz",
        "package_auth": True,
        "generation": generation,
        "updated_at": datetime(2026, 11, 23, 12, 0, tzinfo=UTC),
    }
    values.update(overrides)
    return OsRecord(**values)  # type: ignore[arg-type]


async def with_instance(store: Store) -> str:
    instance_id = new_id()
    async with store.write() as tx:
        await tx.put_records([(instance_id, {"id": instance_id})], [])
        await tx.mark_changed([instance_id])
    return instance_id


async def test_os_record_round_trips(store: Store) -> None:
    """put_os stores every field; os_of, get, get_many and snapshot return it equal, secrets without a value."""
    instance_id = await with_instance(store)
    async with store.write() as tx:
        assert await tx.os_of(instance_id) is None
        await tx.put_os(instance_id, record())
        await tx.mark_changed([instance_id])
    async with store.write() as tx:
        assert await tx.os_of(instance_id) == record()
    instance = await store.get(instance_id)
    assert instance is not None
    assert instance.os == record()
    assert instance.os.parameters["root-password"].value is None
    assert (await store.get_many([instance_id]))[instance_id].os == record()
    instances, _ = await store.snapshot()
    assert [i.os for i in instances] == [record()]


async def test_put_os_replaces_and_remove_os_deletes(store: Store) -> None:
    """A second put replaces the whole record; remove_os deletes it once, then reports False."""
    instance_id = await with_instance(store)
    replacement = record("g2", mode="run", communication=True, parameters={}, package_url=None, package_auth=False,
                         updated_at=None)
    async with store.write() as tx:
        await tx.put_os(instance_id, record())
    async with store.write() as tx:
        await tx.put_os(instance_id, replacement)
    instance = await store.get(instance_id)
    assert instance is not None
    assert instance.os == replacement
    async with store.write() as tx:
        assert await tx.remove_os(instance_id) is True
        assert await tx.remove_os(instance_id) is False
        assert await tx.remove_os(new_id()) is False
    instance = await store.get(instance_id)
    assert instance is not None
    assert instance.os is None
    assert instance.metadata == {"id": instance_id}


async def test_forget_instance_removes_the_os_record(store: Store) -> None:
    """The OS record goes with its instance."""
    instance_id = await with_instance(store)
    async with store.write() as tx:
        await tx.put_os(instance_id, record())
    async with store.write() as tx:
        await tx.remove_record("metadata", instance_id)
        await tx.forget_instance(instance_id)
    assert await store.get(instance_id) is None
    async with store.write() as tx:
        assert await tx.os_of(instance_id) is None


async def test_a_failed_write_leaves_no_os_record(store: Store) -> None:
    """An exception inside the write block rolls the OS record back."""
    instance_id = await with_instance(store)

    async def failing() -> None:
        async with store.write() as tx:
            await tx.put_os(instance_id, record())
            raise RuntimeError

    with pytest.raises(RuntimeError):
        await failing()
    instance = await store.get(instance_id)
    assert instance is not None
    assert instance.os is None
