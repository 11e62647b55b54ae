"""The JSON (Equinix) flavor from the instance's side: /metadata and /userdata, identification, ops."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from factories import metadata_body, new_id, next_ipv4, userdata_body
from helpers import admin_client, client_from, make_settings, running_app
from imds.errors import StoreUnavailable
from imds.store import MemoryStore
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

PROXY_NET = "192.0.2.0/24"
PROXY = "192.0.2.10"


@asynccontextmanager
async def app_with(**overrides: Any) -> AsyncIterator[InstanceFront]:
    async with running_app(make_settings(**overrides)) as app:
        yield app


async def push_metadata(app: InstanceFront, body: dict[str, Any]) -> None:
    async with admin_client(app) as admin:
        answer = await admin.post("/device-metadata", json=body)
    assert answer.json()["applied"] is True, answer.text


async def push_userdata(app: InstanceFront, body: dict[str, Any]) -> None:
    async with admin_client(app) as admin:
        answer = await admin.post("/device-userdata", json=body)
    assert answer.json()["applied"] is True, answer.text


async def get(app: InstanceFront, ip: str, path: str, method: str = "GET", **kwargs: Any) -> httpx.Response:
    async with client_from(app, ip) as guest:
        return await guest.request(method, path, **kwargs)


def assert_not_found_json(answer: httpx.Response, message: str) -> None:
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"message": message}


# --- the document and its template fields ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/metadata", "/metadata/", "/api/v1/metadata", "/api/v1/metadata/"])
async def test_metadata_is_served_as_stored_on_every_path_variant(path):
    """The caller gets its document, byte-compact JSON, with or without /api/v1 and a trailing slash."""
    async with app_with() as app:
        body = metadata_body(ips=[ip := next_ipv4()], plan={"slug": "c3.small"}, tags=["a"], city="Zürich")
        await push_metadata(app, body)
        answer = await get(app, ip, path)
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == body["metadata"]
        assert int(answer.headers["content-length"]) == len(answer.content)
        assert "Zürich".encode() in answer.content


async def test_template_fields_are_added_only_when_missing():
    """Configured fields are filled from the document; a stored value wins; an unconfigured field is absent."""
    settings = {
        "api_url": "https://{{.facility}}.example/{{.id}}",
        "phone_home_url": "https://{{.customdata.phone.host}}/ph/{{.id}}?plan={{.plan.slug}}",
    }
    async with app_with(**settings) as app:
        plain = metadata_body(
            ips=[a := next_ipv4()], facility="ams1", plan={"slug": "c3"}, customdata={"phone": {"host": "home.example"}}
        )
        own = metadata_body(ips=[b := next_ipv4()], facility="ams1", phone_home_url="https://mine.example/ph")
        await push_metadata(app, plain)
        await push_metadata(app, own)

        served = (await get(app, a, "/metadata")).json()
        assert served == {
            **plain["metadata"],
            "api_url": f"https://ams1.example/{plain['id']}",
            "phone_home_url": f"https://home.example/ph/{plain['id']}?plan=c3",
        }
        assert "user_state_url" not in served

        served = (await get(app, b, "/metadata")).json()
        assert served["phone_home_url"] == "https://mine.example/ph"
        assert served["api_url"] == f"https://ams1.example/{own['id']}"


async def test_template_references_to_missing_keys_render_empty():
    """A document without the referenced keys still gets the field, with empty parts."""
    async with app_with(user_state_url="https://{{.facility}}.example/{{.nested.missing}}/state") as app:
        body = metadata_body(ips=[ip := next_ipv4()])
        await push_metadata(app, body)
        assert (await get(app, ip, "/metadata")).json()["user_state_url"] == "https://.example//state"


async def test_no_template_configured_means_no_template_fields():
    """Without settings, the document is exactly what was pushed."""
    async with app_with() as app:
        body = metadata_body(ips=[ip := next_ipv4()], facility="ams1")
        await push_metadata(app, body)
        served = (await get(app, ip, "/metadata")).json()
        assert served == body["metadata"]
        assert not {"api_url", "phone_home_url", "user_state_url"} & set(served)


async def test_a_new_write_is_served_at_once_and_templates_follow_it():
    """Cached renderings are rebuilt after a write: the next read shows the new document and fields."""
    async with app_with(api_url="https://{{.facility}}.example") as app:
        body = metadata_body(ips=[ip := next_ipv4()], facility="ams1")
        await push_metadata(app, body)
        assert (await get(app, ip, "/metadata")).json()["api_url"] == "https://ams1.example"
        await push_metadata(app, metadata_body(body["id"], ips=[ip], facility="fra2"))
        assert (await get(app, ip, "/metadata")).json()["api_url"] == "https://fra2.example"


@pytest.mark.parametrize("path", ["/metadata", "/userdata/", "/api/v1/metadata/", "/api/v1/userdata"])
async def test_head_has_the_get_length_and_no_body(path):
    """HEAD answers GET's headers, template fields included in the length."""
    async with app_with(api_url="https://{{.facility}}.example/{{.id}}") as app:
        body = metadata_body(ips=[ip := next_ipv4()], facility="sjc1")
        await push_metadata(app, body)
        await push_userdata(app, userdata_body(body["id"], [ip], "#!/bin/sh\necho ☃\n"))
        got, head = await get(app, ip, path), await get(app, ip, path, "HEAD")
        assert head.status_code == got.status_code == 200
        assert head.content == b""
        assert head.headers["content-length"] == str(len(got.content))
        assert head.headers["content-type"] == got.headers["content-type"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/metadata", "/userdata", "/api/v1/metadata/"])
async def test_other_methods_are_405_with_allow(method, path):
    """Instance routes are read-only: 405, ``Allow: GET, HEAD``, JSON body."""
    async with app_with() as app:
        body = metadata_body(ips=[ip := next_ipv4()])
        await push_metadata(app, body)
        answer = await get(app, ip, path, method)
        assert answer.status_code == 405
        assert answer.headers["allow"] == "GET, HEAD"
        assert answer.json() == {"message": "method not allowed"}


async def test_a_query_string_does_not_change_the_route():
    """``/metadata?x=1`` is ``/metadata``."""
    async with app_with() as app:
        body = metadata_body(ips=[ip := next_ipv4()])
        await push_metadata(app, body)
        assert (await get(app, ip, "/metadata?format=json")).json() == body["metadata"]


# --- userdata --------------------------------------------------------------------------------------------------


async def test_text_userdata_is_served_exactly_as_utf8_text():
    """Text userdata keeps every byte (trailing newline included) and is labelled text/plain."""
    async with app_with() as app:
        script = "#!/bin/sh\necho 'héllo'\r\n\n"
        await push_userdata(app, userdata_body(new_id(), [ip := next_ipv4()], script))
        answer = await get(app, ip, "/userdata")
        assert answer.content == script.encode()
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"


async def test_binary_userdata_pushed_as_base64_is_served_byte_exact():
    """Bytes that are not UTF-8 come back exactly, as application/octet-stream."""
    async with app_with() as app:
        raw = bytes(range(256)) + b"\x00\xff"
        await push_userdata(app, userdata_body(new_id(), [ip := next_ipv4()], base64.b64encode(raw).decode()))
        for path in ("/userdata", "/api/v1/userdata/"):
            answer = await get(app, ip, path)
            assert answer.content == raw
            assert answer.headers["content-type"] == "application/octet-stream"
            assert answer.headers["content-length"] == str(len(raw))


async def test_gzipped_userdata_via_base64_is_served_byte_exact():
    """A gzip payload (cloud-init accepts these) survives the round trip."""
    import gzip  # noqa: PLC0415 - only this test needs it

    async with app_with() as app:
        raw = gzip.compress(b"#cloud-config\npackages: [htop]\n", mtime=0)
        await push_userdata(app, userdata_body(new_id(), [ip := next_ipv4()], base64.b64encode(raw).decode()))
        assert (await get(app, ip, "/userdata")).content == raw


async def test_empty_userdata_is_200_and_empty():
    """An empty script is a record, not an absence."""
    async with app_with() as app:
        await push_userdata(app, userdata_body(new_id(), [ip := next_ipv4()], ""))
        answer = await get(app, ip, "/userdata")
        assert answer.status_code == 200
        assert answer.content == b""
        assert answer.headers["content-length"] == "0"


async def test_an_instance_with_only_one_record_type_is_404_for_the_other():
    """Metadata without userdata: /userdata is 404 naming the instance (and vice versa)."""
    async with app_with() as app:
        body = metadata_body(ips=[ip := next_ipv4()])
        await push_metadata(app, body)
        assert_not_found_json(await get(app, ip, "/userdata"), f"no userdata stored for instance {body['id']}")
        only_user = new_id()
        await push_userdata(app, userdata_body(only_user, [ip2 := next_ipv4()], "x"))
        assert_not_found_json(await get(app, ip2, "/metadata"), f"no metadata stored for instance {only_user}")


# --- unknown callers and paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/metadata", "/userdata", "/api/v1/metadata/"])
async def test_an_unknown_caller_gets_404_json(path):
    """No instance holds the caller's address: 404 with a JSON body naming the address."""
    async with app_with() as app:
        caller = next_ipv4()
        assert_not_found_json(await get(app, caller, path), f"no instance is associated with {caller}")
        head = await get(app, caller, path, "HEAD")
        assert head.status_code == 404
        assert head.content == b""


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/metadata/extra",
        "/userdata/x",
        "/metadata//",
        "/METADATA",
        "/api/v1/nope",
        "/api/v1/metadata/extra",
        "/api/v2/metadata",
        "/api/v1",
        "/%00",
        "/metadata/../metadata/x",
    ],
)
async def test_unknown_paths_are_404_json_never_500(path):
    """Paths outside the instance and admin routes are 404 with a JSON body, for a known caller too."""
    async with app_with() as app:
        body = metadata_body(ips=[ip := next_ipv4()])
        await push_metadata(app, body)
        for method in ("GET", "HEAD", "POST"):
            answer = await get(app, ip, path, method)
            assert answer.status_code in {404, 405}, (method, path)
            if method == "GET":
                assert_not_found_json(answer, "not found")


