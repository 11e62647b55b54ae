"""Admin API authentication and scopes, through HTTP: static token, tokens file, OIDC, none."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from factories import metadata_body, new_id, next_ipv4, userdata_body
from helpers import ADMIN_TOKEN, admin_client, client_from, make_settings, running_app
from imds.app import build_app
from imds.errors import ConfigError
from imds.services.admission.auth import ALL_SCOPES
from oidc_server import AUDIENCE, ISSUER_PATH, Issuer, dead_url, handmade_token, public_pem, running_issuer

PREFIXES = ("", "/api/v1")

# Every admin route: (method, path, operation, record kind).
ROUTES: tuple[tuple[str, str, str, str], ...] = (
    ("POST", "/device-metadata", "upsert", "metadata"),
    ("POST", "/device-userdata", "upsert", "userdata"),
    ("GET", "/device-metadata/{id}", "read", "metadata"),
    ("HEAD", "/device-metadata/{id}", "read", "metadata"),
    ("GET", "/device-userdata/{id}", "read", "userdata"),
    ("HEAD", "/device-userdata/{id}", "read", "userdata"),
    ("DELETE", "/device-metadata/{id}", "delete", "metadata"),
    ("DELETE", "/device-userdata/{id}", "delete", "userdata"),
)
ROUTE_IDS = [f"{method} {path.removesuffix('/{id}')}" for method, path, _, _ in ROUTES]

# hollow's scope table, written out independently of imds.services.admission.auth.
UPSERT = {("upsert", "metadata"), ("upsert", "userdata")}
READ = {("read", "metadata"), ("read", "userdata")}
DELETE = {("delete", "metadata"), ("delete", "userdata")}
GRANTS: dict[str, set[tuple[str, str]]] = {
    "read": READ,
    "write": UPSERT | DELETE,
    "create": UPSERT,
    "update": UPSERT,
    "delete": DELETE,
    **{f"metadata:{verb}:{kind}": {("upsert" if verb in {"create", "update"} else verb, kind)}
       for verb in ("create", "update", "read", "delete") for kind in ("metadata", "userdata")},
}
NEEDED = {
    **{("upsert", kind): f"write, create, update, metadata:create:{kind}, metadata:update:{kind}"
       for kind in ("metadata", "userdata")},
    **{("read", kind): f"read, metadata:read:{kind}" for kind in ("metadata", "userdata")},
    **{("delete", kind): f"write, delete, metadata:delete:{kind}" for kind in ("metadata", "userdata")},
}
NOT_CONFIGURED = (
    "the admin API has no authentication configured: set IMDS_ADMIN_TOKEN (or --admin-token), "
    "IMDS_ADMIN_TOKENS_FILE (or --admin-tokens-file), or IMDS_OIDC_ISSUER (or --oidc-issuer)"
)


def scope_token(scope: str) -> str:
    """The tokens-file token that carries exactly ``scope``."""
    return f"tok-{scope.replace(':', '-')}-0123456789"


def write_tokens_file(path: Path, entries: list[dict[str, Any]] | Any) -> Path:
    """Write an admin tokens file (``entries`` is the "tokens" list, or the whole document if not a list)."""
    path.write_text(json.dumps({"tokens": entries} if isinstance(entries, list) else entries))
    return path


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    """A tokens file with one token per scope, one with no scopes and one stored as a SHA-256 digest."""
    entries: list[dict[str, Any]] = [
        {"subject": f"only-{scope}", "token": scope_token(scope), "scopes": [scope]} for scope in sorted(ALL_SCOPES)
    ]
    entries.append({"subject": "nobody", "token": "tok-no-scopes-0123456789", "scopes": []})
    entries.append({
        "subject": "ci-bot",
        "token_sha256": hashlib.sha256(b"ci-bot-secret-0123456789").hexdigest(),
        "scopes": ["write", "read"],
    })
    return write_tokens_file(tmp_path / "tokens.json", entries)


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    """A running OIDC issuer (discovery + JWKS on 127.0.0.1)."""
    with running_issuer() as running:
        yield running


async def seed(admin: httpx.AsyncClient) -> tuple[str, str]:
    """A fresh instance with metadata (plan "old") and userdata ("old-userdata"); returns (id, ip)."""
    instance_id, ip = new_id(), next_ipv4()
    for path, body in (("/device-metadata", metadata_body(instance_id, [ip], plan="old")),
                       ("/device-userdata", userdata_body(instance_id, [ip], "old-userdata"))):
        assert (await admin.post(path, json=body)).status_code == 200
    return instance_id, ip


async def call(
    client: httpx.AsyncClient, method: str, path: str, prefix: str, *, instance_id: str, ip: str
) -> httpx.Response:
    """Make one admin call; POSTs replace the seeded records with "new" ones."""
    url = prefix + path.format(id=instance_id)
    if path == "/device-metadata":
        return await client.post(url, json=metadata_body(instance_id, [ip], plan="new"))
    if path == "/device-userdata":
        return await client.post(url, json=userdata_body(instance_id, [ip], "new-userdata"))
    return await client.request(method, url)


async def stored(admin: httpx.AsyncClient, instance_id: str) -> tuple[str | None, bytes | None]:
    """(metadata plan, userdata) as an authorised reader sees them; None where absent."""
    meta = await admin.get(f"/device-metadata/{instance_id}")
    user = await admin.get(f"/device-userdata/{instance_id}")
    assert meta.status_code in {200, 404}
    assert user.status_code in {200, 404}
    return (meta.json()["plan"] if meta.status_code == 200 else None,
            user.content if user.status_code == 200 else None)


def assert_json_error(response: httpx.Response, status: int, message: str | None = None) -> None:
    """An error response: ``status``, a JSON body with ``message`` (HEAD: headers only)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    if response.request.method == "HEAD":
        assert response.content == b""
        assert int(response.headers["content-length"]) > 0
        return
    body = response.json()
    assert set(body) == {"message"}
    if message is not None:
        assert body["message"] == message


