"""One discovery fetch per OIDC issuer, shared by every part that needs an endpoint (real issuer on 127.0.0.1)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from imds.errors import UpstreamError
from imds.upstream.oidc import Discovery, IssuerKeys
from oidc_server import ISSUER_PATH, Issuer, running_issuer

pytestmark = pytest.mark.anyio

DISCOVERY_PATH = ISSUER_PATH + "/.well-known/openid-configuration"


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    with running_issuer() as running:
        yield running


async def test_every_user_of_one_issuer_shares_one_discovery_fetch(issuer):
    """Concurrent first calls, two key sets and a trailing-slash spelling of the issuer: one fetch."""
    async with httpx.AsyncClient(trust_env=False) as http:
        discovery = Discovery(http)
        endpoints = await asyncio.gather(*(discovery.endpoint(issuer.issuer, "jwks_uri") for _ in range(10)))
        first = await IssuerKeys(discovery, issuer.issuer).fetch()
        second = await IssuerKeys(discovery, issuer.issuer + "/").fetch()
    assert set(endpoints) == {issuer.jwks_url}
    assert first[0] == second[0] == issuer.jwks_url
    assert [key["kid"] for key in first[1]["keys"]] == ["rsa-1", "ec-256"]
    assert (issuer.discovery_hits(), issuer.jwks_hits()) == (1, 2)


async def test_a_failed_discovery_is_not_kept(issuer):
    """A 500 is an UpstreamError naming the URL; once the issuer recovers the next call fetches again."""
    issuer.fail(DISCOVERY_PATH, 500, b"{}")
    async with httpx.AsyncClient(trust_env=False) as http:
        discovery = Discovery(http)
        with pytest.raises(UpstreamError) as caught:
            await discovery.endpoint(issuer.issuer, "jwks_uri")
        with issuer.lock:
            issuer.failures.clear()
        found = await discovery.endpoint(issuer.issuer, "jwks_uri")
    assert caught.value.message == f"cannot fetch the OIDC discovery document from {issuer.discovery_url}: HTTP 500"
    assert found == issuer.jwks_url
    assert issuer.discovery_hits() == 2


async def test_an_endpoint_the_document_lacks_is_an_upstream_error(issuer):
    """The document has no token_endpoint: the error names the document and the endpoint; jwks_uri still works."""
    async with httpx.AsyncClient(trust_env=False) as http:
        discovery = Discovery(http)
        with pytest.raises(UpstreamError) as caught:
            await discovery.endpoint(issuer.issuer, "token_endpoint")
        assert await discovery.endpoint(issuer.issuer, "jwks_uri") == issuer.jwks_url
    assert caught.value.message == (
        f"OIDC discovery document at {issuer.discovery_url} is malformed: no http(s) token_endpoint"
    )
    assert issuer.discovery_hits() == 1
