r"""Signed instance identity between a host-side proxy and ``imds serve``.

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

**One key per host.** A proxy may instead sign with its own host's key and name its host in
``X-Instance-Host``; the message then ends with the host (``"<ts>\n<id>\n<tenant>\n<host>"``).
A host's key is derived from one fleet secret that only ``imds serve`` holds (``host_key``:
HKDF-SHA256, RFC 5869), so a captured host key signs for that host alone, and serve, which
knows where each instance runs (the record's ``host``), refuses it for any other instance.

Usage::

    key = host_key(fleet_secret, "compute-7")          # what `imds host-key` prints, for compute-7 only
    signature = sign_stamped(key, instance_id, now, tenant, host="compute-7")
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from imds.errors import ConfigError

INSTANCE_ID_HEADER = "x-instance-id"
SIGNATURE_HEADER = "x-instance-id-signature"
TIMESTAMP_HEADER = "x-instance-id-timestamp"
TENANT_HEADER = "x-tenant-id"
HOST_HEADER = "x-instance-host"
# HKDF's salt for host keys: a fixed, versioned label (RFC 5869 allows a non-secret salt).
HOST_KEY_SALT = b"imds host key v1"
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")  # fullmatch: "$" passes a trailing newline


def valid_host(name: str) -> bool:
    """Whether ``name`` may name a host: a DNS-like name (letters, digits, ``.``, ``_``, ``-``; 253 at most)."""
    return bool(_HOST.fullmatch(name))


def host_key(fleet_secret: bytes, host: str) -> bytes:
    """``host``'s signing key: the hex of HKDF-SHA256(fleet secret, salt ``HOST_KEY_SALT``, info host), 32 bytes.

    Hex, so the key lives in a text file like every other secret (``read_secret`` strips
    whitespace, which raw bytes could end with). The same as
    ``openssl kdf -keylen 32 -kdfopt digest:SHA256 -kdfopt key:SECRET -kdfopt salt:"imds host key v1"
    -kdfopt info:HOST HKDF`` in lower case.
    """
    prk = hmac.new(HOST_KEY_SALT, fleet_secret, hashlib.sha256).digest()  # HKDF-Extract
    return hmac.new(prk, host.encode() + b"\x01", hashlib.sha256).hexdigest().encode()  # HKDF-Expand, one block


def sign(secret: bytes, instance_id: str) -> str:
    """The legacy (unstamped) signature: the lowercase hex HMAC-SHA256 of ``instance_id`` alone."""
    return hmac.new(secret, instance_id.encode(), hashlib.sha256).hexdigest()


def stamped_message(instance_id: str, timestamp: int, tenant: str | None = None, host: str | None = None) -> bytes:
    r"""What a stamped signature covers: ``"<timestamp>\n<instance id>\n<tenant or nothing>"``.

    Signed with a host's key, ``"\n<host>"`` follows.
    """
    message = f"{timestamp}\n{instance_id}\n{tenant or ''}"
    return (message if host is None else f"{message}\n{host}").encode()


def sign_stamped(
    secret: bytes, instance_id: str, timestamp: int, tenant: str | None = None, *, host: str | None = None
) -> str:
    """The lowercase hex HMAC-SHA256 of ``stamped_message(instance_id, timestamp, tenant, host)``."""
    return hmac.new(secret, stamped_message(instance_id, timestamp, tenant, host), hashlib.sha256).hexdigest()


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


def verify_message(secrets: Sequence[bytes], message: bytes, signature: str) -> bool:
    """Whether ``signature`` is the HMAC of ``message`` (a ``stamped_message``) under any of ``secrets``."""
    return _matches(secrets, message, signature)


@dataclass(frozen=True, repr=False)
class SigningKey:
    """What a host-side proxy signs with: its host's own key (``host`` set), or the one shared secret.

    ``repr`` shows the mode and the host, never the key.
    """

    secret: bytes
    host: str | None = None

    def sign(self, instance_id: str, timestamp: int, tenant: str | None) -> str:
        """The ``X-Instance-ID-Signature`` of one request."""
        return sign_stamped(self.secret, instance_id, timestamp, tenant, host=self.host)

    def __repr__(self) -> str:
        """The mode, never the key."""
        return f"SigningKey(host={self.host!r})" if self.host else "SigningKey(shared)"


def signing_key(*, shared_secret_file: Path | None, host_key_file: Path | None, host_name: str | None) -> SigningKey:
    """The key ``--host-key-file`` (with ``--host-name``) or ``--shared-secret-file`` names; ConfigError otherwise."""
    if host_key_file is not None:
        if not host_name or not valid_host(host_name):
            msg = f"--host-name: {host_name!r} is not a host name (letters, digits, '.', '_', '-')"
            raise ConfigError(msg)
        return SigningKey(read_secret(host_key_file, "--host-key-file"), host_name)
    if shared_secret_file is None:
        msg = "--host-key-file (with --host-name) or --shared-secret-file is required"
        raise ConfigError(msg)
    return SigningKey(read_secret(shared_secret_file, "--shared-secret-file"))


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
