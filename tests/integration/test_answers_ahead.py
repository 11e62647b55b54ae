"""The answers to an instance's first reads made ahead (``imds.web.answers``, part of ``--render-ahead``).

In process, once the catalog says nothing is pending: a guest's whole IMDSv2 crawl (every
directory followed, as cloud-init and ``ec2-metadata`` walk it, under any AWS version) is
answered without the EC2 handler running once, with the very statuses, headers and bodies
a server that builds nothing ahead answers, and hollow's counters counted the same. With
``--imdsv2 required`` the answers made ahead still need a valid token of the instance; a
rewrite is read at once; the 2009-04-04 tree (hollow's) is not one of them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import admin_client, client_from, make_settings, push_record, running_app, wait_for_async
from imds.services.catalog.catalog import Entry
from imds.web.flavors.ec2 import memo_path
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio
IPS = ("10.62.0.1", "10.62.0.2")
TOKEN = "X-aws-ec2-metadata-token"
TTL = "X-aws-ec2-metadata-token-ttl-seconds"
SKIPPED = {"date", "etag"}  # each server stamps its own (the ETag: its own write times; checked against the entry)
IDS = (new_id(), new_id())
NOW = 1_800_000_000.0
SIGNED = ("/signature", "/pkcs7", "/rsa2048")  # each server signs with its own key (verified in test_render_ahead)
STAMP = re.compile(rb'"pendingTime": "[^"]*"')  # the document's: each server's own write time


@asynccontextmanager
async def fleet(**settings: Any) -> AsyncIterator[InstanceFront]:
    """An app with two instances written (userdata for the first), everything built ahead if it is on."""
    async with running_app(make_settings(**settings)) as app:
        app.services.tokens._clock = lambda: NOW  # a token's TTL header the same on both servers, whenever read
        for n, ip in enumerate(IPS):
            await push_record(app, [ip], {"id": IDS[n], "hostname": f"g{n}", "plan": "c3.small.x86",
                                          "facility": "ams1"}, userdata="#cloud-config\n" if n == 0 else None)
        ahead = app.services.catalog.ahead
        await wait_for_async(lambda: ahead.pending == 0, what="nothing pending ahead", timeout=60)
        yield app


def handled(app: InstanceFront, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The subpaths the EC2 handler reads from now on (a read answered from the memo never gets there)."""
    seen: list[str] = []
    read = app._ec2._read

    async def counted(call: Any, version: str, subpath: str) -> Any:
        seen.append(subpath)
        return await read(call, version, subpath)

    monkeypatch.setattr(app._ec2, "_read", counted)
    return seen


Answer = tuple[int, tuple[tuple[str, str], ...], bytes]


async def crawl(guest: httpx.AsyncClient, version: str, headers: dict[str, str]) -> dict[str, Answer]:
    """Every path under ``/<version>/`` a guest walking the listings reads, with its answer."""
    answers: dict[str, Answer] = {}
    todo = [f"/{version}/", f"/{version}/user-data", f"/{version}/meta-data/", f"/{version}/dynamic/",
            f"/{version}/dynamic/instance-identity/"]
    while todo:
        path = todo.pop()
        answer = await guest.get(path, headers=headers)
        answers[path] = (answer.status_code, tuple((k, v) for k, v in answer.headers.items() if k not in SKIPPED),
                         b"signed" if path.endswith(SIGNED) and answer.status_code == 200
                         else STAMP.sub(b"", answer.content))
        if path.endswith("/") and answer.status_code == 200:
            todo += [path + line for line in answer.text.splitlines() if path + line not in answers]
    return answers


async def token_for(guest: httpx.AsyncClient) -> str:
    answer = await guest.put("/latest/api/token", headers={TTL: "300"})
    assert answer.status_code == 200, answer.text
    return answer.text


async def crawled(app: InstanceFront, ip: str, version: str, *, token: bool) -> tuple[dict[str, Answer], str]:
    async with client_from(app, ip) as guest:
        headers = {TOKEN: await token_for(guest)} if token else {}
        return await crawl(guest, version, headers), headers.get(TOKEN, "")


