"""Hostile admin input: every write that used to break reads, or to answer 500, is a 400 naming the field.

Each case is sent as raw bytes through the admin API; the answer must be a 400 whose body
names the offending field, and nothing may be stored (a read by id is a 404, and the
addresses stay unbound). Cases whose behaviour differed per store run on PostgreSQL too.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from factories import metadata_body, new_id, next_ipv4
from helpers import admin_client, client_from, make_settings, running_app
from imds.store import open_store
from imds.web.instance import InstanceFront

pytestmark = [pytest.mark.anyio, pytest.mark.stores("memory", "sqlite")]

MAC = "aa:bb:cc:dd:ee:ff"


@asynccontextmanager
async def admin_app(url: str, **overrides: Any) -> AsyncIterator[tuple[InstanceFront, httpx.AsyncClient]]:
    async with running_app(make_settings(db=url, **overrides)) as app, admin_client(app) as admin:
        yield app, admin


def raw_metadata(instance_id: str, ip: str, document: str) -> bytes:
    """A POST /device-metadata body with ``document`` spliced in verbatim (JSON json.dumps cannot write)."""
    return f'{{"id": "{instance_id}", "ipAddresses": ["{ip}"], "metadata": {document}}}'.encode()


def fields_of(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["message"] == "invalid request"
    return {e["field"]: e["message"] for e in body["errors"]}


async def assert_nothing_stored(app: InstanceFront, admin: httpx.AsyncClient, instance_id: str, ip: str) -> None:
    assert (await admin.get(f"/device-metadata/{instance_id}")).status_code == 404
    async with client_from(app, ip) as guest:
        assert (await guest.get("/metadata")).status_code == 404


async def refused_write(db_url: str, document: str) -> dict[str, str]:
    """POST ``document`` for a fresh instance: a 400 (its {field: message}), and nothing stored or served."""
    async with admin_app(db_url) as (app, admin):
        instance_id, ip = new_id(), next_ipv4()
        answer = await admin.post("/device-metadata", content=raw_metadata(instance_id, ip, document))
        problems = fields_of(answer)
        await assert_nothing_stored(app, admin, instance_id, ip)
    return problems


def network(address: dict[str, Any]) -> str:
    return json.dumps({"network": {"addresses": [{"address": "10.0.0.5", **address}],
                                   "interfaces": [{"name": "eth0", "mac": MAC}]}})


def network_data(links: list[Any], services: list[Any]) -> str:
    return json.dumps({"network_data": {"links": links, "networks": [], "services": services}})


BREAKS_READS = [
    pytest.param('{"hostname": "z\\ud800"}', "metadata.hostname", "lone surrogate", id="surrogate-value"),
    pytest.param('{"z\\udfff": 1}', "metadata.'z\\udfff'", "lone surrogate", id="surrogate-key"),
    pytest.param(network({"address_family": "x"}), "metadata.network.addresses[0].address_family", "must be 4 or 6",
                 id="family-text"),
    pytest.param(network({"address_family": 5}), "metadata.network.addresses[0].address_family", "must be 4 or 6",
                 id="family-5"),
    pytest.param(network({"address_family": 4, "cidr": 99}), "metadata.network.addresses[0].cidr", "0 to 32",
                 id="cidr-99"),
    pytest.param(network({"address_family": 4, "cidr": -1}), "metadata.network.addresses[0].cidr", "0 to 32",
                 id="cidr-negative"),
    pytest.param(network({"address_family": 4, "cidr": True}), "metadata.network.addresses[0].cidr", "0 to 32",
                 id="cidr-true"),
    pytest.param(network({"address_family": 6, "cidr": 10**30}), "metadata.network.addresses[0].cidr", "0 to 128",
                 id="cidr-huge"),
    pytest.param(network({"dhcp": "yes"}), "metadata.network.addresses[0].dhcp", "true or false", id="dhcp-text"),
    pytest.param(network({"metadata_route": "router"}), "metadata.network.addresses[0].metadata_route",
                 "next-hop address", id="way-word"),
    pytest.param(network({"metadata_route": "gateway"}), "metadata.network.addresses[0].metadata_route",
                 "has no gateway", id="way-gateway-missing"),
    pytest.param(network({"metadata_route": "fd00::1"}), "metadata.network.addresses[0].metadata_route",
                 "not an IPv4 address", id="way-other-family"),
    pytest.param(json.dumps({"network": {"metadata_route": 5}}), "metadata.network.metadata_route",
                 "next-hop address", id="way-number"),
    pytest.param(network_data([{"id": "eth0", "type": "phy"}], [{"type": "dns"}]),
                 "metadata.network_data.services[0].address", "is required", id="dns-without-address"),
    pytest.param(network_data([{"id": "bond0", "type": "bond", "bond_links": [{"a": 1}]}], []),
                 "metadata.network_data.links[0].bond_links", "link ids", id="bond-link-object"),
]


@pytest.mark.parametrize(("document", "field", "says"), BREAKS_READS)
async def test_a_write_that_would_break_reads_is_refused(db_url, document, field, says):
    """Each of these was stored and then answered 500 on reads of some flavor; now the write is a 400."""
    problems = await refused_write(db_url, document)
    assert field in problems, problems
    assert says in problems[field]


async def test_valid_network_fields_are_still_accepted(db_url):
    """The checks refuse only the wrong shapes: family 4/6 with a cidr in range, and a DNS service with an address."""
    async with admin_app(db_url) as (app, admin):
        instance_id, ip = new_id(), next_ipv4()
        document = {
            "network": {"addresses": [{"address": "10.0.0.5", "address_family": 4, "cidr": 31, "public": False},
                                      {"address": "2001:db8::5", "address_family": 6, "cidr": 127}],
                        "interfaces": [{"name": "eth0", "mac": MAC}]},
            "network_data": {"links": [{"id": "eth0", "type": "phy"}], "networks": [],
                             "services": [{"type": "dns", "address": "192.0.2.53"}]},
        }
        answer = await admin.post("/device-metadata", json=metadata_body(instance_id, [ip], **document))
        assert answer.status_code == 200, answer.text
        async with client_from(app, ip) as guest:
            assert (await guest.get("/latest/meta-data/local-ipv4")).text == "10.0.0.5"
            assert (await guest.get("/openstack/latest/network_data.json")).json()["services"] == [
                {"type": "dns", "address": "192.0.2.53"}]


STORED_BEFORE_THE_CHECKS = [*(p.values[0] for p in BREAKS_READS), '{"x": NaN, "y": -Infinity, "hostname": "h\\ud800"}']
EVERY_FLAVOR = [
    "/metadata", "/userdata", "/latest/meta-data/", "/latest/meta-data/hostname", "/latest/meta-data/local-ipv4",
    "/latest/meta-data/network/interfaces/macs/", f"/latest/meta-data/network/interfaces/macs/{MAC}/local-ipv4s",
    "/latest/dynamic/instance-identity/document", "/2009-04-04/meta-data/", "/2009-04-04/meta-data/hostname",
    "/2009-04-04/meta-data/local-ipv4", "/nocloud/meta-data", "/nocloud/network-config", "/nocloud/vendor-data",
    *(f"/openstack/{v}/{f}" for v in ("2012-08-10", "2015-10-15", "latest")
      for f in ("meta_data.json", "network_data.json", "vendor_data.json")),
]


@pytest.mark.parametrize("document", STORED_BEFORE_THE_CHECKS)
async def test_a_record_stored_before_the_checks_still_renders_everywhere(db_url, document):
    """A record written by an older build (straight into the store here) renders in every flavor and drive.

    Never a 500, and the JSON documents are strict JSON (no NaN or Infinity tokens).
    """
    store = open_store(db_url)
    instance_id, ip = new_id(), next_ipv4()
    async with store.write() as tx:
        await tx.put_records([(instance_id, json.loads(document))], [])
        await tx.put_records([], [(instance_id, b"#!/bin/sh\n")])
        await tx.replace_addresses_many([(instance_id, (ipaddress.ip_network(ip),))])
        await tx.mark_changed([instance_id])
    async with running_app(make_settings(db=db_url), store=store) as app, admin_client(app) as admin, \
            client_from(app, ip) as guest:
        for path in EVERY_FLAVOR:
            answer = await guest.get(path)
            assert answer.status_code in (200, 404), (path, answer.status_code, answer.text[:200])
            if answer.status_code == 200 and path.endswith((".json", "/metadata", "/document")):
                json.loads(answer.content, parse_constant=pytest.fail)  # strict: no NaN/Infinity tokens
        for fmt in ("config-2", "nocloud"):
            drive = await admin.get(f"/device-configdrive/{instance_id}?format={fmt}")
            assert drive.status_code == 200, (fmt, drive.text[:200])
            assert drive.content[32769:32774] == b"CD001"  # an ISO 9660 volume descriptor


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


FIVE_THOUSAND_DIGITS = "7" * 5000
WAS_500 = [
    pytest.param(deep(100_000), "body", "nested too deeply", id="nested-100000"),
    pytest.param(f'{{"n": {FIVE_THOUSAND_DIGITS}}}', "body", "Exceeds the limit (4300 digits)", id="5000-digits"),
    pytest.param(json.dumps(json.dumps({"n": 1}).replace("1", FIVE_THOUSAND_DIGITS)), "metadata", "4300 digits",
                 id="5000-digits-in-a-string"),
]


@pytest.mark.parametrize(("document", "field", "says"), WAS_500)
async def test_inputs_that_answered_500_are_400s(db_url, document, field, says):
    """Deep nesting and over-long integers end in RecursionError/ValueError inside json: now 400 naming the field."""
    problems = await refused_write(db_url, document)
    assert says in problems[field]


@pytest.mark.parametrize(
    ("userdata", "encoding", "says"),
    [
        ("é", "base64", "is not valid base64"),
        ("\\u00e9t\\u00e9", "base64", "is not valid base64"),
        ("#!/bin/sh\\n\\ud800", None, "lone surrogate"),
        ("\\udc80", "text", "lone surrogate"),
    ],
)
async def test_bad_userdata_text_is_a_400(db_url, userdata, encoding, says):
    """Non-ASCII "base64" and text with lone surrogates: 400 naming userdata, nothing stored."""
    async with admin_app(db_url) as (_app, admin):
        instance_id, ip = new_id(), next_ipv4()
        extra = f', "userdata_encoding": "{encoding}"' if encoding else ""
        raw = f'{{"id": "{instance_id}", "ipAddresses": ["{ip}"], "userdata": "{userdata}"{extra}}}'
        answer = await admin.post("/device-userdata", content=raw.encode())
        assert says in fields_of(answer)["userdata"]
        assert (await admin.get(f"/device-userdata/{instance_id}")).status_code == 404


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999", "-1E400"])
@pytest.mark.stores("memory", "sqlite", "postgres")
async def test_nan_and_infinity_are_refused_on_every_store(db_url, constant):
    """NaN/Infinity were stored and served as invalid JSON on SQLite (503 on PostgreSQL): a 400 on all three."""
    async with admin_app(db_url) as (app, admin):
        instance_id, ip = new_id(), next_ipv4()
        answer = await admin.post("/device-metadata", content=raw_metadata(instance_id, ip, f'{{"x": {constant}}}'))
        assert "not valid JSON" in fields_of(answer)["body"]
        as_string = json.dumps(f'{{"x": {constant}}}')
        answer = await admin.post("/device-metadata", content=raw_metadata(instance_id, ip, as_string))
        assert "not valid JSON" in fields_of(answer)["metadata"]
        await assert_nothing_stored(app, admin, instance_id, ip)


@pytest.mark.parametrize("suffix", ["\n", "\r\n", " ", "\t"])
@pytest.mark.stores("memory", "sqlite", "postgres")
async def test_an_id_with_trailing_whitespace_is_not_a_second_instance(db_url, suffix):
    """A UUID plus a newline was stored as a second instance on SQLite (503 on PostgreSQL): now 400 naming ``id``."""
    async with admin_app(db_url) as (_app, admin):
        body = metadata_body(ips=[next_ipv4()])
        assert (await admin.post("/device-metadata", json=body)).status_code == 200
        twin = {**body, "id": body["id"] + suffix, "ipAddresses": [next_ipv4()]}
        twin["metadata"] = {**body["metadata"], "id": body["id"] + suffix}
        assert "must be a UUID" in fields_of(await admin.post("/device-metadata", json=twin))["id"]
        assert "must be a UUID" in fields_of(await admin.get(f"/device-metadata/{body['id']}%0A"))["id"]
        assert (await admin.get(f"/device-metadata/{body['id']}")).json() == body["metadata"]


async def test_a_token_ttl_that_only_python_calls_a_digit_is_a_400():
    """TTL header byte 0xb2 decodes (latin-1) to "²", which isdigit() but int() refuses: 400, not 500."""
    async with admin_app("memory://") as (app, admin):
        body = metadata_body(ips=[ip := next_ipv4()])
        await admin.post("/device-metadata", json=body)
        async with client_from(app, ip) as guest:
            for ttl in (b"\xb2", "٣".encode(), b"1" * 5000, b"0", b"21601"):
                answer = await guest.put("/latest/api/token", headers={"x-aws-ec2-metadata-token-ttl-seconds": ttl})
                assert (answer.status_code, answer.text) == (400, "400 - Bad Request"), ttl
            answer = await guest.put("/latest/api/token", headers={"x-aws-ec2-metadata-token-ttl-seconds": "60"})
            assert answer.status_code == 200


async def test_a_non_ascii_content_length_is_a_400():
    """A Content-Length of "²" reached int() and answered 500."""
    async with admin_app("memory://") as (_app, admin):
        body = json.dumps(metadata_body(ips=[next_ipv4()])).encode()
        request = admin.build_request("POST", "/device-metadata", content=body)
        request.headers["content-length"] = "²"
        answer = await admin.send(request)
        assert fields_of(answer) == {"Content-Length": "must be a number"}


# --- limits, each named with its flag -----------------------------------------------------------


async def test_too_many_addresses_is_a_400_naming_the_flag(db_url):
    """--max-addresses bounds one write's list; the answer names the flag and the environment variable."""
    async with admin_app(db_url, max_addresses=3) as (_app, admin):
        body = metadata_body(ips=[next_ipv4() for _ in range(4)])
        problems = fields_of(await admin.post("/device-metadata", json=body))
        assert problems == {"ipAddresses": "lists 4 addresses; at most 3 are accepted "
                                           "(--max-addresses / IMDS_MAX_ADDRESSES)"}
        body["ipAddresses"] = body["ipAddresses"][:3]
        assert (await admin.post("/device-metadata", json=body)).status_code == 200


