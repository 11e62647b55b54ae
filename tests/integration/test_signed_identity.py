"""Signed instance identity from a trusted proxy, over HTTP in-process, in every flavor."""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from fake_upstream import running_upstream
from helpers import admin_client, client_from, make_settings, running_app
from imds import config
from imds.errors import ConfigError
from imds.signing import sign_stamped
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

PROXY_NET = "192.0.2.0/24"
PROXY = "192.0.2.10"  # the proxy's own address: no instance has it
ALPHA = "5f1c9a52-2d7e-4b43-8c55-6a8c0f1e0a01"
BETA = "5f1c9a52-2d7e-4b43-8c55-6a8c0f1e0b02"
ALPHA_IP = "10.80.0.1"
BETA_IP = "10.80.0.2"
STRANGER = "10.99.0.9"
SECRET = b"current-shared-secret-5c1f"
PREVIOUS = b"previous-shared-secret-9e2a"
TENANT = "project-alpha"


def doc(instance_id: str, hostname: str, **extra: Any) -> dict[str, Any]:
    return {"id": instance_id, "hostname": hostname, **extra}


def write_secrets(directory: Path, secrets: tuple[bytes, ...]) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for name, secret in zip(("proxy_shared_secret_file", "proxy_previous_secret_file"), secrets, strict=False):
        path = files[name] = directory / f"{name}.secret"
        path.write_bytes(secret + b"\n")
    return files


@asynccontextmanager
async def proxied_app(tmp_path: Path, *secrets: bytes, trusted: bool = True) -> AsyncIterator[InstanceFront]:
    """An app trusting PROXY_NET with these secrets (current first), holding ALPHA (with a project) and BETA."""
    files = write_secrets(tmp_path, secrets)
    proxies = (ipaddress.ip_network(PROXY_NET),) if trusted else ()
    async with running_app(make_settings(trusted_proxy=proxies, **files)) as app:
        async with admin_client(app) as admin:
            for body, ip in ((doc(ALPHA, "alpha", project_id=TENANT), ALPHA_IP), (doc(BETA, "beta"), BETA_IP)):
                userdata = f"ud-{body['hostname']}"
                writes = (("/device-metadata", {"metadata": body}), ("/device-userdata", {"userdata": userdata}))
                for path, extra in writes:
                    answer = await admin.post(path, json={"id": body["id"], "ipAddresses": [ip], **extra})
                    assert answer.json()["applied"] is True, answer.text
        yield app


def signed(instance_id: str, secret: bytes = SECRET, **extra: str) -> dict[str, str]:
    """The headers a proxy sends now: the id, the time, and their signature (with ``X-Tenant-ID`` if in ``extra``)."""
    now = int(time.time())
    signature = sign_stamped(secret, instance_id, now, extra.get("X-Tenant-ID"))
    return {"X-Instance-ID": instance_id, "X-Instance-ID-Timestamp": str(now), "X-Instance-ID-Signature": signature,
            **extra}


async def fetch(app: InstanceFront, path: str, peer: str = PROXY, method: str = "GET", **kwargs: Any) -> httpx.Response:
    async with client_from(app, peer) as client:
        return await client.request(method, path, **kwargs)


async def test_a_trusted_proxy_names_the_instance_whatever_its_own_address(tmp_path: Path) -> None:
    """The proxy's address belongs to no instance; the signed id decides, even over X-Forwarded-For."""
    async with proxied_app(tmp_path, SECRET) as app:
        alpha = await fetch(app, "/metadata", headers=signed(ALPHA, **{"X-Forwarded-For": BETA_IP}))
        beta = await fetch(app, "/userdata", headers=signed(BETA))
    assert alpha.status_code == 200, alpha.text
    assert alpha.json()["id"] == ALPHA
    assert (beta.status_code, beta.text) == (200, "ud-beta")


async def test_an_untrusted_peer_cannot_claim_an_id(tmp_path: Path) -> None:
    """From an instance's own address the headers are ignored entirely: it gets itself, or 404 as a stranger."""
    async with proxied_app(tmp_path, SECRET) as app:
        own = await fetch(app, "/metadata", peer=BETA_IP, headers=signed(ALPHA))
        stranger = await fetch(app, "/metadata", peer=STRANGER, headers=signed(ALPHA))
        unsigned = await fetch(app, "/metadata", peer=STRANGER, headers={"X-Instance-ID": ALPHA})
    assert own.json()["id"] == BETA
    assert stranger.status_code == 404
    assert STRANGER in stranger.json()["message"]
    assert unsigned.status_code == 404  # no 400 either: the header was never read


async def test_without_trusted_proxies_the_headers_are_ignored(tmp_path: Path) -> None:
    """A secret alone trusts nobody: the socket peer still decides."""
    async with proxied_app(tmp_path, SECRET, trusted=False) as app:
        answer = await fetch(app, "/metadata", peer=BETA_IP, headers=signed(ALPHA))
    assert answer.json()["id"] == BETA