async def test_a_scope_without_a_client_is_an_unidentified_caller():
    """A transport that reports no peer identifies nobody: 404 JSON, never a crash."""
    async with app_with() as app:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "GET",
            "path": "/metadata",
            "headers": [],
            "client": None,
            "query_string": b"",
            "http_version": "1.1",
            "scheme": "http",
            "root_path": "",
        }
        await app(scope, receive, send)
        assert sent[0]["status"] == 404
        assert sent[1]["body"] == b'{"message": "no instance is associated with an unidentified caller"}'


# --- identification: IPv6 forms, longest prefix, v4-mapped ---------------------------------------------------------


@pytest.mark.parametrize(
    ("pushed", "caller"),
    [
        ("2001:DB8:A::1", "2001:db8:a::1"),
        ("2001:db8:a::2", "2001:DB8:A:0:0:0:0:2"),
        ("2001:0db8:000a:0000:0000:0000:0000:0003", "2001:db8:a::3"),
        ("2001:db8:a:0::4", "2001:0db8:000a:0000:0000:0000:0000:0004"),
        ("2001:db8:b::/64", "2001:db8:b::dead:beef"),
        ("2001:DB8:C::/64", "2001:db8:c:0:ffff::1"),
        ("fe80::a9fe:a9fe", "fe80::a9fe:a9fe%eth0"),
        ("::ffff:10.200.3.4", "10.200.3.4"),
        ("10.200.3.5", "::ffff:10.200.3.5"),
    ],
)
async def test_ipv6_callers_match_whatever_textual_form_was_pushed(pushed, caller):
    """Upper-case, expanded, compressed, CIDR, zone-qualified and v4-mapped forms all identify the instance."""
    async with app_with() as app:
        body = metadata_body(ips=[pushed])
        await push_metadata(app, body)
        assert (await get(app, caller, "/metadata")).json() == body["metadata"]


