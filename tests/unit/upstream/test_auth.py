"""Upstream credentials: OAuth2 client credentials against a fake issuer on a real socket, with an injected clock."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest

from factories import new_id
from fake_upstream import DISCOVERY_PATH, TOKEN_PATH, FakeUpstream, running_upstream
from helpers import FakeClock
from imds.errors import UpstreamError
from imds.upstream.auth import ClientCredentials, NoCredentials, OAuth2ClientCredentials, StaticBearer
from imds.upstream.client import UpstreamClient
from oidc_server import dead_url

pytestmark = pytest.mark.anyio

CLIENT_ID = "imds-client"
SECRET = "client-s3cret:with/odd chars"


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with running_upstream() as fake:
        fake.enable_oauth(CLIENT_ID, SECRET)
        yield fake


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(500.0)


@asynccontextmanager
async def oauth(
    issuer: str, clock: FakeClock, *, scopes: tuple[str, ...] = (), audience: str | None = None, secret: str = SECRET
) -> AsyncIterator[OAuth2ClientCredentials]:
    async with httpx.AsyncClient(trust_env=False) as http:
        yield OAuth2ClientCredentials(http, ClientCredentials(issuer, CLIENT_ID, secret, scopes, audience), clock)


def token_calls(upstream: FakeUpstream) -> int:
    return upstream.count(TOKEN_PATH)


def discovery_calls(upstream: FakeUpstream) -> int:
    return upstream.count(DISCOVERY_PATH)


async def test_no_credentials_and_static_bearer_headers():
    """NoCredentials adds nothing; StaticBearer adds its token; invalidate changes neither."""
    none, static = NoCredentials(), StaticBearer("tok")
    none.invalidate()
    static.invalidate()
    assert await none.headers() == {}
    assert await static.headers() == {"Authorization": "Bearer tok"}


@pytest.mark.parametrize("trailing", ["", "/"])
async def test_discovery_then_a_client_credentials_grant(upstream, clock, trailing):
    """The token endpoint comes from discovery; the grant carries basic auth, scope and audience."""
    async with oauth(upstream.issuer + trailing, clock, scopes=("metadata:read", "userdata:read"),
                     audience="https://upstream.example") as auth:
        assert await auth.headers() == {"Authorization": "Bearer access-1"}
    discovery, grant = upstream.log("/oauth")
    assert (discovery.method, discovery.path) == ("GET", DISCOVERY_PATH)
    assert (grant.method, grant.path) == ("POST", TOKEN_PATH)
    assert grant.headers["content-type"] == "application/x-www-form-urlencoded"
    assert grant.basic_auth() == (CLIENT_ID, SECRET)
    assert grant.form() == {
        "grant_type": "client_credentials",
        "scope": "metadata:read userdata:read",
        "audience": "https://upstream.example",
    }
    assert SECRET not in grant.body.decode()


async def test_without_scopes_or_audience_the_form_is_only_the_grant_type(upstream, clock):
    """No scope and no audience fields unless configured."""
    async with oauth(upstream.issuer, clock) as auth:
        await auth.headers()
    (grant,) = upstream.log(TOKEN_PATH)
    assert grant.form() == {"grant_type": "client_credentials"}


async def test_the_token_is_reused_until_shortly_before_it_expires(upstream, clock):
    """expires_in=3600: the same token for 3570 s (30 s early), then one new grant; discovery once."""
    async with oauth(upstream.issuer, clock) as auth:
        assert await auth.headers() == {"Authorization": "Bearer access-1"}
        clock.now += 3569.9
        for _ in range(5):
            assert await auth.headers() == {"Authorization": "Bearer access-1"}
        assert token_calls(upstream) == 1
        clock.now += 0.1
        assert await auth.headers() == {"Authorization": "Bearer access-2"}
        assert await auth.headers() == {"Authorization": "Bearer access-2"}
    assert token_calls(upstream) == 2
    assert discovery_calls(upstream) == 1


@pytest.mark.parametrize(("expires_in", "lasts"), [(40, 20.0), (61, 31.0), (None, 270.0)])
async def test_short_and_missing_lifetimes(upstream, clock, expires_in, lasts):
    """Short tokens are kept for half their life at least; without expires_in, 300 s is assumed."""
    upstream.enable_oauth(CLIENT_ID, SECRET, expires_in=expires_in)
    async with oauth(upstream.issuer, clock) as auth:
        await auth.headers()
        clock.now += lasts - 0.01
        assert await auth.headers() == {"Authorization": "Bearer access-1"}
        clock.now += 0.01
        assert await auth.headers() == {"Authorization": "Bearer access-2"}


async def test_concurrent_callers_share_one_grant(upstream, clock):
    """Twenty callers at once with no token yet → one discovery, one grant."""
    async with oauth(upstream.issuer, clock) as auth:
        answers = await asyncio.gather(*(auth.headers() for _ in range(20)))
    assert answers == [{"Authorization": "Bearer access-1"}] * 20
    assert (discovery_calls(upstream), token_calls(upstream)) == (1, 1)


async def test_invalidate_forces_a_new_grant_without_new_discovery(upstream, clock):
    """After invalidate() the next call fetches a fresh token from the remembered endpoint."""
    async with oauth(upstream.issuer, clock) as auth:
        await auth.headers()
        auth.invalidate()
        assert await auth.headers() == {"Authorization": "Bearer access-2"}
    assert (discovery_calls(upstream), token_calls(upstream)) == (1, 2)


async def test_the_upstream_client_renews_once_when_the_upstream_answers_401(upstream, clock):
    """A token the upstream stopped accepting → 401 → one new grant → the call is retried and succeeds."""
    upstream.require_bearer()
    instance_id = new_id()
    body = upstream.put_metadata(instance_id, ["10.2.0.1"], {"id": instance_id})
    async with httpx.AsyncClient(trust_env=False) as http:
        auth = OAuth2ClientCredentials(http, ClientCredentials(upstream.issuer, CLIENT_ID, SECRET), clock)
        client = UpstreamClient(http, upstream.base, auth=auth)
        assert await client.by_id("metadata", instance_id) == body
        assert await client.by_ip("metadata", "10.2.0.1") == body
        upstream.revoke_tokens()
        assert await client.by_ip("metadata", "10.2.0.1") == body
    assert [c.headers["authorization"] for c in upstream.log()] == [
        "Bearer access-1", "Bearer access-1", "Bearer access-1", "Bearer access-2",
    ]
    assert upstream.tokens_issued() == ["access-1", "access-2"]
    assert discovery_calls(upstream) == 1


async def test_tokens_the_upstream_never_accepts_are_renewed_once_not_in_a_loop(upstream, clock):
    """The upstream refuses every issued token: two upstream calls, two grants, then UpstreamError."""
    upstream.require_static_bearer("something-else")
    async with httpx.AsyncClient(trust_env=False) as http:
        auth = OAuth2ClientCredentials(http, ClientCredentials(upstream.issuer, CLIENT_ID, SECRET), clock)
        client = UpstreamClient(http, upstream.base, auth=auth)
        with pytest.raises(UpstreamError, match="answered 401"):
            await client.by_id("metadata", new_id())
    assert (upstream.count(), token_calls(upstream)) == (2, 2)


async def test_a_wrong_client_secret_is_an_upstream_error(upstream, clock):
    """The token endpoint's 401 surfaces as UpstreamError naming the endpoint; no token is cached."""
    async with oauth(upstream.issuer, clock, secret="wrong") as auth:
        with pytest.raises(UpstreamError, match=f"{TOKEN_PATH} answered 401"):
            await auth.headers()
        with pytest.raises(UpstreamError):
            await auth.headers()
    assert token_calls(upstream) == 2


