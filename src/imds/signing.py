"""Signed instance identity between a host-side proxy and ``imds serve``.

A trusted proxy (``imds proxy``, or the haproxy the agent renders) names the instance in
``X-Instance-ID`` and proves it with ``X-Instance-ID-Signature``: the lowercase hex
HMAC-SHA256 of the id, keyed with the shared secret. ``imds serve`` checks it in constant
time against the current secret and, during a rotation, the previous one.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from pathlib import Path

from imds.errors import ConfigError

INSTANCE_ID_HEADER = "x-instance-id"
SIGNATURE_HEADER = "x-instance-id-signature"
TENANT_HEADER = "x-tenant-id"


def sign(secret: bytes, instance_id: str) -> str:
    """The lowercase hex HMAC-SHA256 of ``instance_id`` keyed with ``secret``."""
    return hmac.new(secret, instance_id.encode(), hashlib.sha256).hexdigest()


def verify(secrets: Sequence[bytes], instance_id: str, signature: str) -> bool:
    """Whether ``signature`` signs ``instance_id`` under any of ``secrets`` (constant time each)."""
    given = signature.strip().lower().encode()
    matched = False
    for secret in secrets:
        # Every secret is tried, so the time taken does not tell which one matched.
        matched |= hmac.compare_digest(sign(secret, instance_id).encode(), given)
    return matched


def read_secret(path: Path, flag: str) -> bytes:
    """A shared secret from a file (surrounding whitespace stripped); ConfigError naming ``flag``."""
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        msg = f"{flag}: cannot read {path}: {exc.strerror}"
        raise ConfigError(msg) from exc
    if not secret:
        msg = f"{flag}: {path} is empty"
        raise ConfigError(msg)
    return secret
