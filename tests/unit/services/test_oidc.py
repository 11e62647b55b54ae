"""OidcVerifier against a real issuer (discovery + JWKS over HTTP on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import jwt
import pytest
from structlog.testing import capture_logs

from helpers import FakeClock, make_settings
from imds.errors import Unauthenticated, UpstreamError
from imds.models import Principal
from imds.services.admission.oidc import LEEWAY_SECONDS, MAX_AGE_SECONDS, REFETCH_INTERVAL_SECONDS, OidcVerifier
from imds.upstream.oidc import Discovery
from imds.web.errors import status_for
from oidc_server import (
    AUDIENCE,
    ISSUER_PATH,
    JWKS_PATH,
    Issuer,
    dead_url,
    handmade_token,
    private_key,
    public_jwk,
    public_pem,
    running_issuer,
)

# One TLS context for every client: building one per test costs more than the test.
_TLS = ssl.create_default_context()


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    """A running issuer whose JWKS lists rsa-1 and ec-256."""
    with running_issuer() as running:
        yield running


@contextlib.asynccontextmanager
async def make_verifier(
    issuer: Issuer | None = None, *, clock: FakeClock | None = None, **settings: Any
) -> AsyncIterator[OidcVerifier]:
    """A verifier for ``issuer`` (audience AUDIENCE unless overridden), with its own HTTP client."""
    values: dict[str, Any] = {"admin_token": None, "oidc_audience": AUDIENCE}
    if issuer is not None:
        values["oidc_issuer"] = issuer.issuer
    values.update(settings)
    async with httpx.AsyncClient(timeout=30.0, verify=_TLS) as http:
        yield OidcVerifier(make_settings(**values), Discovery(http), clock=clock or FakeClock())


async def refused(verifier: OidcVerifier, token: str | None) -> str:
    """The message of the 401 the verifier raises for ``token``; checks the token is not echoed."""
    with pytest.raises(Unauthenticated) as caught:
        await verifier.authenticate(token)
    assert status_for(caught.value) == 401
    if token:
        assert all(part not in caught.value.message for part in token.split(".") if len(part) > 8)
    return caught.value.message


# -- accepted tokens ---------------------------------------------------------------


@pytest.mark.anyio
async def test_scopes_from_a_list_claim(issuer):
    """A list-valued scope claim grants the known scopes in it; unknown names are ignored."""
    token = issuer.token(scope=["metadata:read:metadata", "write", "openid", "admin:everything"])
    async with make_verifier(issuer) as verifier:
        principal = await verifier.authenticate(token)
    assert principal == Principal("alice", frozenset({"metadata:read:metadata", "write"}))


@pytest.mark.anyio
async def test_scopes_from_a_space_separated_claim(issuer):
    """A space-separated scope string grants the known scopes in it."""
    token = issuer.token(scope="openid profile  metadata:create:userdata delete")
    async with make_verifier(issuer) as verifier:
        principal = await verifier.authenticate(token)
    assert principal.scopes == frozenset({"metadata:create:userdata", "delete"})


@pytest.mark.anyio
async def test_custom_roles_claim(issuer):
    """With oidc_roles_claim=roles the scopes come from ``roles``, not from ``scope``."""
    token = issuer.token(scope="write", roles=["read"])
    async with make_verifier(issuer, oidc_roles_claim="roles") as verifier:
        principal = await verifier.authenticate(token)
    assert principal.scopes == frozenset({"read"})


@pytest.mark.anyio
async def test_nested_roles_claim(issuer):
    """A dotted roles claim (Keycloak's realm_access.roles) walks nested objects."""
    token = issuer.token(realm_access={"roles": ["metadata:delete:userdata", "offline_access"]})
    async with make_verifier(issuer, oidc_roles_claim="realm_access.roles") as verifier:
        principal = await verifier.authenticate(token)
    assert principal.scopes == frozenset({"metadata:delete:userdata"})


@pytest.mark.anyio
async def test_missing_or_odd_roles_claim_grants_nothing(issuer):
    """No roles claim, or one of the wrong type, gives a principal with no scopes (a 403 later, not a 401)."""
    async with make_verifier(issuer) as verifier:
        assert (await verifier.authenticate(issuer.token(scope=None))).scopes == frozenset()
        assert (await verifier.authenticate(issuer.token(scope={"write": True}))).scopes == frozenset()


@pytest.mark.anyio
async def test_subject_from_username_claim_with_sub_fallback(issuer):
    """The subject is the username claim when present, else ``sub``."""
    async with make_verifier(issuer, oidc_username_claim="preferred_username") as verifier:
        named = await verifier.authenticate(issuer.token(preferred_username="alice@example.org"))
        unnamed = await verifier.authenticate(issuer.token(sub="svc-42"))
    assert named.subject == "alice@example.org"
    assert unnamed.subject == "svc-42"


@pytest.mark.anyio
async def test_token_without_any_subject_is_refused(issuer):
    """A token with neither the username claim nor ``sub`` is refused."""
    async with make_verifier(issuer) as verifier:
        assert await refused(verifier, issuer.token(sub=None)) == "token names no subject (claim 'sub')"
    async with make_verifier(issuer, oidc_username_claim="email") as verifier:
        message = await refused(verifier, issuer.token(sub="", email=None))
    assert message == "token names no subject (claim 'email' or 'sub')"


@pytest.mark.anyio
@pytest.mark.parametrize(("kid", "alg", "jwk_alg"), [
    ("rsa-1", "RS256", None),
    ("rsa-1", "RS512", None),
    ("rsa-1", "PS256", "PS256"),
    ("ec-256", "ES256", "ES256"),
    ("ec-384", "ES384", None),
    ("ed-1", "EdDSA", "EdDSA"),
])
async def test_every_asymmetric_algorithm_is_accepted(issuer, kid, alg, jwk_alg):
    """RSA (PKCS#1 and PSS), EC and Ed25519 signatures verify against the published key."""
    issuer.publish(public_jwk(kid, alg=jwk_alg))
    async with make_verifier(issuer) as verifier:
        principal = await verifier.authenticate(issuer.token(kid, alg=alg))
    assert principal == Principal("alice", frozenset({"write", "read"}))


@pytest.mark.anyio
async def test_audience_may_be_one_of_a_list(issuer):
    """An ``aud`` list that contains the configured audience is accepted."""
    async with make_verifier(issuer) as verifier:
        principal = await verifier.authenticate(issuer.token(aud=["other-api", AUDIENCE]))
    assert principal.subject == "alice"


@pytest.mark.anyio
async def test_no_audience_configured_accepts_any_audience(issuer):
    """Without oidc_audience the ``aud`` claim is not checked (and a warning is logged at start)."""
    with capture_logs() as logs:
        async with make_verifier(issuer, oidc_audience=None) as verifier:
            principal = await verifier.authenticate(issuer.token(aud="someone-else"))
    assert principal.subject == "alice"
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == ["oidc.no_audience"]


@pytest.mark.anyio
async def test_clock_skew_within_leeway_is_tolerated(issuer):
    """A token issued a few seconds in the future (issuer clock ahead) is accepted."""
    soon = int(time.time() + LEEWAY_SECONDS) - 5
    async with make_verifier(issuer) as verifier:
        principal = await verifier.authenticate(issuer.token(iat=soon, nbf=soon))
    assert principal.subject == "alice"


# -- refused tokens ----------------------------------------------------------------

class FromNow(int):
    """A time claim given as seconds from when the test runs (PyJWT checks against the real clock)."""


def _at_run_time(claims: dict[str, object]) -> dict[str, object]:
    return {k: int(time.time()) + v if isinstance(v, FromNow) else v for k, v in claims.items()}


@pytest.mark.anyio
@pytest.mark.parametrize(("claims", "reason"), [
    ({"aud": "another-service"}, "token audience does not match"),
    ({"aud": None}, "token lacks the aud claim"),
    ({"iss": "https://evil.example/realms/test"}, "token issuer does not match"),
    ({"iss": None}, "token lacks the iss claim"),
    ({"exp": FromNow(-120)}, "token has expired"),
    ({"exp": None}, "token lacks the exp claim"),
    ({"nbf": FromNow(600)}, "token is not yet valid"),
    ({"iat": FromNow(600)}, "token is not yet valid"),
], ids=["wrong-aud", "no-aud", "wrong-iss", "no-iss", "expired", "no-exp", "nbf-future", "iat-future"])
async def test_invalid_claims_are_refused(issuer, claims, reason):
    """Wrong audience or issuer, expiry, not-yet-valid and missing required claims are 401s with a reason."""
    async with make_verifier(issuer) as verifier:
        assert await refused(verifier, issuer.token(**_at_run_time(claims))) == reason


@pytest.mark.anyio
async def test_unknown_key_is_refused(issuer):
    """A token signed by a key whose kid the JWKS does not list is refused."""
    async with make_verifier(issuer) as verifier:
        assert await refused(verifier, issuer.token("rogue")) == "token is signed by an unknown key"


@pytest.mark.anyio
async def test_forged_signature_under_a_known_kid_is_refused(issuer):
    """A token claiming a published kid but signed by another key fails signature verification."""
    async with make_verifier(issuer) as verifier:
        message = await refused(verifier, issuer.token("rogue", header_kid="rsa-1"))
    assert message == "token signature does not verify"


@pytest.mark.anyio
async def test_tampered_claims_are_refused(issuer):
    """Changing the payload of a valid token (granting more scopes) breaks its signature."""
    header, _, signature = issuer.token(scope="read").split(".")
    forged_payload = issuer.token("rogue", scope="write").split(".")[1]
    async with make_verifier(issuer) as verifier:
        message = await refused(verifier, f"{header}.{forged_payload}.{signature}")
    assert message == "token signature does not verify"


@pytest.mark.anyio
async def test_alg_none_is_refused(issuer):
    """An unsigned token (``alg: none``) is refused before any key is looked up."""
    token = handmade_token({"alg": "none", "kid": "rsa-1", "typ": "JWT"}, issuer.claims(), secret=None)
    async with make_verifier(issuer) as verifier:
        message = await refused(verifier, token)
    assert message.startswith("token algorithm is not accepted (one of: RS256, RS384, RS512, PS256")
    assert issuer.jwks_hits() == 0


@pytest.mark.anyio
@pytest.mark.parametrize("secret_form", ["pem", "jwk-n"])
async def test_hs256_signed_with_the_public_key_is_refused(issuer, secret_form):
    """The key-confusion attack (HS256 keyed with the issuer's public key) is refused."""
    secret = public_pem("rsa-1") if secret_form == "pem" else public_jwk("rsa-1")["n"].encode()
    token = handmade_token({"alg": "HS256", "kid": "rsa-1", "typ": "JWT"}, issuer.claims(scope="write"), secret)
    async with make_verifier(issuer) as verifier:
        message = await refused(verifier, token)
    assert message.startswith("token algorithm is not accepted")


@pytest.mark.anyio
async def test_symmetric_keys_in_the_jwks_are_never_used(issuer):
    """An ``oct`` key in the JWKS is ignored, so an HS256 token keyed with it is refused."""
    secret = b"shared-secret-published-by-mistake"
    oct_key = {"kty": "oct", "kid": "hmac", "k": "c2hhcmVkLXNlY3JldC1wdWJsaXNoZWQtYnktbWlzdGFrZQ", "alg": "HS256"}
    issuer.publish("rsa-1", oct_key)
    token = handmade_token({"alg": "HS256", "kid": "hmac"}, issuer.claims(), secret)
    async with make_verifier(issuer) as verifier:
        assert (await refused(verifier, token)).startswith("token algorithm is not accepted")
        # The rest of the key set still works.
        assert (await verifier.authenticate(issuer.token("rsa-1"))).subject == "alice"


@pytest.mark.anyio
@pytest.mark.parametrize(("kid", "alg", "published"), [
    ("rsa-1", "ES256", None),          # EC algorithm, RSA key
    ("ec-384", "ES256", None),         # P-256 algorithm, P-384 key
    ("rsa-1", "RS256", "PS256"),       # the JWK pins PS256
], ids=["kty-mismatch", "curve-mismatch", "jwk-alg-mismatch"])
async def test_algorithm_must_fit_the_key(issuer, kid, alg, published):
    """A token whose algorithm does not fit its key's type, curve or pinned alg is refused."""
    issuer.publish(public_jwk(kid, alg=published))
    _, payload, signature = issuer.token(kid).split(".")  # signed by the right key, then relabelled
    header = handmade_token({"alg": alg, "kid": kid, "typ": "JWT"}, {}, None).split(".")[0]
    async with make_verifier(issuer) as verifier:
        message = await refused(verifier, f"{header}.{payload}.{signature}")
    assert message == "token algorithm does not match its key"


@pytest.mark.anyio
@pytest.mark.parametrize(("token", "reason"), [
    ("not-a-jwt", "malformed token"),
    ("a.b.c", "malformed token"),
    ("", "missing bearer token (Authorization: Bearer <token>)"),
    (None, "missing bearer token (Authorization: Bearer <token>)"),
    (handmade_token({"alg": "RS256", "kid": 7}, {}, None), "malformed token"),
], ids=["no-dots", "bad-base64", "empty", "none", "numeric-kid"])
async def test_garbage_is_refused_without_fetching_keys(issuer, token, reason):
    """Garbage and empty tokens are 401s decided before the issuer is ever asked for keys."""
    async with make_verifier(issuer) as verifier:
        assert await refused(verifier, token) == reason
    assert issuer.jwks_hits() == 0


@pytest.mark.anyio
async def test_token_without_kid_uses_a_lone_key(issuer):
    """A token with no kid verifies against a JWKS of one key, and is refused when the JWKS has several."""
    token = jwt.encode(issuer.claims(), private_key("rsa-1"), algorithm="RS256")
    assert "kid" not in jwt.get_unverified_header(token)
    async with make_verifier(issuer) as verifier:
        assert await refused(verifier, token) == "token names no key (kid)"  # rsa-1 and ec-256 published
    issuer.publish("rsa-1")
    async with make_verifier(issuer) as verifier:
        assert (await verifier.authenticate(token)).subject == "alice"


# -- the key set: discovery, caching, rotation, rate limits --------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("suffix", ["", "/"])
async def test_discovery_finds_the_jwks(issuer, suffix):
    """Without oidc_jwks_url the JWKS comes from the discovery document (issuer with or without a slash)."""
    async with make_verifier(issuer, oidc_issuer=issuer.issuer + suffix) as verifier:
        for _ in range(3):
            assert (await verifier.authenticate(issuer.token())).subject == "alice"
    assert (issuer.discovery_hits(), issuer.jwks_hits()) == (1, 1)


@pytest.mark.anyio
async def test_explicit_jwks_url_skips_discovery(issuer):
    """With oidc_jwks_url set the discovery document is never fetched."""
    issuer.fail(ISSUER_PATH + "/.well-known/openid-configuration", 500)
    async with make_verifier(issuer, oidc_jwks_url=issuer.jwks_url) as verifier:
        assert (await verifier.authenticate(issuer.token("ec-256"))).subject == "alice"
    assert (issuer.discovery_hits(), issuer.jwks_hits()) == (0, 1)


@pytest.mark.anyio
async def test_key_rotation_is_picked_up_on_an_unknown_kid(issuer):
    """A token signed by a newly published key is accepted after one refetch of the JWKS."""
    clock = FakeClock()
    async with make_verifier(issuer, clock=clock) as verifier:
        assert (await verifier.authenticate(issuer.token("rsa-1"))).subject == "alice"
        issuer.publish("rsa-1", "rsa-2")
        clock.advance(REFETCH_INTERVAL_SECONDS)
        assert (await verifier.authenticate(issuer.token("rsa-2", sub="bob"))).subject == "bob"
        assert (await verifier.authenticate(issuer.token("rsa-1"))).subject == "alice"
    assert issuer.jwks_hits() == 2


@pytest.mark.anyio
async def test_unknown_kid_refetches_are_rate_limited(issuer):
    """A stream of tokens with unknown kids causes at most one JWKS fetch per refetch interval."""
    clock = FakeClock()
    async with make_verifier(issuer, clock=clock) as verifier:
        await verifier.authenticate(issuer.token())
        for _ in range(20):
            clock.advance(1)
            await refused(verifier, issuer.token("rogue"))
        assert issuer.jwks_hits() == 1  # 20 s < the refetch interval
        clock.advance(REFETCH_INTERVAL_SECONDS)
        for _ in range(5):
            await refused(verifier, issuer.token("rogue"))
    assert issuer.jwks_hits() == 2


@pytest.mark.anyio
async def test_old_key_sets_are_refreshed_so_removed_keys_stop_working(issuer):
    """After max_age the JWKS is fetched again, and a key the issuer withdrew is refused."""
    clock = FakeClock()
    async with make_verifier(issuer, clock=clock) as verifier:
        await verifier.authenticate(issuer.token("rsa-1"))
        issuer.publish("rsa-2")
        clock.advance(MAX_AGE_SECONDS - 1)
        assert (await verifier.authenticate(issuer.token("rsa-1"))).subject == "alice"  # still cached
        clock.advance(2)
        assert await refused(verifier, issuer.token("rsa-1")) == "token is signed by an unknown key"
    assert issuer.jwks_hits() == 2


@pytest.mark.anyio
async def test_failed_refresh_keeps_the_keys_held(issuer):
    """If the issuer fails when the key set is old, the keys held keep working and a warning is logged."""
    clock = FakeClock()
    async with make_verifier(issuer, clock=clock) as verifier:
        await verifier.authenticate(issuer.token())
        issuer.fail(JWKS_PATH, 503, b"maintenance")
        clock.advance(MAX_AGE_SECONDS + 1)
        with capture_logs() as logs:
            assert (await verifier.authenticate(issuer.token())).subject == "alice"
    events = [(entry["event"], entry["log_level"]) for entry in logs]
    assert ("oidc.jwks_refresh_failed", "warning") in events
    refresh = next(entry for entry in logs if entry["event"] == "oidc.jwks_refresh_failed")
    assert refresh["error"] == f"cannot fetch the JWKS from {issuer.jwks_url}: HTTP 503"


# -- the issuer unreachable or broken: 502 ------------------------------------------


@pytest.mark.anyio
async def test_unreachable_jwks_is_an_upstream_error():
    """A JWKS URL where nothing listens raises UpstreamError (502) naming the URL."""
    url = dead_url("/jwks.json")
    async with make_verifier(oidc_issuer="http://127.0.0.1:9/realms/x", oidc_jwks_url=url) as verifier:
        with pytest.raises(UpstreamError) as caught:
            await verifier.authenticate(handmade_token({"alg": "RS256", "kid": "k"}, {}, b"x"))
    assert status_for(caught.value) == 502
    assert caught.value.message.startswith(f"cannot fetch the JWKS from {url}: ")


@pytest.mark.anyio
async def test_unreachable_issuer_discovery_is_an_upstream_error():
    """An issuer where nothing listens raises UpstreamError naming the discovery URL."""
    issuer_url = dead_url("/realms/gone")
    async with make_verifier(oidc_issuer=issuer_url) as verifier:
        with pytest.raises(UpstreamError) as caught:
            await verifier.authenticate(handmade_token({"alg": "ES256", "kid": "k"}, {}, b"x"))
    discovery = issuer_url + "/.well-known/openid-configuration"
    assert caught.value.message.startswith(f"cannot fetch the OIDC discovery document from {discovery}: ")


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "status", "body", "message"), [
    (JWKS_PATH, 500, b"oops", "cannot fetch the JWKS from {jwks}: HTTP 500"),
    (JWKS_PATH, 200, b"<html>", "the JWKS at {jwks} is not JSON"),
    (JWKS_PATH, 200, b"[]", "the JWKS at {jwks} is not a JSON object"),
    (JWKS_PATH, 200, b'{"keys": {}}', 'JWKS at {jwks} is malformed: no "keys" list'),
    (JWKS_PATH, 200, b'{"keys": [{"kty": "oct", "k": "AA"}, {"kty": "RSA", "n": "!"}]}',
     "JWKS at {jwks} has no usable signing keys (RSA, EC or OKP public keys)"),
    (ISSUER_PATH + "/.well-known/openid-configuration", 404, b"{}",
     "cannot fetch the OIDC discovery document from {discovery}: HTTP 404"),
    (ISSUER_PATH + "/.well-known/openid-configuration", 200, b'{"jwks_uri": "file:///etc/passwd"}',
     "OIDC discovery document at {discovery} is malformed: no http(s) jwks_uri"),
], ids=["jwks-500", "jwks-not-json", "jwks-not-object", "jwks-no-keys", "jwks-no-usable-keys",
        "discovery-404", "discovery-bad-jwks-uri"])