def assert_401(response: httpx.Response, message: str | None = None) -> None:
    """A 401 with a Bearer challenge and a JSON body."""
    assert_json_error(response, 401, message)
    assert response.headers["www-authenticate"].startswith("Bearer")


# -- no or bad credentials: 401 ----------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "op", "kind"), ROUTES, ids=ROUTE_IDS)
async def test_missing_token_is_401_on_every_route(method, path, op, kind):
    """Without a bearer token every admin route answers 401 with a Bearer challenge, and writes nothing."""
    async with running_app() as app, admin_client(app) as admin, client_from(app) as anonymous:
        instance_id, ip = await seed(admin)
        for prefix in PREFIXES:
            response = await call(anonymous, method, path, prefix, instance_id=instance_id, ip=ip)
            assert_401(response, "missing bearer token (Authorization: Bearer <token>)")
        assert await stored(admin, instance_id) == ("old", b"old-userdata")


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "op", "kind"), ROUTES, ids=ROUTE_IDS)
async def test_wrong_token_is_401_on_every_route(method, path, op, kind):
    """An unknown token, or a non-Bearer scheme, is a 401 on every route, and writes nothing."""
    async with running_app() as app, admin_client(app) as admin:
        instance_id, ip = await seed(admin)
        async with client_from(app, token="not-" + ADMIN_TOKEN) as wrong:
            for prefix in PREFIXES:
                response = await call(wrong, method, path, prefix, instance_id=instance_id, ip=ip)
                assert_401(response, "invalid bearer token")
        async with client_from(app) as basic:
            basic.headers["Authorization"] = f"Basic {ADMIN_TOKEN}"
            for prefix in PREFIXES:
                assert_401(await call(basic, method, path, prefix, instance_id=instance_id, ip=ip),
                           "missing bearer token (Authorization: Bearer <token>)")
        assert await stored(admin, instance_id) == ("old", b"old-userdata")


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "op", "kind"), ROUTES, ids=ROUTE_IDS)
async def test_no_auth_configured_refuses_everything(method, path, op, kind):
    """With no token, tokens file or issuer configured every call is a 401 saying how to configure one."""
    async with running_app(make_settings(admin_token=None)) as app:
        instance_id, ip = new_id(), next_ipv4()
        for token in (None, ADMIN_TOKEN):
            async with client_from(app, token=token) as client:
                for prefix in PREFIXES:
                    assert_401(await call(client, method, path, prefix, instance_id=instance_id, ip=ip), NOT_CONFIGURED)
        async with client_from(app, ip) as guest:  # nothing was written for the address either
            assert (await guest.get("/metadata")).status_code == 404


