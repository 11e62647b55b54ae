"""The EC2 flavor over HTTP (in-process, chosen source IP): trees, listings, HEAD, errors, IMDSv2, identity."""

from __future__ import annotations

import base64
import ipaddress
import json
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from ec2_expected import HOLLOW_SEED, seed
from helpers import (
    admin_client,
    client_from,
    count_signing,
    make_settings,
    push_record,
    running_app,
    wait_for_async,
)
from imds import config
from imds.errors import ConfigError
from imds.services.identity.tokens import TokenIssuer
from imds.web.instance import InstanceFront
from token_put_cases import FORWARDING, OTHER_PATHS, REFUSED, TOKEN_PATHS

pytestmark = pytest.mark.anyio

SEED_IP = "10.70.17.9"
OTHER_ID = "5b0c6f0e-7d4e-4a38-9d0c-0a4f1c1e0b22"
OTHER_IP = "10.70.99.1"
STRANGER_IP = "10.99.99.99"
PROXY_NET = "192.0.2.0/24"
PROXY = "192.0.2.10"
USERDATA = "#!/bin/sh\necho 'héllo from imds'\n"
AWS_VERSIONS = ("latest", "2021-03-23", "2018-09-24", "2016-09-02")
TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
TEXT = "text/plain; charset=utf-8"
OPENSSL = shutil.which("openssl")


@asynccontextmanager
async def seeded(**overrides: Any) -> AsyncIterator[InstanceFront]:
    """A running app holding the seed document + userdata at SEED_IP and a second instance at OTHER_IP."""
    async with running_app(make_settings(**overrides)) as app:
        await push_record(app, [SEED_IP], seed(), USERDATA)
        await push_record(app, [OTHER_IP], {"id": OTHER_ID, "hostname": "other", "plan": "m3.small.x86"}, USERDATA)
        yield app


async def get(app: InstanceFront, path: str, ip: str = SEED_IP, method: str = "GET", **kwargs: Any) -> httpx.Response:
    async with client_from(app, ip) as guest:
        return await guest.request(method, path, **kwargs)


Raw = tuple[int, dict[str, str], bytes]


