"""One key per host: the derivation, the host-signed claim, and the record's host deciding."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import shutil
import subprocess

import pytest
from structlog.testing import capture_logs

from imds.errors import BadSignature, ForeignHost, InvalidInput, ProxyNotConfigured, StaleSignature
from imds.models import Instance
from imds.services.identity.proxied import SignedIdentity, record_host
from imds.signing import SigningKey, host_key, sign_stamped, stamped_message

FLEET = b"fleet-secret-of-the-whole-cloud"
OLD_FLEET = b"last-years-fleet-secret"
SHARED = b"the-one-shared-secret"
NOW = 1_800_000_000
PROXY = ipaddress.ip_address("192.0.2.10")
TRUSTED = (ipaddress.ip_network("192.0.2.0/24"),)


def identity(*, fleet: tuple[bytes, ...] = (FLEET, OLD_FLEET), shared: tuple[bytes, ...] = ()) -> SignedIdentity:
    return SignedIdentity(TRUSTED, shared, fleet_secrets=fleet, clock=lambda: NOW)


def host_signed(host: str, *, fleet: bytes = FLEET, instance_id: str = "vm-1", tenant: str | None = None,
                claimed_host: str | None = None, stamp: int = NOW) -> tuple[str, str, str | None, str, str]:
    """(instance id, signature, tenant, timestamp, host header) as a proxy on ``host`` sends them."""
    signature = SigningKey(host_key(fleet, host), host).sign(instance_id, stamp, tenant)
    return instance_id, signature, tenant, str(stamp), claimed_host or host


def test_a_host_key_is_hkdf_sha256_of_the_fleet_secret_as_openssl_derives_it():
    """The key is what `openssl kdf ... HKDF` prints for the same secret, salt and host (in lower-case hex)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is required (Debian package openssl; scripts/test installs it)")
    derived = subprocess.run(
        [openssl, "kdf", "-keylen", "32", "-kdfopt", "digest:SHA256", "-kdfopt", f"key:{FLEET.decode()}",
         "-kdfopt", "salt:imds host key v1", "-kdfopt", "info:compute-7", "HKDF"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()
    assert host_key(FLEET, "compute-7") == derived.replace(":", "").lower().encode()
    assert host_key(FLEET, "compute-7") != host_key(FLEET, "compute-8")
    assert host_key(FLEET, "compute-7") != host_key(OLD_FLEET, "compute-7")


def test_a_host_signed_message_ends_with_the_host():
    r"""``"<ts>\n<id>\n<tenant>\n<host>"``: the message haproxy builds with ``concat`` too."""
    assert stamped_message("vm-1", NOW, "t-1", "compute-7") == b"1800000000\nvm-1\nt-1\ncompute-7"
    key = host_key(FLEET, "compute-7")
    expected = hmac.new(key, b"1800000000\nvm-1\n\ncompute-7", hashlib.sha256).hexdigest()
    assert sign_stamped(key, "vm-1", NOW, host="compute-7") == expected
    assert repr(SigningKey(key, "compute-7")) == "SigningKey(host='compute-7')"
    assert key.decode() not in repr(SigningKey(key, "compute-7"))


def test_a_host_signature_verifies_under_that_hosts_key_current_or_previous_fleet_secret():
    """Serve derives the host's key itself; a host still on last year's fleet secret passes during a rotation."""
    found = identity().claim(PROXY, *host_signed("compute-7", tenant="t-1"))
    assert found is not None
    assert (found.instance_id, found.tenant_id, found.host) == ("vm-1", "t-1", "compute-7")
    rotated = identity().claim(PROXY, *host_signed("compute-7", fleet=OLD_FLEET))
    assert rotated is not None
    with pytest.raises(BadSignature):  # once the previous fleet secret is dropped, the old keys stop working
        identity(fleet=(FLEET,)).claim(PROXY, *host_signed("compute-7", fleet=OLD_FLEET))


def test_one_hosts_key_cannot_sign_as_another_host():
    """compute-7's key naming compute-8 in X-Instance-Host does not verify (serve uses compute-8's key)."""
    instance_id, signature, tenant, stamp, _ = host_signed("compute-7")
    with capture_logs() as logs, pytest.raises(BadSignature):
        identity().claim(PROXY, instance_id, signature, tenant, stamp, "compute-8")
    assert logs[-1]["event"] == "proxy.bad_signature"
    assert logs[-1]["host"] == "compute-8"
    assert signature not in str(logs)


def test_the_shared_secret_cannot_pass_as_a_host_key():
    """A proxy holding the one shared secret and naming a host is refused: host claims check host keys only."""
    signature = sign_stamped(SHARED, "vm-1", NOW, host="compute-7")
    with pytest.raises(BadSignature):
        identity(shared=(SHARED,)).claim(PROXY, "vm-1", signature, None, str(NOW), "compute-7")


def test_host_claims_need_the_fleet_secret_a_timestamp_and_a_host_name():
    """No fleet secret: refused (403); no timestamp, or a host name with a newline or space: 400 naming the header."""
    with pytest.raises(ProxyNotConfigured, match="--proxy-fleet-secret-file"):
        identity(fleet=(), shared=(SHARED,)).claim(PROXY, *host_signed("compute-7"))
    instance_id, signature, tenant, _, host = host_signed("compute-7")
    with pytest.raises(InvalidInput) as missing:
        identity().claim(PROXY, instance_id, signature, tenant, None, host)
    assert missing.value.problems[0].field == "X-Instance-ID-Timestamp"
    for bad in ("compute 7", "-compute", "compute/7"):
        with pytest.raises(InvalidInput) as malformed:
            identity().claim(PROXY, instance_id, signature, tenant, str(NOW), bad)
        assert malformed.value.problems[0].field == "X-Instance-Host"


def test_a_stale_host_signature_is_refused_like_any_other():
    """The replay window holds for host keys too."""
    with pytest.raises(StaleSignature):
        identity().claim(PROXY, *host_signed("compute-7", stamp=NOW - 3600))


def test_the_records_host_decides():
    """A claim from the host the record names passes; from another host it is ForeignHost (logged); no host: any."""
    claim = identity().claim(PROXY, *host_signed("compute-7"))
    assert claim is not None
    on_7 = Instance("vm-1", metadata={"host": "compute-7"})
    on_8 = Instance("vm-1", metadata={"host": "compute-8"})
    unplaced = Instance("vm-1", metadata={"hostname": "vm"})
    claim.check_host(on_7)
    claim.check_host(unplaced)
    with capture_logs() as logs, pytest.raises(ForeignHost, match="compute-7"):
        claim.check_host(on_8)
    assert logs[-1] == {"event": "proxy.foreign_host", "log_level": "warning", "component": "proxied",
                        "instance_id": "vm-1", "host": "compute-7", "record_host": "compute-8"}
    assert (record_host(on_8), record_host(unplaced), record_host(Instance("vm-1", metadata={"host": 7}))) == (
        "compute-8", None, None)


def test_a_shared_secret_claim_has_no_host_and_is_not_checked_against_the_record():
    """The older mode stays for migration: no X-Instance-Host, the shared secret, the record's host not compared."""
    signature = sign_stamped(SHARED, "vm-1", NOW)
    claim = identity(shared=(SHARED,)).claim(PROXY, "vm-1", signature, None, str(NOW))
    assert claim is not None
    assert claim.host is None
    claim.check_host(Instance("vm-1", metadata={"host": "compute-8"}))
