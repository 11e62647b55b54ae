"""Identity tokens: the generated key (0600, reused), the configured one, rotation, RS256, refusals."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from imds.errors import ConfigError
from imds.services.identity.idtoken import KEY_FILE, LIFETIME, IdTokens, serve_url


def pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def verify(tokens: IdTokens, token: str, audience: str) -> dict[str, object]:
    """Verify ``token`` with the key of the published set its header names."""
    client_keys = jwt.PyJWKSet.from_json(tokens.jwks.decode())
    kid = jwt.get_unverified_header(token)["kid"]
    key = next(k for k in client_keys.keys if k.key_id == kid)
    return dict(jwt.decode(token, key.key, algorithms=["ES256", "RS256"], audience=audience, issuer=tokens.issuer))


def test_a_generated_key_is_written_0600_once_and_reused(tmp_path: Path):
    first = IdTokens.load(issuer="https://i.example/", key_file=None, previous_file=None, data_dir=tmp_path)
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = IdTokens.load(issuer="https://i.example", key_file=None, previous_file=None, data_dir=tmp_path)
    assert first.kid == again.kid
    assert first.algorithm == "ES256"
    token = first.issue({"aud": "x", "sub": "i-1"}, now=1_000_000)
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["iss"] == "https://i.example"
    assert (claims["iat"], claims["exp"]) == (1_000_000, 1_000_000 + LIFETIME)
    assert verify(again, again.issue({"aud": "x", "sub": "i-1"}), "x")["sub"] == "i-1"


def test_the_previous_key_stays_in_the_set_so_old_tokens_verify(tmp_path: Path):
    old, new = tmp_path / "old.pem", tmp_path / "new.pem"
    old.write_bytes(pem(ec.generate_private_key(ec.SECP256R1())))
    new.write_bytes(pem(ec.generate_private_key(ec.SECP256R1())))
    before = IdTokens.load(issuer="https://i", key_file=old, previous_file=None, data_dir=None)
    token = before.issue({"aud": "svc", "sub": "i-2"})
    after = IdTokens.load(issuer="https://i", key_file=new, previous_file=old, data_dir=None)
    assert [k["kid"] for k in json.loads(after.jwks)["keys"]] == [after.kid, before.kid]
    assert json.loads(after.discovery)["jwks_uri"] == "https://i/.well-known/jwks.json"
    assert verify(after, token, "svc")["sub"] == "i-2"
    alone = IdTokens.load(issuer="https://i", key_file=new, previous_file=None, data_dir=None)
    with pytest.raises(StopIteration):
        verify(alone, token, "svc")


def test_an_rsa_key_signs_rs256(tmp_path: Path):
    path = tmp_path / "rsa.pem"
    path.write_bytes(pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    tokens = IdTokens.load(issuer="https://i", key_file=path, previous_file=None, data_dir=None)
    assert tokens.algorithm == "RS256"
    assert jwt.get_unverified_header(tokens.issue({"aud": "a"}))["alg"] == "RS256"
    assert verify(tokens, tokens.issue({"aud": "a", "sub": "s"}), "a")["sub"] == "s"


def test_unusable_keys_are_refused_naming_the_file(tmp_path: Path):
    bad = tmp_path / "bad.pem"
    bad.write_bytes(b"not a key")
    small = tmp_path / "p384.pem"
    small.write_bytes(pem(ec.generate_private_key(ec.SECP384R1())))
    for path in (bad, small, tmp_path / "missing.pem"):
        with pytest.raises(ConfigError, match=path.name):
            IdTokens.load(issuer="https://i", key_file=path, previous_file=None, data_dir=None)


def test_the_default_issuer_is_the_first_listen_address():
    assert serve_url((("127.0.0.1", 8000), ("::1", 8000))) == "http://127.0.0.1:8000"
    assert serve_url((("::1", 9000),)) == "http://[::1]:9000"