async def raw(
    app: InstanceFront, path: str, ip: str = SEED_IP, method: str = "GET", headers: tuple[tuple[str, str], ...] = ()
) -> Raw:
    """Send ``path`` exactly as given (no client-side normalisation of '//' or '..'); a query after '?'."""
    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": urllib.parse.quote(path).encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"imds.test"), *((k.lower().encode(), v.encode()) for k, v in headers)],
        "client": (ip, 40000),
        "server": ("imds.test", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def assert_plain(answer: httpx.Response, status: int, text: str) -> None:
    assert (answer.status_code, answer.text) == (status, text)
    assert answer.headers["content-type"] == TEXT
    assert TTL.lower() not in answer.headers


async def crawl(client: httpx.AsyncClient, directory: str, tree: dict[str, bytes]) -> None:
    """GET ``directory`` (ending in '/') and every entry it lists, recursively, into ``tree``.

    A line ending in '/' or of the form 'N=name' is a subtree; anything else is a value.
    """
    answer = await client.get(directory)
    assert answer.status_code == 200, directory
    assert not answer.content.endswith(b"\n"), directory
    tree[directory] = answer.content
    for line in answer.text.split("\n"):
        assert line, f"empty line in the listing of {directory}"
        if "=" in line or line.endswith("/"):
            await crawl(client, directory + line.split("=", 1)[0].rstrip("/") + "/", tree)
            continue
        leaf = await client.get(directory + line)
        assert leaf.status_code == 200, directory + line
        assert leaf.headers["content-type"] == TEXT
        assert not leaf.content.endswith(b"\n"), directory + line
        tree[directory + line] = leaf.content


# --- hollow's 2009-04-04 subset -----------------------------------------------------------------------------------


async def test_hollow_2009_04_04_text_tree_of_the_seed_document():
    """Every listing and item of /2009-04-04/meta-data is hollow's exact text, with or without a trailing slash."""
    async with seeded() as app, client_from(app, SEED_IP) as guest:
        root = await guest.get("/2009-04-04/")
        assert (root.status_code, root.text) == (200, "meta-data\nuser-data")
        for item, text in HOLLOW_SEED.items():
            for path in (f"/2009-04-04/meta-data/{item}", f"/2009-04-04/meta-data/{item}/".replace("//", "/")):
                answer = await guest.get(path)
                assert (answer.status_code, answer.text) == (200, text), path
                assert answer.headers["content-type"] == TEXT
        no_slash = await guest.get("/2009-04-04/meta-data")
        assert no_slash.text == HOLLOW_SEED[""]
        userdata = await guest.get("/2009-04-04/user-data")
        assert (userdata.status_code, userdata.content) == (200, USERDATA.encode())


@pytest.mark.parametrize("item", ["spot", "spot/termination-time", "dynamic", "operating-system/nope", "tags/0"])
async def test_hollow_items_the_seed_document_lacks_are_404(item):
    """No spot object, no dynamic tree in 2009-04-04, nothing below a leaf: plain 404."""
    async with seeded() as app:
        path = f"/2009-04-04/{item}" if item == "dynamic" else f"/2009-04-04/meta-data/{item}"
        assert_plain(await get(app, path), 404, "404 - Not Found")


async def test_hollow_spot_and_missing_addresses_over_http():
    """A spot object adds spot/termination-time; without addresses the three address keys are gone (404)."""
    doc = {**seed(), "spot": {"termination_time": "20220707T13:13:13Z"}}
    doc["network"] = {"addresses": []}
    async with seeded() as app:
        await push_record(app, [SEED_IP], doc, USERDATA)
        listing = await get(app, "/2009-04-04/meta-data/")
        assert listing.text == "instance-id\nhostname\niqn\nplan\nfacility\ntags\noperating-system\npublic-keys\nspot"
        assert (await get(app, "/2009-04-04/meta-data/spot")).text == "termination-time"
        assert (await get(app, "/2009-04-04/meta-data/spot/termination-time/")).text == "20220707T13:13:13Z"
        for key in ("public-ipv4", "public-ipv6", "local-ipv4"):
            assert_plain(await get(app, f"/2009-04-04/meta-data/{key}"), 404, "404 - Not Found")


# --- the AWS layout -----------------------------------------------------------------------------------------------


async def test_root_lists_the_versions():
    """GET / lists every version served, one per line, no trailing newline."""
    async with seeded() as app:
        answer = await get(app, "/")
        assert (answer.status_code, answer.text) == (200, "2009-04-04\n2016-09-02\n2018-09-24\n2021-03-23\nlatest")
        assert answer.headers["content-type"] == TEXT


@pytest.mark.parametrize("version", AWS_VERSIONS)
async def test_every_listed_entry_answers_200_under_each_aws_version(version):
    """Crawling meta-data/ and dynamic/ from their listings reaches only 200s, values without trailing newline."""
    async with seeded() as app, client_from(app, SEED_IP) as guest:
        for path in (f"/{version}", f"/{version}/"):
            root = await guest.get(path)
            assert (root.status_code, root.text) == (200, "dynamic\nmeta-data\nuser-data")
        tree: dict[str, bytes] = {}
        await crawl(guest, f"/{version}/meta-data/", tree)
        await crawl(guest, f"/{version}/dynamic/", tree)
        md = f"/{version}/meta-data/"
        mac = f"{md}network/interfaces/macs/40:a6:b7:74:9f:10/"
        expected = {
            f"{md}ami-id": b"31853a2b0b2fcc4ee7fd5da5e53611303b60aafa",
            f"{md}instance-id": b"cc40301c-4038-4011-af55-6eae3ba60246",
            f"{md}instance-type": b"c3.medium.x86",
            f"{md}hostname": b"metadata-example-01",
            f"{md}local-hostname": b"metadata-example-01",
            f"{md}public-hostname": b"metadata-example-01",
            f"{md}local-ipv4": b"10.70.17.9",
            f"{md}public-ipv4": b"40.91.78.229",
            f"{md}mac": b"40:a6:b7:74:9f:10",
            f"{md}placement/availability-zone": b"da11",
            f"{md}placement/region": b"da1",
            f"{md}public-keys/": b"0=test@testmachine.local\n1=test@testmachine.local-1",
            f"{md}public-keys/0/openssh-key": seed()["ssh_keys"][0].encode(),
            f"{md}public-keys/1/openssh-key": seed()["ssh_keys"][1].encode(),
            f"{md}block-device-mapping/root": b"/dev/sda",
            f"{mac}device-number": b"0",
            f"{mac}local-ipv4s": b"10.70.17.9",
            f"{mac}public-ipv4s": b"40.91.78.229",
            f"{mac}ipv6s": b"2001:0db8:8583:0000::9",
            f"{mac}subnet-ipv4-cidr-block": b"10.70.17.8/31",
            f"{mac}vpc-id": b"vpc-3940c2414bc950701",
            f"/{version}/dynamic/instance-identity/": b"document\npkcs7\nrsa2048\nsignature",
        }
        assert {path: tree.get(path) for path in expected} == expected
        # meta-data values (ipv6 and events/maintenance/{history,scheduled} among them) + identity parts
        assert len([p for p in tree if not p.endswith("/")]) == 37 + 4
        userdata = await guest.get(f"/{version}/user-data")
        assert userdata.content == USERDATA.encode()  # userdata is served byte for byte, newline included


async def test_every_version_serves_the_same_aws_tree():
    """2016-09-02, 2018-09-24, 2021-03-23 and latest answer the same meta-data, path for path."""
    async with seeded() as app, client_from(app, SEED_IP) as guest:
        trees = {}
        for version in AWS_VERSIONS:
            tree: dict[str, bytes] = {}
            await crawl(guest, f"/{version}/meta-data/", tree)
            trees[version] = {path.split("/", 2)[2]: body for path, body in tree.items()}
        assert all(tree == trees["latest"] for tree in trees.values())


async def test_tags_and_spot_over_http():
    """Tags 'k=v' appear under tags/instance/ and spot/termination-time is served when set."""
    doc = {**seed(), "tags": ["role=web", "env=prod", "plain"], "spot": {"termination_time": "2030-01-01T00:00:00Z"}}
    async with seeded() as app:
        await push_record(app, [SEED_IP], doc, USERDATA)
        assert (await get(app, "/latest/meta-data/tags/instance/")).text == "role\nenv"
        assert (await get(app, "/latest/meta-data/tags/instance/role")).text == "web"
        assert (await get(app, "/latest/meta-data/tags/instance/env/")).text == "prod"
        assert (await get(app, "/latest/meta-data/spot/termination-time")).text == "2030-01-01T00:00:00Z"
        assert (await get(app, "/latest/meta-data/instance-life-cycle")).text == "spot"


async def test_a_trailing_slash_on_every_leaf_is_accepted():
    """Each value answers the same with a trailing slash."""
    async with seeded() as app, client_from(app, SEED_IP) as guest:
        tree: dict[str, bytes] = {}
        await crawl(guest, "/latest/meta-data/", tree)
        await crawl(guest, "/latest/dynamic/", tree)
        leaves = [path for path in tree if not path.endswith("/")]
        assert len(leaves) > 30
        for path in leaves:
            slashed = await guest.get(path + "/")
            assert (slashed.status_code, slashed.content) == (200, tree[path]), path


async def test_head_answers_every_get_path_with_the_same_length_and_no_body():
    """HEAD on every GET path (versions, hollow, AWS, user-data, 404s) has GET's status and Content-Length, no body."""
    async with seeded() as app, client_from(app, SEED_IP) as guest:
        tree: dict[str, bytes] = {}
        for version in AWS_VERSIONS:
            await crawl(guest, f"/{version}/meta-data/", tree)
            await crawl(guest, f"/{version}/dynamic/", tree)
        paths = [
            *tree,
            "/",
            "/latest",
            "/latest/user-data",
            "/2009-04-04/",
            "/2009-04-04/user-data",
            *(f"/2009-04-04/meta-data/{item}" for item in HOLLOW_SEED),
            "/latest/meta-data/nope",
            "/2009-04-04/meta-data/spot",
        ]
        for path in paths:
            got = await guest.get(path)
            head = await guest.head(path)
            assert head.status_code == got.status_code, path
            assert head.content == b"", path
            assert head.headers["content-length"] == str(len(got.content)), path
            assert head.headers["content-type"] == got.headers["content-type"], path
        stranger = await get(app, "/latest/meta-data/", ip=STRANGER_IP, method="HEAD")
        assert (stranger.status_code, stranger.content, stranger.headers["content-length"]) == (404, b"", "15")


# --- unknown paths and callers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/latest/meta-data/nope",
        "/latest/meta-data/../",
        "/latest/meta-data/..",
        "/latest/meta-data/instance-id/extra",
        "/latest/meta-data/public-keys/0=test@testmachine.local",
        "/latest/meta-data/public-keys/9/openssh-key",
        "/latest/meta-data/é",
        "/latest/meta-data/\x00",
        "/latest/meta-data/" + "a" * 20000,
        "/latest/" + "x/" * 5000,
        "/latest/api/token",
        "/latest/dynamic/instance-identity/document/x",
        "/2016-09-02/user-data/x",
        "/2009-04-04/meta-data/operating-system/../instance-id",
    ],
)
async def test_unknown_paths_under_a_version_are_plain_404(path):
    """Odd and unknown paths under a version (exact bytes, no client normalisation) are EC2's plain 404."""
    async with seeded() as app:
        status, headers, body = await raw(app, path)
        assert (status, body) == (404, b"404 - Not Found")
        assert headers["content-type"] == TEXT
        assert headers["content-length"] == "15"