async def test_too_deep_a_document_is_a_400_naming_the_flag(db_url):
    """--max-document-depth: the deepest offending value is named by its path."""
    async with admin_app(db_url, max_document_depth=3) as (_app, admin):
        body = metadata_body(ips=[next_ipv4()], a={"b": {"c": 1}})
        assert (await admin.post("/device-metadata", json=body)).status_code == 200
        body["metadata"]["a"] = {"b": {"c": [1]}}
        problems = fields_of(await admin.post("/device-metadata", json=body))
        assert problems == {"metadata.a.b.c": "is nested deeper than 3 levels "
                                              "(--max-document-depth / IMDS_MAX_DOCUMENT_DEPTH)"}


async def test_too_many_keys_is_a_400_naming_the_flag(db_url):
    """--max-document-keys counts keys over every level."""
    async with admin_app(db_url, max_document_keys=10) as (_app, admin):
        body = metadata_body(ips=[next_ipv4()], a={str(n): n for n in range(9)})
        problems = fields_of(await admin.post("/device-metadata", json=body))
        assert problems == {"metadata": "has 12 keys; at most 10 are accepted "
                                        "(--max-document-keys / IMDS_MAX_DOCUMENT_KEYS)"}


async def test_an_oversized_body_names_its_flag():
    """The 413 says which flag raises the limit."""
    async with admin_app("memory://", max_body_bytes=64) as (_app, admin):
        answer = await admin.post("/device-metadata", json=metadata_body(ips=[next_ipv4()]))
        assert answer.status_code == 413
        assert answer.json()["errors"] == [
            {"field": "body",
             "message": "request body is larger than 64 bytes (--max-body-bytes / IMDS_MAX_BODY_BYTES)"}
        ]


