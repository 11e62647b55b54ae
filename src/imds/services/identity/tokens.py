"""IMDSv2 session tokens: bound to one instance and an expiry, checked with an HMAC.

Minting and checking need no database write. A token is
``base64url(instance-id|expiry|ttl) . base64url(HMAC-SHA256)``; it survives a restart
only if the key does (``imdsv2.key`` in the data directory, or ``--imdsv2-key-file``,
which replicas must share).

The token PUT rule, one definition for the three doors a token PUT can come through
(``imds serve`` itself, ``imds proxy``, the agent's haproxy): a PUT to the token path
(``is_token_path``; ``TOKEN_PATH_PATTERN`` for haproxy) that carries any header in
``FORWARDING_HEADERS`` (or any ``X-Forwarded-*``) came through a proxy and is refused, as
AWS refuses it. Serve alone makes the one exception, for a trusted proxy's own
``X-Forwarded-For`` (``imds.services.identity.proxied``); the host-side proxies refuse
whatever the VM sent before they add their own.
"""

from __future__ import annotations

import base64
import hmac
import re
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from imds.errors import InvalidInput, Unauthenticated
from imds.services.identity.keys import load_or_create, read

KEY_FILE = "imdsv2.key"
TTL_HEADER = "x-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "x-aws-ec2-metadata-token"  # noqa: S105 - a header name, not a secret
MIN_TTL, MAX_TTL = 1, 21600
# The token path as serve matches it (the request's decoded path): ``latest``, then
# ``api/token`` with any slashes around it. Case variants are other paths (404 or 405).
TOKEN_PATH = "/latest/api/token"  # noqa: S105 - a path, not a secret
TOKEN_PATH_PATTERN = "/latest/+api/token/*"  # noqa: S105 - a path, not a secret
_TOKEN_PATH = re.compile(TOKEN_PATH_PATTERN)
# Headers a proxy adds to say whom it relays (lower case); any ``X-Forwarded-*`` counts too.
FORWARDING_HEADERS = (
    "x-forwarded-for", "forwarded", "x-real-ip", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port",
    "x-client-ip", "true-client-ip", "cf-connecting-ip", "client-ip",
)
FORWARDING_PREFIX = "x-forwarded-"
_FORWARDING = frozenset(name.encode() for name in FORWARDING_HEADERS)
_PREFIX = FORWARDING_PREFIX.encode()


def is_token_path(path: str) -> bool:
    """Whether a PUT to this (decoded) path asks for an IMDSv2 token."""
    return _TOKEN_PATH.fullmatch(path) is not None


def forwarding(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether any of these (lower-case ASGI) headers says a proxy relayed the request."""
    return any(name in _FORWARDING or name.startswith(_PREFIX) for name, _ in headers)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_ttl(value: str | None) -> int:
    """The requested TTL, 1 to 21600 seconds, or InvalidInput naming the header."""
    if value is None:
        raise InvalidInput.one(TTL_HEADER, "is required")
    text = value.strip()
    # ASCII digits only: str.isdigit() is also true for "²" and other digits int() refuses.
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or not MIN_TTL <= int(text) <= MAX_TTL:
        raise InvalidInput.one(TTL_HEADER, f"must be a whole number of seconds from {MIN_TTL} to {MAX_TTL}")
    return int(text)


MAX_VERIFIED = 65536  # tokens whose MAC was checked, remembered until this many (then all forgotten)


class TokenIssuer:
    """Mints and checks IMDSv2 tokens.

    A token whose MAC checked out is remembered with its owner and expiry (the key never
    changes while the process runs): a boot crawls ~40 paths with one token, and its MAC
    and base64 were a tenth of each read's cost. Owner and expiry are checked on every use.
    """

    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._clock = clock
        self._verified: dict[str, tuple[str, int]] = {}

    @classmethod
    def load(
        cls, *, key_file: Path | None, data_dir: Path | None, clock: Callable[[], float] = time.time,
    ) -> TokenIssuer:
        """From the configured key file, else from (or into) ``data_dir``, else ephemeral; ``clock`` in wall seconds."""
        if key_file is not None:
            key = read(key_file, "IMDSv2 key")
        elif data_dir is not None:
            key = load_or_create(data_dir / KEY_FILE, lambda: secrets.token_bytes(32))
        else:
            key = secrets.token_bytes(32)
        return cls(key, clock)

    def issue(self, instance_id: str, ttl: int) -> str:
        """A token for ``instance_id`` valid for ``ttl`` seconds."""
        payload = f"{instance_id}|{int(self._clock()) + ttl}|{ttl}".encode()
        return f"{_b64(payload)}.{_b64(self._mac(payload))}"

    def check(self, token: str, instance_id: str) -> int:
        """Seconds the token has left if it is valid and for this instance; else Unauthenticated."""
        known = self._verified.get(token)
        if known is None:
            known = self._verify(token)
            if len(self._verified) >= MAX_VERIFIED:
                self._verified.clear()
            self._verified[token] = known
        owner, expiry = known
        if owner != instance_id:
            raise Unauthenticated("IMDSv2 token was issued to another instance")
        left = expiry - int(self._clock())
        if left <= 0:
            raise Unauthenticated("IMDSv2 token has expired")
        return left

    def _verify(self, token: str) -> tuple[str, int]:
        """(owner, expiry) of a token whose MAC is right; Unauthenticated for any other."""
        try:
            encoded, _, mac = token.partition(".")
            payload = _unb64(encoded)
            valid = hmac.compare_digest(_unb64(mac), self._mac(payload))
            owner, expiry, _ttl = payload.decode().split("|")
            expires = int(expiry)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Unauthenticated("malformed IMDSv2 token") from exc
        if not valid:
            raise Unauthenticated("invalid IMDSv2 token")
        return owner, expires

    def _mac(self, payload: bytes) -> bytes:
        return hmac.digest(self._key, payload, "sha256")  # one call into OpenSSL: half hmac.new's cost