async def test_percent_encoded_non_ascii_and_long_paths_through_a_client_are_plain_404():
    """Through httpx too: a percent-encoded UTF-8 name and a very long path are 404, never 500."""
    async with seeded() as app:
        assert_plain(await get(app, "/latest/meta-data/%C3%A9t%C3%A9"), 404, "404 - Not Found")
        assert_plain(await get(app, "/latest/meta-data/%FF%FE"), 404, "404 - Not Found")
        assert_plain(await get(app, "/2009-04-04/meta-data/" + "b" * 8000), 404, "404 - Not Found")


@pytest.mark.parametrize("path", ["//", "//latest/meta-data/", "/nope/meta-data/"])
async def test_paths_outside_the_ec2_namespace_are_404_never_500(path):
    """'//' and segments that are not version-shaped are not EC2 paths: the admin app's JSON 404."""
    async with seeded() as app:
        status, headers, body = await raw(app, path)
        assert (status, json.loads(body)) == (404, {"message": "not found"})
        assert headers["content-type"] == "application/json"


@pytest.mark.parametrize("path", ["/2010-01-01/meta-data/", "/1.0/meta-data/", "/latestx/meta-data/", "/2099-12-31"])
async def test_unknown_ec2_versions_get_the_plain_ec2_404(path):
    """A version-shaped first segment we do not serve is EC2's plain 404, as EC2 clients expect."""
    async with seeded() as app:
        assert_plain(await get(app, path), 404, "404 - Not Found")