# -- scopes: 403 or allowed ----------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("scope", sorted(GRANTS))
async def test_each_scope_grants_exactly_its_routes(tokens_file, scope):
    """A token with one scope may call exactly the routes that scope grants; the rest are 403s that write nothing."""
    grants = GRANTS[scope]
    settings = make_settings(admin_tokens_file=tokens_file)
    async with running_app(settings) as app, admin_client(app) as admin, \
            client_from(app, token=scope_token(scope)) as client:
        for prefix in PREFIXES:
            for method, path, op, kind in ROUTES:
                instance_id, ip = await seed(admin)
                response = await call(client, method, path, prefix, instance_id=instance_id, ip=ip)
                where = f"{scope}: {method} {prefix}{path}"
                if (op, kind) in grants:
                    await assert_allowed(
                        admin, response, method=method, op=op, kind=kind, instance_id=instance_id, ip=ip
                    )
                else:
                    assert_json_error(response, 403, f"token lacks a required scope; one of: {NEEDED[op, kind]}")
                    assert "www-authenticate" not in response.headers, where
                    assert await stored(admin, instance_id) == ("old", b"old-userdata"), where


async def assert_allowed(
    admin: httpx.AsyncClient, response: httpx.Response, *, method: str, op: str, kind: str, instance_id: str, ip: str
) -> None:
    """The call did what it should, as the response and an authorised read show."""
    assert response.status_code == 200, response.text
    if op == "upsert":
        assert response.json() == {"id": instance_id, "applied": True, "ipAddresses": [ip], "moved": {}, "dropped": []}
        assert response.headers["x-imds-write"] == "applied"
        expected = ("new", b"old-userdata") if kind == "metadata" else ("old", b"new-userdata")
        assert await stored(admin, instance_id) == expected
    elif op == "delete":
        assert response.json() == {"id": instance_id, "deleted": kind}
        expected = (None, b"old-userdata") if kind == "metadata" else ("old", None)
        assert await stored(admin, instance_id) == expected
    elif method == "HEAD":
        assert response.content == b""
        assert int(response.headers["content-length"]) > 0
    elif kind == "metadata":
        assert response.headers["content-type"] == "application/json"
        assert response.json()["plan"] == "old"
    else:
        assert response.content == b"old-userdata"


@pytest.mark.anyio
async def test_token_without_scopes_is_403_everywhere(tokens_file):
    """A valid token with no scopes is a 403 (not a 401) on every route, naming the scopes needed."""
    async with running_app(make_settings(admin_tokens_file=tokens_file)) as app, admin_client(app) as admin, \
            client_from(app, token="tok-no-scopes-0123456789") as client:
        instance_id, ip = await seed(admin)
        for prefix in PREFIXES:
            for method, path, op, kind in ROUTES:
                response = await call(client, method, path, prefix, instance_id=instance_id, ip=ip)
                assert_json_error(response, 403, f"token lacks a required scope; one of: {NEEDED[op, kind]}")
        assert await stored(admin, instance_id) == ("old", b"old-userdata")


# -- the tokens file -----------------------------------------------------------------


@pytest.mark.anyio
async def test_tokens_file_alone_with_sha256_entry(tokens_file):
    """A tokens file works without IMDS_ADMIN_TOKEN, including an entry stored as token_sha256."""
    settings = make_settings(admin_token=None, admin_tokens_file=tokens_file)
    async with running_app(settings) as app, client_from(app, token="ci-bot-secret-0123456789") as bot:
        body = metadata_body(plan="hashed")
        written = await bot.post("/device-metadata", json=body)
        assert written.status_code == 200
        assert written.json()["applied"] is True
        read = await bot.get(f"/api/v1/device-metadata/{body['id']}")
        assert read.json()["plan"] == "hashed"
        async with client_from(app, token=ADMIN_TOKEN) as former_admin:  # the static token is not configured
            assert_401(await former_admin.get(f"/device-metadata/{body['id']}"), "invalid bearer token")
        async with client_from(app, token=hashlib.sha256(b"ci-bot-secret-0123456789").hexdigest()) as digest:
            assert_401(await digest.get(f"/device-metadata/{body['id']}"), "invalid bearer token")


