"""Renderings built ahead of an instance's first read (``--render-ahead``, on by default).

In process: once the catalog says nothing is pending, each written instance holds its AWS
tree, its ETag and both identity signatures before any guest read it, and the first reads
sign nothing; every AWS version reads that one tree. Through ``imds serve`` (the CLI, real
sockets): ``/metrics`` counts what was built ahead, and the guests' first reads get the
same statuses and bodies as built at the read (a server with ``--no-render-ahead`` beside it).
"""

from __future__ import annotations

import base64

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from factories import metadata_body, new_id
from helpers import (
    admin_client,
    client_from,
    count_signing,
    make_settings,
    push_record,
    running_app,
    wait_for,
    wait_for_async,
)
from imds.services.render.tree import Dir, Later
from serve_process import Server, client_at, metric, serving

pytestmark = pytest.mark.anyio
IPS = ("10.61.0.1", "10.61.0.2", "10.61.0.3")
IDENTITY = ("document", "pkcs7", "rsa2048", "signature")


async def test_written_instances_are_built_and_signed_before_their_first_read():
    """After the writes, with nothing read: tree, ETag and signatures held; the reads then sign nothing."""
    async with running_app(make_settings()) as app:
        ids = [await push_record(app, [ip], {"id": new_id(), "hostname": f"h{n}", "plan": "c3.small.x86"})
               for n, ip in enumerate(IPS)]
        catalog = app.services.catalog
        await wait_for_async(lambda: catalog.ahead.pending == 0 and catalog.ahead.built >= len(ids),
                             what="every instance built ahead", timeout=60)
        for instance_id in ids:
            entry = catalog.get(instance_id)
            assert entry is not None
            assert entry._etag is not None
            tree = entry.rendered["ec2/aws"]
            assert isinstance(tree, Dir)
            identity = tree["dynamic"]["instance-identity"]  # type: ignore[index]
            await wait_for_async(lambda i=identity: all(isinstance(i[n], Later) and i[n].value is not None
                                                        for n in ("pkcs7", "signature")),
                                 what="both signatures made on the signing thread", timeout=60)
        made = count_signing(app.services.signer)
        async with client_from(app, STRANGER) as anyone:
            pem = (await anyone.get("/identity/certificate.pem")).content
        for ip in IPS:
            async with client_from(app, ip) as guest:
                parts = {name: (await guest.get(f"/2021-03-23/dynamic/instance-identity/{name}")).content
                         for name in IDENTITY}
            key = x509.load_pem_x509_certificate(pem).public_key()
            assert isinstance(key, rsa.RSAPublicKey)
            key.verify(base64.b64decode(parts["signature"]), parts["document"], padding.PKCS1v15(), hashes.SHA256())
            assert parts["pkcs7"] == parts["rsa2048"]
        assert made == []  # every signature read was made ahead


STRANGER = "192.0.2.250"


async def test_every_aws_version_reads_one_tree():
    """/latest, /2021-03-23 and /2016-09-02 share one rendering per instance; 2009-04-04 (hollow's) has its own."""
    async with running_app(make_settings(render_ahead=False)) as app:
        instance_id = await push_record(app, [IPS[0]], {"id": new_id(), "hostname": "one"})
        async with client_from(app, IPS[0]) as guest:
            answers = {version: (await guest.get(f"/{version}/meta-data/hostname")).text
                       for version in ("latest", "2021-03-23", "2016-09-02", "2009-04-04")}
        entry = app.services.catalog.get(instance_id)
        assert entry is not None
        assert sorted(k for k in entry.rendered if k.startswith("ec2/")) == ["ec2/aws", "ec2/hollow"]
    assert set(answers.values()) == {"one"}


async def test_nothing_is_built_ahead_with_the_option_off():
    """--no-render-ahead: writes leave the entries unrendered until a read (and nothing pending is kept)."""
    async with running_app(make_settings(render_ahead=False)) as app:
        instance_id = await push_record(app, [IPS[0]], {"id": new_id(), "hostname": "one"})
        async with admin_client(app) as admin:  # a request answered: any task would have had its turn since
            assert (await admin.get(f"/device-metadata/{instance_id}")).status_code == 200
        catalog = app.services.catalog
        entry = catalog.get(instance_id)
        assert entry is not None
        assert (catalog.ahead.pending, catalog.ahead.built) == (0, 0)
        assert "ec2/aws" not in entry.rendered


def test_imds_serve_builds_ahead_and_the_guests_read_the_same_bytes(tmp_path):
    """Two real servers, render-ahead on and off: /metrics counts the built ones; the first reads answer the same."""
    sources = [f"127.61.0.{n}" for n in range(1, 4)]
    bodies = [metadata_body(ips=[source], plan="m3.large.x86", facility="ams1") for source in sources]
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    with serving(tmp_path / "on", "--server", "front", "--db", "memory://") as ahead, \
            serving(tmp_path / "off", "--server", "front", "--db", "memory://", "--no-render-ahead") as plain:
        for server in (ahead, plain):
            with client_at() as admin:
                for body in bodies:
                    answer = admin.post(f"{server.url}/device-metadata", json=body, headers=server.admin_headers)
                    assert answer.status_code == 200, answer.text
        wait_for(lambda: metric(ahead, "imds_render_ahead_pending") == 0
                 and metric(ahead, "imds_render_ahead_built") == len(bodies), what="the three built ahead",
                 timeout=60)
        assert metric(plain, "imds_render_ahead_built") == 0
        paths = ["/latest/meta-data/", "/latest/meta-data/hostname", "/latest/meta-data/placement/availability-zone",
                 "/latest/user-data", "/metadata"]
        for source in sources:
            assert _reads(ahead, source, paths) == _reads(plain, source, paths)
        assert metric(plain, "imds_render_ahead_pending") == 0


def _reads(server: Server, source: str, paths: list[str]) -> list[tuple[int, bytes]]:
    """Status and body of each read (the ETags differ: each server stamps its own write times)."""
    with client_at(source) as guest:
        return [(a.status_code, a.content)
                for a in (guest.get(f"{server.url}{path}") for path in paths)]