@pytest.mark.parametrize(
    "path",
    ["/latest/meta-data/", "/latest/meta-data/instance-id", "/latest/user-data", "/2009-04-04/meta-data",
     "/2016-09-02/dynamic/instance-identity/document"],
)
async def test_an_unknown_caller_gets_plain_404(path):
    """A source address no instance holds gets EC2's plain 404 on every flavor path."""
    async with seeded() as app:
        assert_plain(await get(app, path, ip=STRANGER_IP), 404, "404 - Not Found")


async def test_an_unknown_caller_cannot_mint_a_token():
    """PUT /latest/api/token from an unknown address is a plain 404 (nothing to bind the token to)."""
    async with seeded() as app:
        answer = await get(app, "/latest/api/token", ip=STRANGER_IP, method="PUT", headers={TTL: "60"})
        assert_plain(answer, 404, "404 - Not Found")


@pytest.mark.parametrize(("method", "path"), [("POST", "/latest/meta-data/"), ("DELETE", "/latest/user-data"),
                                              ("PUT", "/latest/meta-data/instance-id"), ("POST", "/")])
async def test_other_methods_are_plain_405(method, path):
    """Only GET and HEAD read; anything else (but the token PUT) is a plain 405."""
    async with seeded() as app:
        assert_plain(await get(app, path, method=method), 405, "405 - Method Not Allowed")


async def test_a_record_with_userdata_only_serves_only_user_data():
    """An instance with userdata but no metadata: user-data answers, meta-data is 404."""
    async with seeded() as app:
        async with admin_client(app) as admin:
            body = {"id": "0d7cf5a3-43a3-4a8f-9d43-55f1b5c2f4a1", "ipAddresses": ["10.70.99.2"], "userdata": "only\n",
                    "userdata_encoding": "text"}
            posted = await admin.post("/device-userdata", json=body)
            assert posted.json()["applied"] is True, posted.text
        assert (await get(app, "/latest/user-data", ip="10.70.99.2")).content == b"only\n"
        assert (await get(app, "/latest/", ip="10.70.99.2")).text == "user-data"
        assert_plain(await get(app, "/latest/meta-data/", ip="10.70.99.2"), 404, "404 - Not Found")