async def test_longest_prefix_wins_over_overlapping_cidrs():
    """10.0.0.0/8 → A, 10.1.0.0/16 → B, 10.1.2.3 → C: each caller gets the most specific holder."""
    async with app_with() as app:
        a = metadata_body(ips=["10.0.0.0/8", "2001:db8::/32"], name="A")
        b = metadata_body(ips=["10.1.0.0/16", "2001:db8:1::/48"], name="B")
        c = metadata_body(ips=["10.1.2.3", "2001:db8:1::3"], name="C")
        for body in (a, b, c):
            await push_metadata(app, body)
        expected = {
            "10.9.9.9": "A",
            "10.1.9.9": "B",
            "10.1.2.3": "C",
            "10.1.2.4": "B",
            "::ffff:10.1.2.3": "C",
            "::ffff:10.1.9.9": "B",
            "[::ffff:10.9.9.9]": "A",
            "2001:db8:9::1": "A",
            "2001:db8:1::9": "B",
            "2001:db8:1::3": "C",
        }
        for caller, name in expected.items():
            assert (await get(app, caller, "/metadata")).json()["name"] == name, caller
        assert (await get(app, "11.0.0.1", "/metadata")).status_code == 404


async def test_removing_the_specific_holder_falls_back_to_the_covering_cidr():
    """When C's host address is dropped, 10.1.2.3 is B's again."""
    async with app_with() as app:
        b = metadata_body(ips=["10.1.0.0/16"], name="B")
        c = metadata_body(ips=["10.1.2.3"], name="C")
        await push_metadata(app, b)
        await push_metadata(app, c)
        assert (await get(app, "10.1.2.3", "/metadata")).json()["name"] == "C"
        await push_metadata(app, {**c, "ipAddresses": []})
        assert (await get(app, "10.1.2.3", "/metadata")).json()["name"] == "B"


