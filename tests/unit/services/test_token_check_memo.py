"""IMDSv2 token checks remember a token whose MAC checked out; owner and expiry still hold on every use."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from helpers import FakeClock
from imds.errors import Unauthenticated
from imds.services.identity.tokens import TokenIssuer

KEY = b"k" * 32
ME, OTHER = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"


def test_a_remembered_token_still_expires():
    """Checked once (remembered), the same token is refused once the clock passes its expiry."""
    clock = FakeClock(1000.0)
    issuer = TokenIssuer(KEY, clock=clock)
    token = issuer.issue(ME, 60)
    assert issuer.check(token, ME) == 60
    clock.advance(59)
    assert issuer.check(token, ME) == 1
    clock.advance(1)
    with pytest.raises(Unauthenticated, match="expired"):
        issuer.check(token, ME)


def test_a_remembered_token_is_still_its_owners_alone():
    """After its owner used it, another instance presenting it is refused."""
    issuer = TokenIssuer(KEY, clock=FakeClock())
    token = issuer.issue(ME, 600)
    issuer.check(token, ME)
    with pytest.raises(Unauthenticated, match="another instance"):
        issuer.check(token, OTHER)


def test_a_tampered_copy_of_a_remembered_token_is_refused():
    """Remembering is by the exact token: a copy with another expiry or MAC is checked, and fails."""
    issuer = TokenIssuer(KEY, clock=FakeClock())
    token = issuer.issue(ME, 600)
    issuer.check(token, ME)
    payload, _, mac = token.partition(".")
    with pytest.raises(Unauthenticated, match="invalid"):
        issuer.check(f"{payload}.{mac[:-2]}AA", ME)
    forged = TokenIssuer(b"x" * 32, clock=FakeClock()).issue(ME, 21600)
    with pytest.raises(Unauthenticated, match="invalid"):
        issuer.check(forged, ME)
    with pytest.raises(Unauthenticated, match="malformed"):
        issuer.check("not-a-token", ME)


def test_a_token_is_the_same_hmac_as_before():
    """The MAC is HMAC-SHA256 of the payload under the key, as ``hmac.new`` made it: older tokens still check."""
    issuer = TokenIssuer(KEY, clock=FakeClock(1000.0))
    payload = f"{ME}|1060|60".encode()
    mac = hmac.new(KEY, payload, hashlib.sha256).digest()
    token = f"{_b64(payload)}.{_b64(mac)}"
    assert issuer.issue(ME, 60) == token
    assert TokenIssuer(KEY, clock=FakeClock(1000.0)).check(token, ME) == 60


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