async def test_an_id_without_a_signature_is_a_400_naming_the_header(tmp_path: Path) -> None:
    async with proxied_app(tmp_path, SECRET) as app:
        answer = await fetch(app, "/metadata", headers={"X-Instance-ID": ALPHA})
        blank = await fetch(app, "/metadata", headers={"X-Instance-ID": ALPHA, "X-Instance-ID-Signature": " "})
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "X-Instance-ID-Signature"
    assert blank.status_code == 400


async def test_a_bad_signature_is_a_403_logged_without_secret_or_expected_value(tmp_path: Path) -> None:
    """Signed for another id, or with another key: 403; the log names the id, never the secret or a signature."""
    beta = signed(BETA)
    forged = beta["X-Instance-ID-Signature"]
    async with proxied_app(tmp_path, SECRET) as app:
        with capture_logs() as logs:
            swapped = await fetch(app, "/metadata", headers={**beta, "X-Instance-ID": ALPHA})
            other_key = await fetch(app, "/metadata", headers=signed(ALPHA, b"not-the-secret"))
    assert (swapped.status_code, other_key.status_code) == (403, 403)
    assert ALPHA in swapped.json()["message"]
    events = [entry for entry in logs if entry["event"] == "proxy.bad_signature"]
    assert len(events) == 2
    assert events[0]["instance_id"] == ALPHA
    logged = json.dumps(logs, default=str)
    stamp = int(beta["X-Instance-ID-Timestamp"])
    keys = (SECRET, b"not-the-secret")
    expected = [sign_stamped(key, ALPHA, when, None) for key in keys for when in (stamp, stamp + 1)]
    for needle in (SECRET.decode(), forged, *expected):
        assert needle not in logged
    assert ALPHA in logged


async def test_no_secret_configured_refuses_signed_ids(tmp_path: Path) -> None:
    """A trusted proxy's id is never believed without a secret to check it: 403 saying so."""
    async with proxied_app(tmp_path) as app:
        answer = await fetch(app, "/metadata", headers=signed(ALPHA))
        plain = await fetch(app, "/metadata", peer=ALPHA_IP)
    assert answer.status_code == 403
    assert "no proxy shared secret configured" in answer.json()["message"]
    assert plain.json()["id"] == ALPHA  # the rest of the service is unaffected


async def test_rotation_accepts_the_previous_secret_until_it_is_removed(tmp_path: Path) -> None:
    async with proxied_app(tmp_path, SECRET, PREVIOUS) as app:
        new = await fetch(app, "/metadata", headers=signed(ALPHA, SECRET))
        old = await fetch(app, "/metadata", headers=signed(ALPHA, PREVIOUS))
    assert (new.json()["id"], old.json()["id"]) == (ALPHA, ALPHA)
    async with proxied_app(tmp_path / "after", SECRET) as app:
        removed = await fetch(app, "/metadata", headers=signed(ALPHA, PREVIOUS))
        still = await fetch(app, "/metadata", headers=signed(ALPHA, SECRET))
    assert removed.status_code == 403
    assert still.json()["id"] == ALPHA


@pytest.mark.parametrize(
    ("instance_id", "tenant", "status"),
    [
        (ALPHA, TENANT, 200),  # matches project_id
        (ALPHA, "project-other", 404),  # mismatch: as if unknown
        (ALPHA, None, 200),  # no tenant header
        (BETA, "project-any", 200),  # the record has no project_id
    ],
)
async def test_tenant_must_match_the_records_project(
    tmp_path: Path, instance_id: str, tenant: str | None, status: int
) -> None:
    extra = {"X-Tenant-ID": tenant} if tenant else {}
    async with proxied_app(tmp_path, SECRET) as app:
        answer = await fetch(app, "/metadata", headers=signed(instance_id, **extra))
        ec2 = await fetch(app, "/latest/meta-data/instance-id", headers=signed(instance_id, **extra))
    assert answer.status_code == status
    assert ec2.status_code == status
    if status == 200:
        assert answer.json()["id"] == instance_id
        assert ec2.text == instance_id
    else:
        assert "project-other" not in answer.text


async def test_unknown_signed_id_is_404(tmp_path: Path) -> None:
    async with proxied_app(tmp_path, SECRET) as app:
        answer = await fetch(app, "/metadata", headers=signed("no-such-instance"))
    assert answer.status_code == 404
    assert "no-such-instance" in answer.json()["message"]