# --- addresses and ids mean exactly what they say ------------------------------------------------


@pytest.mark.parametrize(("entry", "network", "host"), [("10.1.2.3/8", "10.0.0.0/8", "10.1.2.3"),
                                                         ("2001:db8::7/64", "2001:db8::/64", "2001:db8::7")])
async def test_a_cidr_with_host_bits_is_refused_not_widened(db_url, entry, network, host):
    """10.1.2.3/8 was stored as 10.0.0.0/8, binding 16 million callers: now 400 naming the entry (--strict-records).

    Without --strict-records it is hollow's reading: see test_hollow_records.py.
    """
    async with admin_app(db_url, strict_records=True) as (app, admin):
        body = metadata_body(ips=[next_ipv4(), entry])
        problems = fields_of(await admin.post("/device-metadata", json=body))
        assert problems == {"ipAddresses[1]": f"{entry!r} has host bits set: write the network {network} "
                                              f"or the host {host} (a CIDR is never widened)"}
        await assert_nothing_stored(app, admin, body["id"], body["ipAddresses"][0])


async def test_a_document_id_must_be_the_record_id(db_url):
    """A document id other than the record id is refused; every flavor shows the record id.

    EC2 used to show the document's id and OpenStack the record's. The same UUID in another case is fine.
    With --strict-records only; without, the document is stored as sent (test_hollow_records.py).
    """
    async with admin_app(db_url, strict_records=True) as (app, admin):
        body = metadata_body(ips=[ip := next_ipv4()])
        other = {**body, "metadata": {**body["metadata"], "id": new_id()}}
        assert fields_of(await admin.post("/device-metadata", json=other)) == {
            "metadata.id": f"must be the record id {body['id']} (or be left out)"}
        for wrong in (7, None, ""):
            assert "metadata.id" in fields_of(
                await admin.post("/device-metadata", json={**body, "metadata": {**body["metadata"], "id": wrong}}))
        upper = {**body, "metadata": {**body["metadata"], "id": body["id"].upper()}}
        assert (await admin.post("/device-metadata", json=upper)).status_code == 200
        async with client_from(app, ip) as guest:
            assert (await guest.get("/latest/meta-data/instance-id")).text == body["id"]
            assert (await guest.get("/2009-04-04/meta-data/instance-id")).text == body["id"]
            identity = (await guest.get("/latest/dynamic/instance-identity/document")).json()
            assert identity["instanceId"] == body["id"]
            assert (await guest.get("/openstack/latest/meta_data.json")).json()["uuid"] == body["id"]