@pytest.mark.parametrize(("document", "problem"), [
    ("not json", "cannot read JSON: "),
    ({"tokens": {"subject": "a"}}, 'expected an object with a "tokens" list'),
    ({"tokenz": []}, 'expected an object with a "tokens" list'),
    ([["subject", "token"]], "tokens[0] must be an object"),
    ([{"token": "t", "scopes": ["read"]}], "tokens[0].subject must be a non-empty string"),
    ([{"subject": "a", "token": "t", "scopes": "read"}], "tokens[0].scopes must be a list of strings"),
    ([{"subject": "a", "token": "t", "scopes": ["read", "admin", "metadata:read:vendordata"]}],
     "tokens[0].scopes has unknown scopes: admin, metadata:read:vendordata"),
    ([{"subject": "a", "scopes": ["read"]}], 'tokens[0] needs "token" or "token_sha256"'),
    ([{"subject": "a", "token": "", "scopes": ["read"]}], 'tokens[0] needs "token" or "token_sha256"'),
    ([{"subject": "a", "token": "t", "scopes": []}, {"subject": "b", "token_sha256": "xyz", "scopes": []}],
     "tokens[1].token_sha256 must be hex"),
    ([{"subject": "a", "token_sha256": "abcd", "scopes": []}], "tokens[0].token_sha256 must be 64 hex digits"),
], ids=["not-json", "tokens-not-list", "no-tokens-key", "entry-not-object", "no-subject",
        "scopes-not-list", "unknown-scope", "no-token", "empty-token", "bad-hex", "short-digest"])
def test_malformed_tokens_file_is_a_config_error(tmp_path, document, problem):
    """A malformed tokens file fails at build time with a ConfigError naming the file and the problem."""
    path = tmp_path / "tokens.json"
    if isinstance(document, str):
        path.write_text(document)
    else:
        write_tokens_file(path, document)
    with pytest.raises(ConfigError) as caught:
        build_app(make_settings(admin_tokens_file=path))
    assert caught.value.message.startswith(f"admin tokens file {path}: ")
    assert problem in caught.value.message


def test_unreadable_tokens_file_is_a_config_error(tmp_path):
    """A tokens file that is missing at build time is a ConfigError naming it."""
    path = tmp_path / "gone.json"
    with pytest.raises(ConfigError, match=r"admin tokens file .*gone\.json: cannot read JSON"):
        build_app(make_settings(admin_tokens_file=path))


# -- logs: the subject, never the token ----------------------------------------------


@pytest.mark.anyio
async def test_write_logs_carry_the_subject_not_the_token(tokens_file):
    """Each admin write logs the token's subject (static token, tokens-file entry) and never the token."""
    settings = make_settings(admin_tokens_file=tokens_file)
    secret = "ci-bot-secret-0123456789"
    with capture_logs() as logs:
        async with running_app(settings) as app, client_from(app, token=secret) as bot, admin_client(app) as admin:
            body = metadata_body()
            instance_id, ips = body["id"], body["ipAddresses"]
            assert (await bot.post("/device-metadata", json=body)).status_code == 200
            assert (await bot.post("/device-userdata", json=userdata_body(instance_id, ips))).status_code == 200
            assert (await admin.delete(f"/api/v1/device-userdata/{instance_id}")).status_code == 200
            assert (await bot.delete(f"/device-metadata/{instance_id}")).status_code == 200
    writes = [(entry["event"], entry["kind"], entry["subject"]) for entry in logs
              if entry["event"] in {"record.written", "record.deleted"}]
    assert writes == [
        ("record.written", "metadata", "ci-bot"),
        ("record.written", "userdata", "ci-bot"),
        ("record.deleted", "userdata", "admin-token"),
        ("record.deleted", "metadata", "ci-bot"),
    ]
    assert secret not in repr(logs)
    assert ADMIN_TOKEN not in repr(logs)


# -- OIDC through HTTP ---------------------------------------------------------------


def oidc_settings(issuer: Issuer, **overrides: Any) -> Any:
    """Settings accepting JWTs from ``issuer`` for AUDIENCE (no static token unless overridden)."""
    values: dict[str, Any] = {"admin_token": None, "oidc_issuer": issuer.issuer, "oidc_audience": AUDIENCE,
                              "oidc_username_claim": "preferred_username"}
    values.update(overrides)
    return make_settings(**values)


@pytest.mark.anyio
async def test_oidc_token_scopes_from_list_and_string_claims(issuer):
    """JWT scopes (list or space-separated string) gate routes like static scopes; writes log the username."""
    creator = issuer.token(scope=["metadata:create:metadata"], preferred_username="alice@example.org")
    reader = issuer.token("ec-256", scope="openid metadata:read:metadata", sub="reader-svc")
    body = metadata_body(plan="via-oidc")
    with capture_logs() as logs:
        async with running_app(oidc_settings(issuer)) as app, client_from(app, token=creator) as alice, \
                client_from(app, token=reader) as svc:
            written = await alice.post("/api/v1/device-metadata", json=body)
            assert written.status_code == 200
            assert written.json()["applied"] is True
            assert_json_error(await alice.post("/device-userdata", json=userdata_body(body["id"], body["ipAddresses"])),
                              403, f"token lacks a required scope; one of: {NEEDED['upsert', 'userdata']}")
            assert_json_error(await alice.get(f"/device-metadata/{body['id']}"), 403,
                              f"token lacks a required scope; one of: {NEEDED['read', 'metadata']}")
            read = await svc.get(f"/device-metadata/{body['id']}")
            assert read.json()["plan"] == "via-oidc"
            assert_json_error(await svc.delete(f"/device-metadata/{body['id']}"), 403,
                              f"token lacks a required scope; one of: {NEEDED['delete', 'metadata']}")
    written_by = [entry["subject"] for entry in logs if entry["event"] == "record.written"]
    assert written_by == ["alice@example.org"]
    assert creator.split(".")[2] not in repr(logs)
    assert issuer.jwks_hits() == 1