@pytest.mark.parametrize(
    ("path", "expect"),
    [
        ("/latest/meta-data/instance-id", lambda text: text == BETA),
        ("/latest/user-data", lambda text: text == "ud-beta"),
        ("/openstack/latest/meta_data.json", lambda text: json.loads(text)["uuid"] == BETA),
        ("/openstack/latest/user_data", lambda text: text == "ud-beta"),
        ("/nocloud/meta-data", lambda text: f"instance-id: {BETA}" in text),
        ("/nocloud/user-data", lambda text: text == "ud-beta"),
    ],
)
async def test_every_flavor_serves_the_signed_instance(tmp_path: Path, path: str, expect: Any) -> None:
    async with proxied_app(tmp_path, SECRET) as app:
        answer = await fetch(app, path, headers=signed(BETA))
        refused = await fetch(app, path, headers=signed(BETA, b"wrong"))
    assert answer.status_code == 200, answer.text
    assert expect(answer.text), answer.text
    assert refused.status_code == 403


async def test_openstack_password_post_through_the_proxy(tmp_path: Path) -> None:
    """The POST stores the password on the signed instance, not on whoever owns the proxy's address."""
    async with proxied_app(tmp_path, SECRET) as app:
        posted = await fetch(app, "/openstack/latest/password", method="POST", content=b"pw-beta", headers=signed(BETA))
        through = await fetch(app, "/openstack/latest/password", headers=signed(BETA))
        own = await fetch(app, "/openstack/latest/password", peer=BETA_IP)
        alpha = await fetch(app, "/openstack/latest/password", peer=ALPHA_IP)
        forged = await fetch(
            app, "/openstack/latest/password", method="POST", content=b"x", headers=signed(ALPHA, b"bad")
        )
    assert posted.status_code == 200, posted.text
    assert (through.text, own.text) == ("pw-beta", "pw-beta")
    assert alpha.text == ""
    assert forged.status_code == 403


async def test_imdsv2_token_minted_through_a_signed_proxy_is_bound_to_the_signed_id(tmp_path: Path) -> None:
    """The proxy adds X-Forwarded-For with the one VM it saw; with a valid signature the PUT may mint."""
    ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    one_hop, two_hops = {"X-Forwarded-For": BETA_IP, **ttl}, {"X-Forwarded-For": f"10.1.1.1, {BETA_IP}", **ttl}
    async with proxied_app(tmp_path, SECRET) as app:
        put = await fetch(app, "/latest/api/token", method="PUT", headers=signed(BETA, **one_hop))
        assert put.status_code == 200, put.text
        token = {"X-aws-ec2-metadata-token": put.text}
        read = await fetch(app, "/latest/meta-data/instance-id", headers={**signed(BETA), **token})
        other = await fetch(app, "/latest/meta-data/instance-id", headers={**signed(ALPHA), **token})
        direct = await fetch(app, "/latest/meta-data/instance-id", peer=BETA_IP, headers=token)
        added_hop = await fetch(app, "/latest/api/token", method="PUT", headers=signed(BETA, **two_hops))
        unsigned = await fetch(app, "/latest/api/token", method="PUT", headers=one_hop)
        bad = await fetch(app, "/latest/api/token", method="PUT", headers={**signed(BETA, b"bad"), **ttl})
    assert read.text == BETA
    assert read.headers["X-aws-ec2-metadata-token-ttl-seconds"]
    assert other.status_code == 401  # a token for BETA does not open ALPHA
    assert direct.text == BETA  # bound to the id, not to the path it came by
    assert added_hop.status_code == 403  # a hop the VM added: AWS's rule against in-guest proxies
    assert unsigned.status_code == 403
    assert bad.status_code == 403


async def test_a_previous_secret_without_a_current_one_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "old"
    path.write_text("x")
    with pytest.raises(ConfigError, match="--proxy-shared-secret-file"):
        config.load({"proxy_previous_secret_file": str(path)}, environ={})


async def test_an_unknown_signed_id_is_looked_up_by_id_in_pull_mode(tmp_path: Path) -> None:
    """Pull mode: a signed id the catalog lacks is fetched as GET /device-metadata/{id}, then served."""
    files = write_secrets(tmp_path, (SECRET,))
    with running_upstream() as upstream:
        upstream.put_metadata(BETA, ["10.80.9.9"], doc(BETA, "pulled"))
        settings = make_settings(
            trusted_proxy=(ipaddress.ip_network(PROXY_NET),), lookup_url=upstream.base, **files
        )
        async with running_app(settings) as app:
            first = await fetch(app, "/metadata", headers=signed(BETA))
            again = await fetch(app, "/latest/meta-data/hostname", headers=signed(BETA))
            unknown = await fetch(app, "/metadata", headers=signed(ALPHA))
        targets = [call.target for call in upstream.log()]
    assert first.status_code == 200, first.text
    assert first.json()["hostname"] == "pulled"
    assert again.text == "pulled"
    assert unknown.status_code == 404
    assert targets == [f"/device-metadata/{BETA}", f"/device-metadata/{ALPHA}"]