# --- IMDSv2 -------------------------------------------------------------------------------------------------------


async def mint(app: InstanceFront, ip: str = SEED_IP, ttl: str = "21600") -> str:
    answer = await get(app, "/latest/api/token", ip=ip, method="PUT", headers={TTL: ttl})
    assert answer.status_code == 200, answer.text
    assert answer.headers[TTL] == ttl
    return answer.text


@pytest.mark.parametrize("ttl", ["1", "21600", "300"])
async def test_a_token_put_with_a_valid_ttl_returns_a_token_that_reads(ttl):
    """TTL 1..21600 mints a token; a GET carrying it answers 200 with the seconds left in the TTL header."""
    async with seeded() as app:
        token = await mint(app, ttl=ttl)
        assert token
        answer = await get(app, "/latest/meta-data/instance-id", headers={TOKEN: token})
        assert (answer.status_code, answer.text) == (200, "cc40301c-4038-4011-af55-6eae3ba60246")
        assert 0 < int(answer.headers[TTL]) <= int(ttl)


@pytest.mark.parametrize(
    "headers", [{TTL: "0"}, {TTL: "21601"}, {TTL: "abc"}, {TTL: ""}, {TTL: "-5"}, {TTL: "1.5"}, {}]
)
async def test_a_token_put_with_a_bad_or_missing_ttl_is_400_without_a_token(headers):
    """TTL 0, 21601, non-numbers and a missing header answer a plain 400 and no token."""
    async with seeded() as app:
        answer = await get(app, "/latest/api/token", method="PUT", headers=headers)
        assert_plain(answer, 400, "400 - Bad Request")


async def test_a_token_put_through_a_proxy_is_refused_even_from_a_trusted_one():
    """A PUT carrying X-Forwarded-For is 403, from a trusted proxy too, while proxied GETs still work."""
    async with seeded(trusted_proxy=(ipaddress.ip_network(PROXY_NET),)) as app:
        for peer in (SEED_IP, PROXY):
            answer = await get(app, "/latest/api/token", ip=peer, method="PUT",
                               headers={TTL: "60", "X-Forwarded-For": SEED_IP})
            assert_plain(answer, 403, "403 - Forbidden")
        proxied = await get(app, "/latest/meta-data/instance-id", ip=PROXY, headers={"X-Forwarded-For": SEED_IP})
        assert (proxied.status_code, proxied.text) == (200, "cc40301c-4038-4011-af55-6eae3ba60246")


@pytest.mark.parametrize("path", TOKEN_PATHS)
@pytest.mark.parametrize(("name", "value"), FORWARDING)
async def test_every_forwarding_header_on_every_token_path_is_refused(name, value, path):
    """The one token-PUT rule on serve itself: any forwarding header, any spelling of the token path → 403.

    ``path`` is what the server decoded (``%74`` is ``t``); without the header the same PUT mints.
    """
    decoded = urllib.parse.unquote(path)
    async with seeded(trusted_proxy=(ipaddress.ip_network(PROXY_NET),)) as app:
        for peer in (SEED_IP, PROXY):
            status, headers, body = await raw(app, decoded, ip=peer, method="PUT", headers=((TTL, "60"), (name, value)))
            assert (status, headers["content-type"], body) == REFUSED
        status, _, token = await raw(app, decoded, method="PUT", headers=((TTL, "60"),))
        assert status == 200
        assert token


@pytest.mark.parametrize("path", OTHER_PATHS)
async def test_other_spellings_of_the_token_path_mint_nothing(path):
    """``//latest/api/token`` and case variants are not the token path: 404 or 405, with or without a proxy header."""
    async with seeded() as app:
        for extra in ((), (("X-Forwarded-For", SEED_IP),)):
            status, _, body = await raw(app, urllib.parse.unquote(path), method="PUT", headers=((TTL, "60"), *extra))
            assert (status, body) in {(404, b"404 - Not Found"), (404, b'{"message": "not found"}'),
                                      (405, b"405 - Method Not Allowed")}


