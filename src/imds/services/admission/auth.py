"""Admin authentication and scopes, with hollow's scope names.

A write needs one of ``write``, ``create``, ``update``, ``metadata:create:<kind>`` or
``metadata:update:<kind>``; a read ``read`` or ``metadata:read:<kind>``; a delete
``write``, ``delete`` or ``metadata:delete:<kind>`` (kind: ``metadata``, ``userdata``,
``os``, the Ganeti OS record, ``project``, a GCE project's attributes, or ``notice``, a
lifecycle notice).
``/metrics``, ``/openapi.json`` and ``/docs`` need ``read`` or the dedicated ``metrics``
scope (a scraper's token then reads no record); ``--metrics-public`` opens ``/metrics``.

Credentials come from a static token (every scope), a tokens file, or OIDC JWTs; with
none configured every call is refused with a message that says how to configure one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from imds.errors import AuthNotConfigured, ConfigError, Forbidden, Unauthenticated
from imds.models import NOTICE_KIND, OS_KIND, PROJECT_KIND, RECORD_KINDS, Principal

_PREFIX = "metadata"
METRICS_SCOPE = "metrics"
ALL_SCOPES = frozenset(
    {"read", "write", "create", "update", "delete", METRICS_SCOPE}
    | {f"{_PREFIX}:{verb}:{kind}" for verb in ("create", "update", "read", "delete") for kind in RECORD_KINDS}
    | {f"{_PREFIX}:{verb}:{OS_KIND}" for verb in ("create", "update", "read", "delete")}  # Ganeti OS records
    | {f"{_PREFIX}:{verb}:{PROJECT_KIND}" for verb in ("create", "update", "read", "delete")}  # GCE projects
    | {f"{_PREFIX}:{verb}:{NOTICE_KIND}" for verb in ("create", "update", "read", "delete")}  # lifecycle notices
)


def upsert_scopes(kind: str) -> tuple[str, ...]:
    """Scopes any one of which allows creating or replacing a record of ``kind``."""
    return ("write", "create", "update", f"{_PREFIX}:create:{kind}", f"{_PREFIX}:update:{kind}")


def ops_scopes() -> tuple[str, ...]:
    """Scopes any one of which allows reading ``/metrics`` and the API description."""
    return ("read", METRICS_SCOPE)


def read_scopes(kind: str) -> tuple[str, ...]:
    """Scopes any one of which allows reading a record of ``kind`` by id."""
    return ("read", f"{_PREFIX}:read:{kind}")


def delete_scopes(kind: str) -> tuple[str, ...]:
    """Scopes any one of which allows deleting a record of ``kind``."""
    return ("write", "delete", f"{_PREFIX}:delete:{kind}")


def require(principal: Principal, needed: Sequence[str]) -> None:
    """Raise Forbidden unless the principal holds at least one of ``needed``."""
    if principal.scopes.isdisjoint(needed):
        raise Forbidden(tuple(needed))


class Authenticator(Protocol):
    """Turns a bearer token (or its absence) into a Principal, or raises an AuthError."""

    async def authenticate(self, token: str | None) -> Principal:
        """Verify ``token``."""
        ...


class NoAuth:
    """Nothing configured: refuse every call, saying how to configure authentication."""

    async def authenticate(self, token: str | None) -> Principal:  # noqa: ARG002 - the protocol's signature
        raise AuthNotConfigured


class StaticTokens:
    """Tokens known in advance. Only SHA-256 digests are kept; all are compared, in constant time."""

    def __init__(self, entries: Sequence[tuple[bytes, Principal]]) -> None:
        self._entries = tuple(entries)

    @classmethod
    def from_settings(cls, token: str | None, tokens_file: Path | None) -> StaticTokens:
        """The static token (every scope) plus each token in the tokens file."""
        entries: list[tuple[bytes, Principal]] = []
        if token:
            entries.append((_digest(token), Principal("admin-token", ALL_SCOPES)))
        if tokens_file is not None:
            entries.extend(_read_tokens_file(tokens_file))
        return cls(entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def match(self, token: str) -> Principal | None:
        """The principal whose token this is, or None."""
        digest = _digest(token)
        found: Principal | None = None
        for known, principal in self._entries:
            if hmac.compare_digest(known, digest) and found is None:
                found = principal
        return found

    async def authenticate(self, token: str | None) -> Principal:
        principal = self.match(token) if token else None
        if principal is None:
            raise Unauthenticated("missing or invalid bearer token")
        return principal


class Chain:
    """Static tokens first, then a JWT verifier."""

    def __init__(self, static: StaticTokens, jwt: Authenticator | None) -> None:
        self._static = static
        self._jwt = jwt

    async def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise Unauthenticated("missing bearer token (Authorization: Bearer <token>)")
        principal = self._static.match(token)
        if principal is not None:
            return principal
        if self._jwt is not None and token.count(".") == 2:
            return await self._jwt.authenticate(token)
        raise Unauthenticated("invalid bearer token")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _read_tokens_file(path: Path) -> list[tuple[bytes, Principal]]:
    """``{"tokens": [{"subject", "token" | "token_sha256", "scopes": [...]}]}``."""
    where = f"admin tokens file {path}"
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"{where}: cannot read JSON: {exc}"
        raise ConfigError(msg) from exc
    items = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(items, list):
        msg = f'{where}: expected an object with a "tokens" list'
        raise ConfigError(msg)
    entries = []
    for index, item in enumerate(items):
        entries.append(_token_entry(item, f"{where}: tokens[{index}]"))
    return entries


def _token_entry(item: Any, where: str) -> tuple[bytes, Principal]:
    if not isinstance(item, dict):
        msg = f"{where} must be an object"
        raise ConfigError(msg)
    subject, scopes = item.get("subject"), item.get("scopes")
    if not isinstance(subject, str) or not subject:
        msg = f"{where}.subject must be a non-empty string"
        raise ConfigError(msg)
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        msg = f"{where}.scopes must be a list of strings"
        raise ConfigError(msg)
    if unknown := sorted(set(scopes) - ALL_SCOPES):
        msg = f"{where}.scopes has unknown scopes: {', '.join(unknown)}"
        raise ConfigError(msg)
    if isinstance(item.get("token"), str) and item["token"]:
        digest = _digest(item["token"])
    elif isinstance(item.get("token_sha256"), str):
        try:
            digest = bytes.fromhex(item["token_sha256"])
        except ValueError as exc:
            msg = f"{where}.token_sha256 must be hex"
            raise ConfigError(msg) from exc
        if len(digest) != hashlib.sha256().digest_size:
            msg = f"{where}.token_sha256 must be 64 hex digits"
            raise ConfigError(msg)
    else:
        msg = f'{where} needs "token" or "token_sha256"'
        raise ConfigError(msg)
    return digest, Principal(subject, frozenset(scopes))
