"""Audience-bound identity tokens (GCE's ``service-accounts/default/identity``) and their key set.

A token is a JWT signed with ``--identity-key-file`` (PEM: an EC P-256 key signs ES256, an
RSA key RS256), or with ``idtoken-key.pem`` generated once (EC P-256, mode 0600) in the data
directory when that option is unset; in memory with the ``memory://`` store. Its header
names the key (``kid``: the RFC 7638 thumbprint of the public key). ``iss`` is
``--identity-issuer`` (default: the first ``--listen`` address as a URL); ``iat`` is now and
``exp`` one hour later. Relying parties verify with the key set (``/.well-known/jwks.json``,
named by ``/.well-known/openid-configuration``), which also holds the public key of
``--identity-previous-key-file`` during a rotation, so tokens signed before it still verify.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from imds.errors import ConfigError
from imds.services.identity.keys import load_or_create, read

KEY_FILE = "idtoken-key.pem"
_RSA_MIN_BITS = 2048  # RS256's usual floor
LIFETIME = 3600  # seconds: GCE's identity tokens live one hour
JWKS_PATH = "/.well-known/jwks.json"
DISCOVERY_PATH = "/.well-known/openid-configuration"

SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


def _generate() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _parse(pem: bytes, source: str) -> SigningKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        msg = f"{source} is not an unencrypted PEM private key"
        raise ConfigError(msg) from exc
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size >= _RSA_MIN_BITS:
        return key
    msg = f"{source} must be an EC P-256 key (ES256) or an RSA key of 2048 bits or more (RS256)"
    raise ConfigError(msg)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int(value: int, size: int | None = None) -> str:
    return _b64(value.to_bytes(size or (value.bit_length() + 7) // 8, "big"))


def public_jwk(key: PublicKey) -> dict[str, str]:
    """The public key as a JWK (with ``kid``, ``alg`` and ``use``)."""
    members: dict[str, str]
    if isinstance(key, ec.EllipticCurvePublicKey):
        numbers = key.public_numbers()
        members = {"crv": "P-256", "kty": "EC", "x": _int(numbers.x, 32), "y": _int(numbers.y, 32)}
        alg = "ES256"
    else:
        rsa_numbers = key.public_numbers()
        members = {"e": _int(rsa_numbers.e), "kty": "RSA", "n": _int(rsa_numbers.n)}
        alg = "RS256"
    thumbprint = _b64(hashlib.sha256(json.dumps(members, sort_keys=True, separators=(",", ":")).encode()).digest())
    return {**members, "alg": alg, "kid": thumbprint, "use": "sig"}


class IdTokens:
    """Signs identity tokens and publishes the key set that verifies them."""

    def __init__(self, key: SigningKey, issuer: str, previous: tuple[PublicKey, ...] = ()) -> None:
        self._key = key
        self.issuer = issuer.rstrip("/")
        self._jwk = public_jwk(key.public_key())
        self.kid = self._jwk["kid"]
        self.algorithm = self._jwk["alg"]
        keys = [self._jwk, *(public_jwk(old) for old in previous)]
        self.jwks = json.dumps({"keys": keys}, separators=(",", ":")).encode()
        self.discovery = json.dumps({
            "issuer": self.issuer,
            "jwks_uri": f"{self.issuer}{JWKS_PATH}",
            "id_token_signing_alg_values_supported": sorted({k["alg"] for k in keys}),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "claims_supported": ["aud", "azp", "email", "email_verified", "exp", "google", "iat", "iss", "sub"],
        }, separators=(",", ":")).encode()

    def issue(self, claims: dict[str, object], now: float | None = None) -> str:
        """A signed token with ``claims`` plus ``iss``, ``iat`` (now) and ``exp`` (an hour later)."""
        issued = int(time.time() if now is None else now)
        payload: dict[str, Any] = {**claims, "iss": self.issuer, "iat": issued, "exp": issued + LIFETIME}
        return jwt.encode(payload, self._key, algorithm=self.algorithm, headers={"kid": self.kid})

    @classmethod
    def load(
        cls, *, issuer: str, key_file: Path | None, previous_file: Path | None, data_dir: Path | None,
    ) -> IdTokens:
        """From ``key_file``, else from (or into) ``data_dir``, else an ephemeral key; plus the previous key."""
        if key_file is not None:
            key = _parse(read(key_file, "identity token key"), str(key_file))
        elif data_dir is not None:
            path = data_dir / KEY_FILE
            key = _parse(load_or_create(path, _generate), str(path))
        else:
            key = _parse(_generate(), "the generated identity token key")
        previous: tuple[PublicKey, ...] = ()
        if previous_file is not None:
            previous = (_parse(read(previous_file, "previous identity token key"), str(previous_file)).public_key(),)
        return cls(key, issuer, previous)


def serve_url(listen: tuple[tuple[str, int], ...]) -> str:
    """The URL of the first listen address (``http://127.0.0.1:8000``): the default issuer."""
    if not listen:
        return "http://localhost"
    host, port = listen[0]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