async def test_a_token_is_bound_to_the_instance_that_minted_it():
    """Instance B presenting instance A's token is 401; A's own token works for A."""
    async with seeded() as app:
        token_a = await mint(app, SEED_IP)
        stolen = await get(app, "/latest/meta-data/instance-id", ip=OTHER_IP, headers={TOKEN: token_a})
        assert_plain(stolen, 401, "401 - Unauthorized")
        own = await get(app, "/latest/meta-data/instance-id", ip=OTHER_IP, headers={TOKEN: await mint(app, OTHER_IP)})
        assert own.text == OTHER_ID


def tampered_variants(token: str) -> list[str]:
    payload, _, mac = token.partition(".")
    raw_payload = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    owner, expiry, ttl = raw_payload.decode().split("|")
    longer = f"{owner}|{int(expiry) + 99999}|{ttl}".encode()
    other_owner = f"{OTHER_ID}|{expiry}|{ttl}".encode()
    flipped = mac[:-2] + ("A" if mac[-2] != "A" else "B") + mac[-1]
    return [
        f"{payload}.{flipped}",
        f"{base64.urlsafe_b64encode(longer).rstrip(b'=').decode()}.{mac}",
        f"{base64.urlsafe_b64encode(other_owner).rstrip(b'=').decode()}.{mac}",
        payload,
        f".{mac}",
        "",
        "not-a-token",
        "%%%.###",
        token + "x",
    ]


async def test_a_tampered_or_malformed_token_is_401():
    """A changed signature, a changed payload, a missing part or garbage: plain 401, on every version."""
    async with seeded() as app:
        token = await mint(app)
        for bad in tampered_variants(token):
            for path in ("/latest/meta-data/instance-id", "/2009-04-04/meta-data/instance-id", "/latest/user-data"):
                assert_plain(await get(app, path, headers={TOKEN: bad}), 401, "401 - Unauthorized")


async def test_an_expired_token_is_401():
    """A token whose expiry has passed (minted by an issuer with the same key and an earlier clock) is 401."""
    async with seeded() as app:
        key = app.services.tokens._key
        expired = TokenIssuer(key, clock=lambda: time.time() - 120).issue(seed()["id"], 60)
        almost = TokenIssuer(key, clock=lambda: time.time() - 50).issue(seed()["id"], 60)
        assert_plain(await get(app, "/latest/meta-data/", headers={TOKEN: expired}), 401, "401 - Unauthorized")
        fresh = await get(app, "/latest/meta-data/instance-id", headers={TOKEN: almost})
        assert fresh.status_code == 200
        assert 0 < int(fresh.headers[TTL]) <= 10


async def test_required_mode_refuses_tokenless_reads_and_serves_token_reads():
    """--imdsv2 required: a GET without a token is 401 everywhere; with one it is 200 and carries the TTL header."""
    async with seeded(imdsv2="required") as app:
        for path in ("/latest/meta-data/instance-id", "/latest/user-data", "/2009-04-04/meta-data/",
                     "/2021-03-23/dynamic/instance-identity/document"):
            assert_plain(await get(app, path), 401, "401 - Unauthorized")
            head = await get(app, path, method="HEAD")
            assert (head.status_code, head.content) == (401, b"")
        token = await mint(app, ttl="600")
        answer = await get(app, "/latest/meta-data/instance-id", headers={TOKEN: token})
        assert (answer.status_code, answer.text) == (200, "cc40301c-4038-4011-af55-6eae3ba60246")
        assert 590 <= int(answer.headers[TTL]) <= 600
        userdata = await get(app, "/latest/user-data", headers={TOKEN: token})
        assert userdata.content == USERDATA.encode()


async def test_optional_mode_serves_tokenless_reads_without_the_ttl_header():
    """--imdsv2 optional (the default): a tokenless GET is 200 and carries no token header."""
    async with seeded(imdsv2="optional") as app:
        answer = await get(app, "/latest/meta-data/local-ipv4")
        assert (answer.status_code, answer.text) == (200, "10.70.17.9")
        assert TTL.lower() not in answer.headers


async def test_tokens_survive_a_rebuild_with_the_same_key_file_and_fail_with_another(tmp_path):
    """A token minted by one app is accepted by a new app using the same --imdsv2-key-file, refused with another key."""
    key_file, other_key = tmp_path / "imdsv2.key", tmp_path / "other.key"
    key_file.write_bytes(b"k" * 32)
    other_key.write_bytes(b"o" * 32)
    async with seeded(imdsv2_key_file=key_file, imdsv2="required") as first:
        token = await mint(first)
    async with seeded(imdsv2_key_file=key_file, imdsv2="required") as second:
        answer = await get(second, "/latest/meta-data/instance-id", headers={TOKEN: token})
        assert (answer.status_code, answer.text) == (200, "cc40301c-4038-4011-af55-6eae3ba60246")
    async with seeded(imdsv2_key_file=other_key, imdsv2="required") as third:
        refused = await get(third, "/latest/meta-data/instance-id", headers={TOKEN: token})
        assert_plain(refused, 401, "401 - Unauthorized")