async def test_a_whole_crawl_is_answered_from_answers_made_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of the crawl: no handler run, the same answer as built at the read, the same counters."""
    async with fleet() as app, fleet(render_ahead=False) as plain:
        seen = handled(app, monkeypatch)
        for ip in IPS:
            for version, token in (("2021-03-23", True), ("latest", False), ("2018-09-24", True)):
                ahead, _ = await crawled(app, ip, version, token=token)
                built, _ = await crawled(plain, ip, version, token=token)
                assert ahead == built
                assert len(ahead) > 20  # the whole tree: meta-data's leaves, user-data, the identity
                assert any(path.endswith("/signature") and answer[0] == 200 for path, answer in ahead.items())
                assert all(dict(answer[1]).get(TTL.lower()) == ("300" if token else None)
                           for answer in ahead.values() if answer[0] == 200)
        assert seen == ["user-data"] * 3, seen  # only the second's 404s (never kept) went to the handler
        assert app.services.metrics.tally.reads == plain.services.metrics.tally.reads
        assert any(count for count in app.services.metrics.tally.reads.values())
        async with client_from(app, IPS[1]) as guest:
            etag = (await guest.get("/latest/meta-data/hostname")).headers["etag"]
        assert etag.encode() == _entry(app, IPS[1]).etag


def _entry(app: InstanceFront, ip: str) -> Entry:
    found = app.services.catalog.lookup(ipaddress.ip_address(ip))
    assert found is not None
    return found


async def test_required_tokens_still_guard_the_answers_made_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """--imdsv2 required: no token or another instance's is 401 (the handler says so); a valid one is answered."""
    async with fleet(imdsv2="required") as app:
        seen = handled(app, monkeypatch)
        async with client_from(app, IPS[0]) as first, client_from(app, IPS[1]) as second:
            own = await token_for(first)
            other = await token_for(second)
            good = await first.get("/2021-03-23/meta-data/hostname", headers={TOKEN: own})
            assert (good.status_code, good.text, good.headers[TTL]) == (200, "g0", "300")
            assert seen == []
            for headers in ({}, {TOKEN: other}, {TOKEN: own + "x"}):
                refused = await first.get("/2021-03-23/meta-data/hostname", headers=headers)
                assert refused.status_code == 401, headers
                assert "g0" not in refused.text
            assert seen == ["meta-data/hostname"] * 3  # each refusal went the whole way


async def test_a_rewrite_is_read_at_once_and_made_ahead_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The answers go with the entry's version: the new hostname is read, and made ahead in its turn."""
    async with fleet() as app, client_from(app, IPS[0]) as guest:
        assert (await guest.get("/latest/meta-data/hostname")).text == "g0"
        instance = _entry(app, IPS[0]).id
        await push_record(app, [IPS[0]], {"id": instance, "hostname": "renamed"}, instance_id=instance)
        assert (await guest.get("/2021-03-23/meta-data/hostname")).text == "renamed"
        ahead = app.services.catalog.ahead
        await wait_for_async(lambda: ahead.pending == 0, what="the rewrite built ahead", timeout=60)
        seen = handled(app, monkeypatch)
        assert (await guest.get("/latest/meta-data/instance-id")).text == instance
        assert seen == []


async def test_a_notice_for_the_facility_is_made_ahead_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A notice drops the renderings of the instances it reaches; they are built ahead again, with the notice."""
    async with fleet() as app, admin_client(app) as admin:
        answer = await admin.post("/device-notices", json={"facility": "ams1", "kind": "reboot",
                                                           "time": "2027-01-01T00:00:00Z"})
        assert answer.status_code == 200, answer.text
        ahead = app.services.catalog.ahead
        await wait_for_async(lambda: ahead.pending == 0, what="the reached instances built ahead", timeout=60)
        seen = handled(app, monkeypatch)
        for ip in IPS:
            async with client_from(app, ip) as guest:
                listing = await guest.get("/latest/meta-data/events/maintenance/")
                scheduled = await guest.get("/latest/meta-data/events/maintenance/scheduled")
            assert listing.text.splitlines() == ["history", "scheduled"]
            assert [event["Code"] for event in scheduled.json()] == ["instance-reboot"]
        assert seen == []


async def test_hollow_version_is_not_made_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """2009-04-04 reads its own tree: its first read goes to the handler (and is kept for the next)."""
    async with fleet() as app:
        seen = handled(app, monkeypatch)
        async with client_from(app, IPS[0]) as guest:
            for _ in range(2):
                assert (await guest.get("/2009-04-04/meta-data/hostname")).status_code == 200
        assert seen == ["meta-data/hostname"]



@pytest.mark.parametrize(("path", "kept_as"), [
    ("/2021-03-23/meta-data/hostname", "/latest/meta-data/hostname"),
    ("/2016-09-02/", "/latest/"),
    ("/2018-09-24", "/latest"),
    ("/latest/user-data", "/latest/user-data"),
    ("/2009-04-04/meta-data/hostname", "/2009-04-04/meta-data/hostname"),  # hollow's own tree
    ("/2020-01-01/meta-data/hostname", "/2020-01-01/meta-data/hostname"),  # not served: a 404, never kept
    ("/metadata", "/metadata"),
    ("/openstack/latest/meta_data.json", "/openstack/latest/meta_data.json"),
])
def test_every_aws_version_keeps_its_answers_under_latest(path: str, kept_as: str) -> None:
    """The memo's key for an EC2 path: one answer for all AWS versions (they read one tree), other paths their own."""
    assert memo_path(path) == kept_as
