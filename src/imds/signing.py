"""Signed instance identity between a host-side proxy and ``imds serve``.

A trusted proxy (``imds proxy``, or the haproxy the agent renders) names the instance in
``X-Instance-ID``, says when in ``X-Instance-ID-Timestamp`` (unix seconds) and proves both
with ``X-Instance-ID-Signature``: the lowercase hex HMAC-SHA256, keyed with the shared
secret, of the timestamp, the id and the tenant (the ``X-Tenant-ID`` value, empty when none
is sent), joined by newlines (``stamped_message``). A newline can be in no header value, so the message names one triple
only, and never equals the bare id of a legacy (unstamped) signature. ``imds serve``
checks it in constant time against the current secret and, during a rotation, the previous
one, and accepts the timestamp within a short window only, so a captured header is worth
seconds, not the life of the secret.

The legacy form, the HMAC of the id alone (what a Neutron-style proxy sends), is accepted
only when ``imds serve`` runs with ``--accept-unstamped-signatures`` (docs/hypervisor.md).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from pathlib import Path

from imds.errors import ConfigError

INSTANCE_ID_HEADER = "x-instance-id"
SIGNATURE_HEADER = "x-instance-id-signature"
TIMESTAMP_HEADER = "x-instance-id-timestamp"
TENANT_HEADER = "x-tenant-id"


def sign(secret: bytes, instance_id: str) -> str:
    """The legacy (unstamped) signature: the lowercase hex HMAC-SHA256 of ``instance_id`` alone."""
    return hmac.new(secret, instance_id.encode(), hashlib.sha256).hexdigest()


def stamped_message(instance_id: str, timestamp: int, tenant: str | None = None) -> bytes:
    r"""What a stamped signature covers: ``"<timestamp>\n<instance id>\n<tenant or nothing>"``."""
    return f"{timestamp}\n{instance_id}\n{tenant or ''}".encode()


def sign_stamped(secret: bytes, instance_id: str, timestamp: int, tenant: str | None = None) -> str:
    """The lowercase hex HMAC-SHA256 of ``stamped_message(instance_id, timestamp, tenant)``."""
    return hmac.new(secret, stamped_message(instance_id, timestamp, tenant), hashlib.sha256).hexdigest()


def _matches(secrets: Sequence[bytes], message: bytes, signature: str) -> bool:
    given = signature.strip().lower().encode()
    matched = False
    for secret in secrets:
        # Every secret is tried, so the time taken does not tell which one matched.
        expected = hmac.new(secret, message, hashlib.sha256).hexdigest().encode()
        matched |= hmac.compare_digest(expected, given)
    return matched


def verify(secrets: Sequence[bytes], instance_id: str, signature: str) -> bool:
    """Whether ``signature`` is the legacy signature of ``instance_id`` under any of ``secrets``."""
    return _matches(secrets, instance_id.encode(), signature)


def verify_stamped(
    secrets: Sequence[bytes], instance_id: str, timestamp: int, tenant: str | None, signature: str
) -> bool:
    """Whether ``signature`` signs (``instance_id``, ``timestamp``, ``tenant``) under any of ``secrets``.

    The signature only: whether ``timestamp`` is recent enough is the caller's rule.
    """
    return _matches(secrets, stamped_message(instance_id, timestamp, tenant), signature)


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