def test_an_unknown_imdsv2_mode_is_a_config_error():
    """--imdsv2 / IMDS_IMDSV2 accept only optional and required."""
    with pytest.raises(ConfigError, match=r"--imdsv2 / IMDS_IMDSV2: 'bogus' is not one of optional, required"):
        config.load({"imdsv2": "bogus"}, environ={})
    with pytest.raises(ConfigError, match="IMDS_IMDSV2"):
        config.load({}, environ={"IMDS_IMDSV2": "sometimes"})
    assert config.load({}, environ={"IMDS_IMDSV2": "required"}).ec2.imdsv2 == "required"
    assert config.load({}, environ={}).ec2.imdsv2 == "optional"


# --- identity document and its signatures -------------------------------------------------------------------------


async def identity_parts(app: InstanceFront, version: str = "latest") -> dict[str, bytes]:
    parts = {}
    for name in ("document", "signature", "pkcs7", "rsa2048"):
        answer = await get(app, f"/{version}/dynamic/instance-identity/{name}")
        assert answer.status_code == 200, name
        parts[name] = answer.content
    async with client_from(app, STRANGER_IP) as anyone:
        certificate = await anyone.get("/identity/certificate.pem")
    assert certificate.status_code == 200
    assert certificate.headers["content-type"] == "application/x-pem-file"
    parts["certificate"] = certificate.content
    return parts


def openssl_verify(tmp_path: Path, pkcs7_b64: bytes, certificate: bytes) -> subprocess.CompletedProcess[str]:
    """AWS's own check: the served lines between PKCS7 armour, `openssl smime -verify` with no ``-content``."""
    if OPENSSL is None:
        pytest.fail("the openssl binary is not installed (apt-get install openssl); it verifies the pkcs7 signature")
    (tmp_path / "pkcs7").write_bytes(b"-----BEGIN PKCS7-----\n" + pkcs7_b64 + b"\n-----END PKCS7-----\n")
    (tmp_path / "cert.pem").write_bytes(certificate)
    return subprocess.run(
        [OPENSSL, "smime", "-verify", "-inform", "PEM", "-in", str(tmp_path / "pkcs7"), "-binary",
         "-certfile", str(tmp_path / "cert.pem"), "-CAfile", str(tmp_path / "cert.pem"), "-purpose", "any",
         "-out", str(tmp_path / "document")],
        capture_output=True, text=True, timeout=30, check=False,
    )


@pytest.mark.parametrize("version", AWS_VERSIONS)
async def test_identity_document_fields_match_the_record(version):
    """The JSON document carries the record's id, region, zone, type, private IP, account and architecture."""
    async with seeded() as app:
        zone = {"project_id": "acct-42", "region": "us-west-2", "availability_zone": "us-west-2a"}
        await push_record(app, [SEED_IP], {**seed(), **zone}, USERDATA)
        document = json.loads((await get(app, f"/{version}/dynamic/instance-identity/document")).content)
        assert {k: document[k] for k in ("instanceId", "region", "availabilityZone", "instanceType", "privateIp",
                                          "accountId", "architecture", "imageId", "version")} == {
            "instanceId": "cc40301c-4038-4011-af55-6eae3ba60246",
            "region": "us-west-2",
            "availabilityZone": "us-west-2a",
            "instanceType": "c3.medium.x86",
            "privateIp": "10.70.17.9",
            "accountId": "acct-42",
            "architecture": "x86_64",
            "imageId": "31853a2b0b2fcc4ee7fd5da5e53611303b60aafa",
            "version": "2017-09-30",
        }
        assert document["pendingTime"].endswith("Z")