# --- X-Forwarded-For ----------------------------------------------------------------------------------------------


async def test_untrusted_xff_is_ignored_by_default():
    """With no trusted proxy, a caller naming another instance's IP still gets its own document (or 404)."""
    async with app_with() as app:
        mine = metadata_body(ips=[my_ip := next_ipv4()], name="mine")
        theirs = metadata_body(ips=[their_ip := next_ipv4()], name="theirs")
        await push_metadata(app, mine)
        await push_metadata(app, theirs)
        spoof = {"X-Forwarded-For": their_ip}
        assert (await get(app, my_ip, "/metadata", headers=spoof)).json()["name"] == "mine"
        stranger = next_ipv4()
        assert_not_found_json(
            await get(app, stranger, "/metadata", headers=spoof), f"no instance is associated with {stranger}"
        )


async def test_xff_from_a_peer_outside_the_trusted_networks_is_ignored():
    """Configured proxies do not make every peer a proxy."""
    async with app_with(trusted_proxies=(ipaddress.ip_network(PROXY_NET),)) as app:
        theirs = metadata_body(ips=[their_ip := next_ipv4()], name="theirs")
        await push_metadata(app, theirs)
        stranger = next_ipv4()
        answer = await get(app, stranger, "/metadata", headers={"X-Forwarded-For": their_ip})
        assert_not_found_json(answer, f"no instance is associated with {stranger}")


async def test_a_trusted_proxy_is_believed_right_most_untrusted_entry_wins():
    """From a trusted proxy, the right-most untrusted XFF address is the caller; spoofed left entries are ignored."""
    async with app_with(trusted_proxies=(ipaddress.ip_network(PROXY_NET),)) as app:
        victim = metadata_body(ips=[victim_ip := next_ipv4()], name="victim")
        caller = metadata_body(ips=[caller_ip := next_ipv4()], name="caller")
        await push_metadata(app, victim)
        await push_metadata(app, caller)
        cases = [
            {"X-Forwarded-For": caller_ip},
            {"X-Forwarded-For": f"{victim_ip}, {caller_ip}"},
            {"X-Forwarded-For": f"{victim_ip}, {caller_ip}, 192.0.2.77"},
            {"X-Forwarded-For": f"{caller_ip}:51234"},
        ]
        for headers in cases:
            assert (await get(app, PROXY, "/metadata", headers=headers)).json()["name"] == "caller", headers
        repeated = httpx.Headers([("X-Forwarded-For", victim_ip), ("X-Forwarded-For", caller_ip)])
        assert (await get(app, PROXY, "/metadata", headers=repeated)).json()["name"] == "caller"


async def test_a_trusted_proxy_without_xff_is_itself_the_caller():
    """No header: the proxy's own address is looked up (and is unknown here)."""
    async with app_with(trusted_proxies=(ipaddress.ip_network(PROXY_NET),)) as app:
        assert_not_found_json(await get(app, PROXY, "/metadata"), f"no instance is associated with {PROXY}")


async def test_a_malformed_deciding_xff_entry_from_a_trusted_proxy_is_400():
    """The proxy sent garbage where the caller should be: 400 naming the header, not a guess."""
    async with app_with(trusted_proxies=(ipaddress.ip_network(PROXY_NET),)) as app:
        answer = await get(app, PROXY, "/metadata", headers={"X-Forwarded-For": "10.0.0.1, unknown"})
        assert answer.status_code == 400
        assert answer.json() == {
            "message": "invalid request",
            "errors": [{"field": "X-Forwarded-For", "message": "'unknown' is not an IP address"}],
        }


