"""A real OIDC issuer for tests: discovery document and JWKS over HTTP on 127.0.0.1, and signed tokens.

``running_issuer()`` starts an ``http.server`` in a thread on a free port and stops it on exit.
Keys are generated once per test run with ``cryptography``; ``issuer.publish(...)`` chooses
which of them the JWKS lists, ``issuer.fail(path, status, body)`` breaks a document, and
``issuer.hits`` counts requests per path.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import functools
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

AUDIENCE = "imds-admin"
ISSUER_PATH = "/realms/test"
JWKS_PATH = "/keys/jwks.json"

# kid -> (algorithm it signs with, key factory); "rogue" is never published.
_KEY_SPECS: dict[str, tuple[str, Any]] = {
    "rsa-1": ("RS256", lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)),
    "rsa-2": ("RS256", lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)),
    "rogue": ("RS256", lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)),
    "ec-256": ("ES256", lambda: ec.generate_private_key(ec.SECP256R1())),
    "ec-384": ("ES384", lambda: ec.generate_private_key(ec.SECP384R1())),
    "ed-1": ("EdDSA", ed25519.Ed25519PrivateKey.generate),
}


@functools.cache
def private_key(kid: str) -> Any:
    """The private key named ``kid`` (generated once per run)."""
    return _KEY_SPECS[kid][1]()


def default_alg(kid: str) -> str:
    """The algorithm the key named ``kid`` signs with by default."""
    return _KEY_SPECS[kid][0]


def public_jwk(kid: str, *, alg: str | None = None) -> dict[str, Any]:
    """The public JWK of ``kid``, as an issuer would publish it (with ``alg`` when given)."""
    public = private_key(kid).public_key()
    if isinstance(public, rsa.RSAPublicKey):
        jwk = RSAAlgorithm.to_jwk(public, as_dict=True)
    elif isinstance(public, ec.EllipticCurvePublicKey):
        jwk = ECAlgorithm.to_jwk(public, as_dict=True)
    else:
        jwk = OKPAlgorithm.to_jwk(public, as_dict=True)
    jwk.update({"kid": kid, "use": "sig"})
    if alg:
        jwk["alg"] = alg
    return jwk


def public_pem(kid: str) -> bytes:
    """The PEM of ``kid``'s public key (what an HS256 confusion attack uses as its secret)."""
    public = private_key(kid).public_key()
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def handmade_token(header: dict[str, Any], claims: dict[str, Any], secret: bytes | None) -> str:
    """A JWT assembled by hand: HS256-signed with ``secret``, or unsigned when ``secret`` is None."""
    signing_input = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    signature = b"" if secret is None else hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + _b64(signature)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        issuer = self.server.issuer
        path = self.path
        with issuer.lock:
            issuer.hits[path] += 1
            status, body = issuer.response(path)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: the tests count hits instead."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    issuer: Issuer


class Issuer:
    """The fake issuer's state; the server thread reads it under ``lock``."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.issuer = self.base + ISSUER_PATH
        self.discovery_url = self.issuer + "/.well-known/openid-configuration"
        self.jwks_url = self.base + JWKS_PATH
        self.lock = threading.Lock()
        self.hits: collections.Counter[str] = collections.Counter()
        self.jwks: list[dict[str, Any]] = [public_jwk("rsa-1"), public_jwk("ec-256")]
        self.failures: dict[str, tuple[int, bytes]] = {}

    def publish(self, *keys: str | dict[str, Any]) -> None:
        """Make the JWKS list exactly these keys (kids, or JWK objects)."""
        with self.lock:
            self.jwks = [public_jwk(key) if isinstance(key, str) else key for key in keys]

    def fail(self, path: str, status: int, body: bytes = b"") -> None:
        """Answer ``path`` (e.g. ``JWKS_PATH``) with ``status`` and ``body`` from now on."""
        with self.lock:
            self.failures[path] = (status, body)

    def jwks_hits(self) -> int:
        """How many times the JWKS was fetched."""
        with self.lock:
            return self.hits[JWKS_PATH]

    def discovery_hits(self) -> int:
        """How many times the discovery document was fetched."""
        with self.lock:
            return self.hits[ISSUER_PATH + "/.well-known/openid-configuration"]

    def response(self, path: str) -> tuple[int, bytes]:
        """What the server answers for ``path`` (called under ``lock``)."""
        if path in self.failures:
            return self.failures[path]
        if path == ISSUER_PATH + "/.well-known/openid-configuration":
            return 200, json.dumps({"issuer": self.issuer, "jwks_uri": self.jwks_url}).encode()
        if path == JWKS_PATH:
            return 200, json.dumps({"keys": self.jwks}).encode()
        return 404, b'{"error": "not found"}'

    def claims(self, **overrides: Any) -> dict[str, Any]:
        """Valid claims for a token of this issuer; ``None`` values remove a claim."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer, "aud": AUDIENCE, "sub": "alice", "iat": now, "nbf": now, "exp": now + 300,
            "scope": "openid write read",
        }
        claims.update(overrides)
        return {name: value for name, value in claims.items() if value is not None}

    def token(self, kid: str = "rsa-1", *, alg: str | None = None, header_kid: str | None = None, **claims: Any) -> str:
        """A token signed by ``kid``'s key (``header_kid`` lies about which key signed it)."""
        headers = {"kid": header_kid or kid}
        return jwt.encode(self.claims(**claims), private_key(kid), algorithm=alg or default_alg(kid), headers=headers)


@contextlib.contextmanager
def running_issuer() -> Iterator[Issuer]:
    """Serve an Issuer on a free port of 127.0.0.1 until the block exits."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.issuer = Issuer(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield server.issuer
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def dead_url(path: str = "/") -> str:
    """A URL on 127.0.0.1 where nothing listens (the port was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"