async def test_signature_verifies_with_the_published_certificate_and_fails_for_a_changed_document():
    """'signature' is RSA PKCS#1 v1.5 SHA-256 over the document bytes, checked with /identity/certificate.pem."""
    async with seeded() as app:
        parts = await identity_parts(app)
    public_key = x509.load_pem_x509_certificate(parts["certificate"]).public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    signature = base64.b64decode(parts["signature"])
    public_key.verify(signature, parts["document"], padding.PKCS1v15(), hashes.SHA256())
    changed = parts["document"].replace(b"c3.medium.x86", b"c3.large.x86")
    with pytest.raises(InvalidSignature):
        public_key.verify(signature, changed, padding.PKCS1v15(), hashes.SHA256())


async def test_pkcs7_and_rsa2048_verify_with_openssl_and_fail_for_a_changed_document(tmp_path):
    """AWS's `openssl smime -verify`: accepts pkcs7 and rsa2048 and print the document inside; a changed one fails."""
    async with seeded() as app:
        parts = await identity_parts(app, "2021-03-23")
    for name in ("pkcs7", "rsa2048"):
        assert all(len(line) <= 64 for line in parts[name].split(b"\n"))
        ok = openssl_verify(tmp_path, parts[name], parts["certificate"])
        assert ok.returncode == 0, ok.stderr
        assert "Verification successful" in ok.stderr
        assert (tmp_path / "document").read_bytes() == parts["document"]  # the document is inside, as on AWS
        der = base64.b64decode(parts[name])
        assert der.count(b"10.70.17.9") == 1
        changed = base64.b64encode(der.replace(b"10.70.17.9", b"10.70.17.8"))
        bad = openssl_verify(tmp_path, changed, parts["certificate"])
        assert bad.returncode != 0
        assert "Verification failure" in bad.stderr or "digest failure" in bad.stderr, bad.stderr


async def test_one_pkcs7_answers_pkcs7_and_rsa2048_under_every_version():
    """One key, one certificate: pkcs7 and rsa2048 are the same signature, made once for the document."""
    async with seeded() as app:
        made = count_signing(app.services.signer)
        latest = await identity_parts(app, "latest")
        dated = await identity_parts(app, "2021-03-23")
    assert sorted(made) == ["pkcs7", "signature"]  # one of each for the document, whatever the version read
    assert latest["pkcs7"] == latest["rsa2048"]
    assert (dated["document"], dated["pkcs7"], dated["signature"]) == (
        latest["document"], latest["pkcs7"], latest["signature"])


async def test_the_first_read_of_a_tree_has_its_signatures_made_before_they_are_read():
    """Any read of an instance's EC2 tree queues its signatures: made on the signing thread, then served as made."""
    async with seeded(render_ahead=False) as app:  # built at the read (ahead: tests/integration/test_render_ahead.py)
        made = count_signing(app.services.signer)
        assert (await get(app, "/latest/meta-data/instance-id")).text == seed()["id"]
        await wait_for_async(lambda: sorted(made) == ["pkcs7", "signature"], what="both signatures made ahead",
                             timeout=30)
        parts = await identity_parts(app)
    assert sorted(made) == ["pkcs7", "signature"]  # the reads found them made: none signed again
    assert parts["pkcs7"] == parts["rsa2048"]


def write_key(path: Path, key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


async def test_a_configured_identity_key_signs_and_is_published(tmp_path):
    """--identity-key: the served certificate holds that key's public half and the signature verifies with it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with seeded(identity_key=write_key(tmp_path / "identity.pem", key)) as app:
        parts = await identity_parts(app)
    served = x509.load_pem_x509_certificate(parts["certificate"]).public_key()
    assert isinstance(served, rsa.RSAPublicKey)
    assert served.public_numbers() == key.public_key().public_numbers()
    key.public_key().verify(base64.b64decode(parts["signature"]), parts["document"], padding.PKCS1v15(),
                            hashes.SHA256())


@pytest.mark.parametrize(
    ("make_key", "message"),
    [
        (lambda p: p.write_bytes(b"not a key") and p, "not an unencrypted PEM private key"),
        (lambda p: write_key(p, ec.generate_private_key(ec.SECP256R1())), "must be an RSA key"),
    ],
)
async def test_a_bad_identity_key_is_a_config_error_at_startup(tmp_path, make_key: Callable[[Path], Path], message):
    """An unreadable or non-RSA --identity-key stops the app at startup with a ConfigError naming the problem."""
    path = tmp_path / "identity.pem"
    make_key(path)
    with pytest.raises(ConfigError, match=message):
        async with running_app(make_settings(identity_key=path)):
            pass
