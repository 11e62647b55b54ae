"""UpstreamClient against a fake upstream on a real socket: hollow's lookup contract, statuses, headers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from factories import new_id
from fake_upstream import HANG, FakeUpstream, running_upstream
from imds import __version__
from imds.errors import UpstreamError, UpstreamUnavailable
from imds.upstream.auth import StaticBearer, UpstreamAuth
from imds.upstream.client import UpstreamClient
from oidc_server import dead_url

pytestmark = pytest.mark.anyio


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with running_upstream() as fake:
        yield fake


@asynccontextmanager
async def client_for(base: str, **kwargs: Any) -> AsyncIterator[UpstreamClient]:
    async with httpx.AsyncClient(trust_env=False) as http:
        yield UpstreamClient(http, base, **kwargs)


async def test_by_id_and_by_ip_return_hollows_bodies(upstream):
    """200 → the parsed JSON body, from /device-{kind}/{id} and /device-{kind}?ip_address=…."""
    instance_id = new_id()
    meta = upstream.put_metadata(instance_id, ["10.1.0.1", "10.1.0.2"], {"id": instance_id, "hostname": "h"})
    user = upstream.put_userdata(instance_id, ["10.1.0.1"], b"#!/bin/sh\n")
    async with client_for(upstream.base) as client:
        assert await client.by_id("metadata", instance_id) == meta
        assert await client.by_ip("metadata", "10.1.0.2") == meta
        assert await client.by_id("userdata", instance_id) == user
        assert await client.by_ip("userdata", "10.1.0.1") == user
    assert [(c.method, c.target) for c in upstream.log()] == [
        ("GET", f"/device-metadata/{instance_id}"),
        ("GET", "/device-metadata?ip_address=10.1.0.2"),
        ("GET", f"/device-userdata/{instance_id}"),
        ("GET", "/device-userdata?ip_address=10.1.0.1"),
    ]


@pytest.mark.parametrize(("suffix", "prefix"), [("", ""), ("/", ""), ("/api/v2", "/api/v2"), ("/api/v2/", "/api/v2")])
async def test_the_base_url_works_with_and_without_a_trailing_slash(upstream, suffix, prefix):
    """No double slash and no lost path prefix, whatever the base URL ends with."""
    instance_id = new_id()
    body = upstream.put_metadata(instance_id, ["10.1.0.3"], {"id": instance_id})
    async with client_for(upstream.base + suffix) as client:
        assert await client.by_id("metadata", instance_id) == body
        assert await client.by_ip("metadata", "10.1.0.3") == body
    assert [c.raw_target for c in upstream.log("/")] == [
        f"{prefix}/device-metadata/{instance_id}",
        f"{prefix}/device-metadata?ip_address=10.1.0.3",
    ]


async def test_an_ipv6_address_is_url_encoded_in_the_query(upstream):
    """The colons of an IPv6 ip_address are percent-encoded and arrive intact."""
    instance_id = new_id()
    body = upstream.put_metadata(instance_id, ["fd00::1:2"], {"id": instance_id})
    async with client_for(upstream.base) as client:
        assert await client.by_ip("metadata", "fd00::1:2") == body
    (call,) = upstream.log()
    assert call.raw_target == "/device-metadata?ip_address=fd00%3A%3A1%3A2"
    assert call.query == {"ip_address": "fd00::1:2"}


async def test_requests_carry_the_user_agent_and_accept_json_and_no_credentials_by_default(upstream):
    """User-Agent imds/<version>, Accept: application/json, and no Authorization without credentials."""
    async with client_for(upstream.base) as client:
        assert await client.by_id("metadata", new_id()) is None
    (call,) = upstream.log()
    assert call.headers["user-agent"] == f"imds/{__version__}"
    assert call.headers["accept"] == "application/json"
    assert "authorization" not in call.headers


async def test_a_static_bearer_token_is_sent(upstream):
    """StaticBearer → Authorization: Bearer <token> on every call."""
    upstream.require_static_bearer("s3cret")
    instance_id = new_id()
    body = upstream.put_metadata(instance_id, ["10.1.0.4"], {"id": instance_id})
    async with client_for(upstream.base, auth=StaticBearer("s3cret")) as client:
        assert await client.by_id("metadata", instance_id) == body
        assert await client.by_ip("metadata", "10.1.0.4") == body
    assert [c.headers["authorization"] for c in upstream.log()] == ["Bearer s3cret"] * 2


async def test_a_404_is_none(upstream):
    """404 by id or by address means "no such record": None, not an error."""
    async with client_for(upstream.base) as client:
        assert await client.by_id("metadata", new_id()) is None
        assert await client.by_ip("userdata", "10.1.0.5") is None
    assert upstream.count() == 2


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_a_5xx_is_upstream_unavailable(upstream, status):
    """Server errors raise UpstreamUnavailable naming the status and path."""
    upstream.fail_all(status)
    async with client_for(upstream.base) as client:
        with pytest.raises(UpstreamUnavailable, match=f"upstream answered {status} for /device-metadata"):
            await client.by_ip("metadata", "10.1.0.6")


@pytest.mark.parametrize("status", [400, 403, 409, 418])
async def test_other_statuses_are_upstream_errors_but_not_unavailability(upstream, status):
    """A 4xx other than 401/404 is an UpstreamError (the upstream is up, the answer is unusable)."""
    upstream.fail_all(status)
    async with client_for(upstream.base) as client:
        with pytest.raises(UpstreamError, match=f"answered {status}") as raised:
            await client.by_id("userdata", new_id())
    assert not isinstance(raised.value, UpstreamUnavailable)


async def test_a_200_that_is_not_json_is_an_upstream_error(upstream):
    """Invalid JSON in a 200 is an UpstreamError, not a crash."""
    upstream.answer("/device-metadata", 200, b"<html>oops</html>", content_type="text/html")
    async with client_for(upstream.base) as client:
        with pytest.raises(UpstreamError, match="non-JSON for /device-metadata"):
            await client.by_ip("metadata", "10.1.0.7")


async def test_a_hanging_upstream_times_out(upstream):
    """No answer within the timeout → UpstreamUnavailable saying so."""
    upstream.hang_all()
    async with client_for(upstream.base, timeout=0.2) as client:
        with pytest.raises(UpstreamUnavailable, match=r"timed out after 0\.2 s"):
            await client.by_id("metadata", new_id())
    assert upstream.count() == 1


async def test_an_unreachable_upstream_is_unavailable():
    """Connection refused → UpstreamUnavailable naming the transport error."""
    async with client_for(dead_url()) as client:
        with pytest.raises(UpstreamUnavailable, match="upstream unreachable: ConnectError"):
            await client.by_id("metadata", new_id())


class RotatingBearer:
    """Presents ``old`` until told the upstream refused it, then ``new``."""

    def __init__(self) -> None:
        self.token = "old"
        self.invalidated = 0

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def invalidate(self) -> None:
        self.invalidated += 1
        self.token = "new"


async def test_a_401_invalidates_the_credentials_and_retries_once(upstream):
    """401 → auth.invalidate() and one more call with fresh headers, which succeeds."""
    upstream.require_static_bearer("new")
    instance_id = new_id()
    body = upstream.put_metadata(instance_id, ["10.1.0.8"], {"id": instance_id})
    auth = RotatingBearer()
    checked: UpstreamAuth = auth
    async with client_for(upstream.base, auth=checked) as client:
        assert await client.by_id("metadata", instance_id) == body
    assert auth.invalidated == 1
    assert [c.headers["authorization"] for c in upstream.log()] == ["Bearer old", "Bearer new"]


async def test_a_second_401_is_an_error_without_a_third_call(upstream):
    """Credentials the upstream keeps refusing: exactly two calls, then UpstreamError (not a loop)."""
    upstream.require_static_bearer("right")
    async with client_for(upstream.base, auth=StaticBearer("wrong")) as client:
        with pytest.raises(UpstreamError, match="answered 401") as raised:
            await client.by_ip("metadata", "10.1.0.9")
    assert not isinstance(raised.value, UpstreamUnavailable)
    assert upstream.count() == 2


async def test_hang_on_one_path_leaves_the_others_answering(upstream):
    """A programmed per-target HANG affects only that target (the fake itself is per-path)."""
    upstream.answer("/device-metadata?ip_address=10.1.0.10", HANG)
    async with client_for(upstream.base, timeout=0.2) as client:
        with pytest.raises(UpstreamUnavailable):
            await client.by_ip("metadata", "10.1.0.10")
    # A generous timeout for the path that answers: a loaded machine must not turn it into a timeout.
    async with client_for(upstream.base, timeout=30.0) as client:
        assert await client.by_ip("metadata", "10.1.0.11") is None
