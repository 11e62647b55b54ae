"""The signed identity between a host-side proxy and serve: the signature and the replay window."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

import pytest
from structlog.testing import capture_logs

from imds.errors import BadSignature, InvalidInput, StaleSignature
from imds.services.identity.proxied import SignedIdentity
from imds.signing import sign, sign_stamped, stamped_message, verify, verify_stamped

SECRET = b"current-secret"
PREVIOUS = b"previous-secret"
NOW = 1_800_000_000
PROXY = ipaddress.ip_address("192.0.2.10")
TRUSTED = (ipaddress.ip_network("192.0.2.0/24"),)


def identity(*, window: int = 30, accept_unstamped: bool = False, now: float = NOW) -> SignedIdentity:
    return SignedIdentity(TRUSTED, (SECRET, PREVIOUS), window=window, accept_unstamped=accept_unstamped,
                          clock=lambda: now)


def claim(signed: SignedIdentity, instance_id: str, signature: str, tenant: str | None, stamp: str | None) -> str:
    found = signed.claim(PROXY, instance_id, signature, tenant, stamp)
    assert found is not None
    return f"{found.instance_id}/{found.tenant_id}"


def test_the_stamped_message_is_timestamp_id_and_tenant_joined_by_newlines():
    r"""The exact bytes haproxy builds too (``concat("\n<id>\n<tenant>")`` after ``date``)."""
    assert stamped_message("vm-1", NOW, "t-1") == b"1800000000\nvm-1\nt-1"
    assert stamped_message("vm-1", NOW) == stamped_message("vm-1", NOW, "") == b"1800000000\nvm-1\n"
    expected = hmac.new(SECRET, b"1800000000\nvm-1\nt-1", hashlib.sha256).hexdigest()
    assert sign_stamped(SECRET, "vm-1", NOW, "t-1") == expected


def test_a_stamped_signature_covers_each_part_and_any_secret_given():
    good = sign_stamped(SECRET, "vm-1", NOW, "t-1")
    assert verify_stamped((SECRET,), "vm-1", NOW, "t-1", good)
    assert verify_stamped((b"other", SECRET), "vm-1", NOW, "t-1", f"  {good.upper()} ")
    assert not verify_stamped((SECRET,), "vm-2", NOW, "t-1", good)
    assert not verify_stamped((SECRET,), "vm-1", NOW + 1, "t-1", good)
    assert not verify_stamped((SECRET,), "vm-1", NOW, "t-2", good)
    assert not verify_stamped((SECRET,), "vm-1", NOW, None, good)
    assert not verify_stamped((b"other",), "vm-1", NOW, "t-1", good)


def test_legacy_and_stamped_signatures_never_stand_for_each_other():
    """The bare-id HMAC is not a stamped signature of anything, and a stamped one is no legacy one."""
    stamped = sign_stamped(SECRET, "vm-1", NOW)
    assert not verify((SECRET,), "vm-1", stamped)
    assert not verify_stamped((SECRET,), "vm-1", NOW, None, sign(SECRET, "vm-1"))
    assert verify((SECRET,), "vm-1", sign(SECRET, "vm-1"))


@pytest.mark.parametrize("offset", [-30, -1, 0, 29, 30])
def test_a_timestamp_within_the_window_is_accepted_under_either_secret(offset: int):
    signed = identity(now=NOW + 0.5)
    for secret in (SECRET, PREVIOUS):
        stamp = NOW + offset
        signature = sign_stamped(secret, "vm-1", stamp, "t-1")
        assert claim(signed, " vm-1 ", signature, " t-1 ", f" {stamp} ") == "vm-1/t-1"


@pytest.mark.parametrize("offset", [-32, -600, 32, 86400])
def test_a_timestamp_outside_the_window_is_refused_and_logged(offset: int):
    """A header captured earlier (or stamped by a clock far off) is a 403 even though it verifies."""
    signed = identity()
    stamp = NOW + offset
    signature = sign_stamped(SECRET, "vm-1", stamp)
    with capture_logs() as logs, pytest.raises(StaleSignature) as raised:
        signed.claim(PROXY, "vm-1", signature, None, str(stamp))
    assert isinstance(raised.value, BadSignature)  # answered as a bad signature is: 403
    assert "30 s" in str(raised.value)
    assert [(e["event"], e["instance_id"], e["skew"]) for e in logs] == [("proxy.stale_signature", "vm-1", offset)]
    assert signature not in repr(logs)
    wider = identity(window=abs(offset))  # the window is the option's: the same header passes a wider one
    assert claim(wider, "vm-1", signature, None, str(stamp)) == "vm-1/None"


def test_a_signature_for_another_tenant_or_time_is_a_bad_signature():
    signed = identity()
    signature = sign_stamped(SECRET, "vm-1", NOW, "t-1")
    for tenant, stamp in (("t-2", NOW), (None, NOW), ("t-1", NOW - 1)):
        with pytest.raises(BadSignature) as raised:
            signed.claim(PROXY, "vm-1", signature, tenant, str(stamp))
        assert not isinstance(raised.value, StaleSignature)


@pytest.mark.parametrize("stamp", ["soon", "-5", "1.8e9", "1800000000.5", "١٨٠٠٠٠٠٠٠٠", "1" * 13])
def test_a_timestamp_that_is_not_unix_seconds_is_malformed(stamp: str):
    with pytest.raises(InvalidInput) as raised:
        identity().claim(PROXY, "vm-1", sign_stamped(SECRET, "vm-1", NOW), None, stamp)
    assert raised.value.problems[0].field == "X-Instance-ID-Timestamp"


def test_an_unstamped_signature_is_refused_unless_accepted_explicitly():
    """The legacy (Neutron-style) HMAC of the id alone: 400 by default, verified when accepted."""
    legacy = sign(SECRET, "vm-1")
    for stamp in (None, "", "  "):
        with pytest.raises(InvalidInput) as raised:
            identity().claim(PROXY, "vm-1", legacy, None, stamp)
        assert raised.value.problems[0].field == "X-Instance-ID-Timestamp"
        assert "--accept-unstamped-signatures" in raised.value.problems[0].message
    lenient = identity(accept_unstamped=True)
    assert claim(lenient, "vm-1", legacy, "t-1", None) == "vm-1/t-1"
    assert claim(lenient, "vm-1", sign(PREVIOUS, "vm-1"), None, None) == "vm-1/None"
    with pytest.raises(BadSignature):
        lenient.claim(PROXY, "vm-1", sign(b"other", "vm-1"), None, None)
    # A stamped request is held to the stamped rules even then: no falling back to the id alone.
    with pytest.raises(StaleSignature):
        lenient.claim(PROXY, "vm-1", sign_stamped(SECRET, "vm-1", NOW - 3600), None, str(NOW - 3600))
    with pytest.raises(BadSignature):
        lenient.claim(PROXY, "vm-1", legacy, None, str(NOW))


def test_an_untrusted_peer_is_never_asked_for_a_timestamp():
    """The headers from anyone outside the trusted networks are ignored, stale or not."""
    assert identity().claim(ipaddress.ip_address("10.0.0.1"), "vm-1", "00", None, "1") is None