async def test_broken_issuer_documents_are_upstream_errors(issuer, path, status, body, message):
    """A failing or malformed discovery document or JWKS is a 502 whose message names the URL."""
    issuer.fail(path, status, body)
    async with make_verifier(issuer) as verifier:
        with pytest.raises(UpstreamError) as caught:
            await verifier.authenticate(issuer.token())
    assert caught.value.message == message.format(jwks=issuer.jwks_url, discovery=issuer.discovery_url)


@pytest.mark.anyio
async def test_fetches_while_the_issuer_is_down_are_rate_limited(issuer):
    """While the issuer is down, requests fail fast with 502 instead of each hitting the issuer."""
    clock = FakeClock()
    issuer.fail(JWKS_PATH, 502)
    async with make_verifier(issuer, clock=clock) as verifier:
        for _ in range(5):
            with pytest.raises(UpstreamError) as caught:
                await verifier.authenticate(issuer.token())
        assert issuer.jwks_hits() == 1
        assert caught.value.message == (
            f"cannot fetch the JWKS from {issuer.jwks_url}: HTTP 502 (retrying in at most 30 s)"
        )
        issuer.failures.clear()
        clock.advance(REFETCH_INTERVAL_SECONDS)
        assert (await verifier.authenticate(issuer.token())).subject == "alice"
    assert issuer.jwks_hits() == 2


@pytest.mark.anyio
async def test_verifier_logs_no_token_material(issuer):
    """Fetch and refusal paths log URLs and counts, never a token or signature."""
    token = issuer.token()
    with capture_logs() as logs:
        async with make_verifier(issuer) as verifier:
            await verifier.authenticate(token)
            await refused(verifier, issuer.token("rogue"))
    assert [entry["event"] for entry in logs] == ["oidc.jwks_fetched"]
    assert logs[0]["url"] == issuer.jwks_url
    assert token.split(".")[2] not in repr(logs)