def _confusion_token(issuer: Issuer) -> str:
    return handmade_token({"alg": "HS256", "kid": "rsa-1"}, issuer.claims(scope="write read"), public_pem("rsa-1"))


@pytest.mark.anyio
@pytest.mark.parametrize(("make_token", "reason"), [
    (lambda issuer: issuer.token(aud="someone-else"), "token audience does not match"),
    (lambda issuer: issuer.token(iss="https://evil.example" + ISSUER_PATH), "token issuer does not match"),
    (lambda issuer: issuer.token(exp=1_600_000_000, iat=1_599_999_000, nbf=1_599_999_000), "token has expired"),
    (lambda issuer: issuer.token(nbf=4_000_000_000), "token is not yet valid"),
    (lambda issuer: issuer.token("rogue"), "token is signed by an unknown key"),
    (lambda issuer: issuer.token("rogue", header_kid="rsa-1"), "token signature does not verify"),
    (lambda issuer: handmade_token({"alg": "none", "kid": "rsa-1"}, issuer.claims(), None),
     "token algorithm is not accepted (one of: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA)"),
    (_confusion_token,
     "token algorithm is not accepted (one of: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA)"),
], ids=["wrong-aud", "wrong-iss", "expired", "not-yet-valid", "unknown-key", "bad-signature", "alg-none",
        "hs256-public-key"])
async def test_oidc_bad_tokens_are_401_and_write_nothing(issuer, make_token, reason):
    """Each kind of bad JWT is a 401 with a Bearer challenge and a reason, and nothing is written."""
    token = make_token(issuer)
    body = metadata_body()
    async with running_app(oidc_settings(issuer)) as app:
        async with client_from(app, token=token) as attacker:
            for prefix in PREFIXES:
                response = await attacker.post(f"{prefix}/device-metadata", json=body)
                assert_401(response, reason)
                assert token not in response.text
        async with client_from(app, token=issuer.token(scope="read")) as reader:
            assert_json_error(await reader.get(f"/device-metadata/{body['id']}"), 404,
                              f"no metadata stored for instance {body['id']}")


@pytest.mark.anyio
async def test_oidc_explicit_jwks_url_and_static_token_together(issuer):
    """With oidc_jwks_url set discovery is skipped, and a static token keeps working beside JWTs."""
    issuer.fail(ISSUER_PATH + "/.well-known/openid-configuration", 500)
    settings = oidc_settings(issuer, oidc_jwks_url=issuer.jwks_url, admin_token=ADMIN_TOKEN)
    body = metadata_body(plan="both")
    async with running_app(settings) as app, admin_client(app) as admin, \
            client_from(app, token=issuer.token("ec-256", scope="read")) as reader:
        assert (await admin.post("/device-metadata", json=body)).status_code == 200
        assert (await reader.get(f"/device-metadata/{body['id']}")).json()["plan"] == "both"
    assert (issuer.discovery_hits(), issuer.jwks_hits()) == (0, 1)


@pytest.mark.anyio
async def test_oidc_issuer_down_is_502_with_the_url(issuer):
    """When the JWKS cannot be fetched a JWT call is a 502 whose JSON message names the URL; nothing is written."""
    jwks = dead_url("/jwks.json")
    body = metadata_body()
    settings = oidc_settings(issuer, oidc_jwks_url=jwks, admin_token=ADMIN_TOKEN)
    async with running_app(settings) as app, admin_client(app) as admin, \
            client_from(app, token=issuer.token()) as client:
        response = await client.post("/device-metadata", json=body)
        assert_json_error(response, 502)
        assert response.json()["message"].startswith(f"cannot fetch the JWKS from {jwks}: ")
        assert "www-authenticate" not in response.headers
        assert_json_error(await admin.get(f"/device-metadata/{body['id']}"), 404)