@pytest.mark.parametrize(
    ("path", "status", "body", "message"),
    [
        (DISCOVERY_PATH, 200, {"issuer": "x"}, "is malformed: no http\\(s\\) token_endpoint"),
        (DISCOVERY_PATH, 404, {"error": "nope"}, "openid-configuration: HTTP 404"),
        (TOKEN_PATH, 200, {"token_type": "Bearer"}, "answered without an access_token"),
        (TOKEN_PATH, 200, {"access_token": ""}, "answered without an access_token"),
        (TOKEN_PATH, 200, b"not json", "something that is not JSON"),
        (TOKEN_PATH, 200, ["a", "list"], "JSON that is not an object"),
        (TOKEN_PATH, 500, {"error": "down"}, "token answered 500"),
    ],
)
async def test_broken_issuer_answers_are_upstream_errors(upstream, clock, path, status, body, message):  # noqa: PLR0917
    """Every unusable discovery or token answer is an UpstreamError with a message saying what was wrong."""
    upstream.answer(path, status, body)
    async with oauth(upstream.issuer, clock) as auth:
        with pytest.raises(UpstreamError, match=message):
            await auth.headers()


async def test_an_unreachable_issuer_is_an_upstream_error(clock):
    """Connection refused at discovery → UpstreamError saying it cannot fetch the discovery document."""
    async with oauth(dead_url("/realm"), clock) as auth:
        with pytest.raises(UpstreamError, match=r"cannot fetch the OIDC discovery document from .*configuration: "):
            await auth.headers()


def test_the_credentials_repr_hides_the_secret():
    """A traceback or log line showing the credentials never shows the secret."""
    shown = repr(ClientCredentials("https://issuer", CLIENT_ID, SECRET, ("s",), "aud"))
    assert SECRET not in shown
    assert CLIENT_ID in shown
    assert base64.b64encode(SECRET.encode()).decode() not in shown


async def test_client_id_and_secret_are_form_encoded_inside_basic_auth(upstream, clock):
    """RFC 6749 2.3.1: ':' '%' '/' and spaces in the id or secret reach the server intact once decoded."""
    upstream.enable_oauth("svc:imds/1", "p@ss:w%rd/ +x")
    credentials = ClientCredentials(upstream.issuer, "svc:imds/1", "p@ss:w%rd/ +x")
    async with httpx.AsyncClient(trust_env=False) as http:
        auth = OAuth2ClientCredentials(http, credentials, clock=clock)
        assert await auth.headers() == {"Authorization": "Bearer access-1"}
    (grant,) = upstream.log(TOKEN_PATH)
    assert grant.headers["authorization"] != "Basic " + base64.b64encode(b"svc:imds/1:p@ss:w%rd/ +x").decode()
    assert grant.basic_auth() == ("svc:imds/1", "p@ss:w%rd/ +x")
