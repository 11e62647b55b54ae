"""Project attributes in every Store (memory://, SQLite, PostgreSQL), and two catalogs following them.

The store keeps one record per project with a revision; the change feed names a project
write ``project:<id>``; a catalog applies its own writes from the journal and another
catalog's from the feed, resetting exactly the entries that took the project's record.
"""

from __future__ import annotations

import ipaddress

import pytest

from factories import new_id
from imds.metrics import Metrics
from imds.models import MetadataWrite, ProjectKey
from imds.services.catalog.catalog import Catalog
from imds.services.records.projects import ProjectRecords
from imds.services.records.upsert import Records
from imds.services.render.gce import gce_root
from imds.store import Store

pytestmark = pytest.mark.anyio


class Boom(Exception):
    pass


async def test_put_read_remove_with_revisions(store: Store):
    """put_project counts revisions per project; projects() reads some or all; remove_project says if it removed."""
    async with store.write() as tx:
        first = await tx.put_project("acme", {"team": "infra"})
        other = await tx.put_project("other", {})
    async with store.write() as tx:
        second = await tx.put_project("acme", {"team": "platform", "ssh-keys": "a:b"})
    assert (first.revision, other.revision, second.revision) == (1, 1, 2)
    found = await store.projects(["acme", "missing"])
    assert list(found) == ["acme"]
    assert (found["acme"].attributes, found["acme"].revision) == ({"team": "platform", "ssh-keys": "a:b"}, 2)
    assert found["acme"].updated_at.tzinfo is not None
    assert sorted(await store.projects()) == ["acme", "other"]
    async with store.write() as tx:
        assert await tx.remove_project("acme") is True
        assert await tx.remove_project("acme") is False
    assert sorted(await store.projects()) == ["other"]


async def test_a_block_that_raises_leaves_no_project_behind(store: Store):
    """All or nothing, as every write block."""

    async def write_then_fail() -> None:
        async with store.write() as tx:
            await tx.put_project("acme", {"a": "b"})
            await tx.mark_changed([ProjectKey("acme")])
            raise Boom

    with pytest.raises(Boom):
        await write_then_fail()
    assert await store.projects() == {}


async def test_two_catalogs_follow_a_project_write(store: Store):
    """The writer's catalog applies its journal; the other catches up from the feed; both render and re-ETag."""
    writer, follower = Catalog(store), Catalog(store)
    await writer.load()
    await follower.load()
    records = Records(store, writer, Metrics())
    ids = {name: new_id() for name in ("in", "out")}
    for n, (name, project) in enumerate((("in", "acme"), ("out", "other"))):
        address = ipaddress.ip_network(f"10.7.0.{n + 1}/32")
        doc = {"id": ids[name], "project_id": project, "project_attributes": {"team": "doc", "kept": "yes"}}
        await records.put_metadata(MetadataWrite(ids[name], (address,), doc), subject="t")
    await follower.catch_up()
    etags = {catalog: {name: catalog.get(i).etag for name, i in ids.items()} for catalog in (writer, follower)}
    projects = ProjectRecords(store, writer)
    await projects.put("acme", {"team": "infra"}, subject="t")
    await follower.catch_up()
    for catalog in (writer, follower):
        entry = catalog.get(ids["in"])
        attributes = entry.render_in_project("gce", gce_root)["project"]["attributes"]  # type: ignore[index]
        assert attributes == {"kept": "yes", "team": "infra"}
        assert entry.etag != etags[catalog]["in"]
        assert catalog.get(ids["out"]).etag == etags[catalog]["out"]
        assert catalog.project("acme").revision == 1  # type: ignore[union-attr]
    assert writer.get(ids["in"]).etag == follower.get(ids["in"]).etag  # the same on every replica
    await projects.delete("acme", subject="t")
    await follower.catch_up()
    assert follower.project("acme") is None
    assert follower.get(ids["in"]).etag == etags[follower]["in"]  # back to the instance's own
    reloaded = Catalog(store)
    await projects.put("acme", {"team": "again"}, subject="t")
    await reloaded.load()
    assert reloaded.project("acme").attributes == {"team": "again"}  # type: ignore[union-attr]