# --- metrics and health ---------------------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_metrics_count_requests_by_group_and_status_and_hollow_counters():
    """Each read, miss, write and unknown route moves its counter; hollow's names are kept."""
    async with app_with(metrics_public=True) as app:  # scraped the hollow way, without a token
        body = metadata_body(ips=[ip := next_ipv4()])
        await push_metadata(app, body)
        await push_userdata(app, userdata_body(body["id"], [ip], "u"))
        for _ in range(3):
            await get(app, ip, "/metadata")
        await get(app, ip, "/userdata")
        await get(app, next_ipv4(), "/metadata")
        await get(app, next_ipv4(), "/userdata")
        await get(app, next_ipv4(), "/userdata")
        await get(app, ip, "/nope")
        await get(app, ip, "/metadata", "POST")
        answer = await get(app, ip, "/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain")
        found = samples(answer.text)

        def requests(group: str, status: str) -> float:
            return found.get(("imds_http_requests_total", (("group", group), ("status", status))), 0.0)

        assert requests("instance", "200") == 4
        assert requests("instance", "404") == 3
        assert requests("instance", "405") == 1
        assert requests("admin", "200") == 2
        assert requests("other", "404") == 1
        assert found[("metadata_cache_hit_total", ())] == 3
        assert found[("metadata_cache_miss_total", ())] == 1
        assert found[("metadata_userdata_cache_hit_total", ())] == 1
        assert found[("metadata_userdata_cache_miss_total", ())] == 2
        assert found[("metadata_inserts_total", ())] == 1
        assert found[("metadata_userdata_inserts_total", ())] == 1
        assert found[("imds_catalog_instances", ())] == 1
        assert found[("imds_http_request_duration_seconds_count", (("group", "instance"),))] == 8
        assert "metadata_cache_hit_total 3.0" in answer.text


async def test_ops_requests_are_counted_in_their_own_group():
    """Scrapes and probes count as ``ops``, not as instance or admin traffic."""
    async with app_with(metrics_public=True) as app:
        await get(app, next_ipv4(), "/healthz")
        await get(app, next_ipv4(), "/readyz")
        found = samples((await get(app, next_ipv4(), "/metrics")).text)
        assert found[("imds_http_requests_total", (("group", "ops"), ("status", "200")))] == 2


async def test_healthz_is_ok():
    """Liveness answers 200 with a JSON status, to any caller."""
    async with app_with() as app:
        answer = await get(app, next_ipv4(), "/healthz")
        assert answer.status_code == 200
        assert answer.json() == {"status": "ok"}


async def test_readyz_is_ready_with_the_instance_count():
    """Readiness: store reachable and index loaded → 200 and how many instances are held."""
    async with app_with() as app:
        await push_metadata(app, metadata_body(ips=[next_ipv4()]))
        answer = await get(app, next_ipv4(), "/readyz")
        assert answer.status_code == 200
        assert answer.json() == {"status": "ready", "instances": 1, "problems": [],
                                 "loading": {"phase": "loaded", "indexed": 0, "total": 0}}


class UnreachableStore(MemoryStore):
    """A memory store whose health check fails, as a database that went away would."""

    async def ping(self) -> None:
        raise StoreUnavailable("database unreachable: connection refused")


async def test_readyz_is_503_when_the_store_is_unreachable_but_reads_still_work():
    """Readiness fails with the store's problem; instance reads keep working from memory."""
    store = UnreachableStore()
    async with running_app(make_settings(), store=store) as app:
        body = metadata_body(ips=[ip := next_ipv4()])
        await push_metadata(app, body)
        answer = await get(app, next_ipv4(), "/readyz")
        assert answer.status_code == 503
        assert answer.json() == {
            "status": "not ready",
            "instances": 1,
            "problems": ["database unreachable: connection refused"],
            "loading": {"phase": "loaded", "indexed": 0, "total": 0},
        }
        assert answer.headers["retry-after"] == "1"
        assert (await get(app, next_ipv4(), "/healthz")).status_code == 200
        assert (await get(app, ip, "/metadata")).json() == body["metadata"]
