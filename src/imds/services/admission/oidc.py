"""OIDC: admin credentials as JWTs signed by the issuer's keys (its JWKS).

``OidcVerifier`` checks a bearer JWT and returns the Principal it names:

* the signature, with an asymmetric algorithm only (RS*, PS*, ES*, EdDSA; never ``none``
  or HS*, so a public key can never be used as an HMAC secret), by the JWKS key whose
  ``kid`` the token names, and whose type (and curve) fits the algorithm;
* ``iss`` is the configured issuer (a trailing slash is not significant), ``aud``
  contains the configured audience when one is set, ``exp`` is present and in the
  future, ``nbf``/``iat`` are not in the future (30 s leeway for clock skew either way);
* the scopes are read from the roles claim (a list of strings or a space-separated
  string; a dotted name such as ``realm_access.roles`` walks nested objects), keeping
  the scope names imds knows; the subject from the username claim, else ``sub``.

The JWKS comes from ``oidc_jwks_url`` or from the issuer's discovery document
(``{issuer}/.well-known/openid-configuration``, its ``jwks_uri``), both fetched by
``imds.upstream.oidc`` (one discovery fetch per issuer, shared). It is cached: a token naming an unknown ``kid`` (a key
rotation) and a key set older than ``max_age`` trigger a refetch, but at most one fetch
per ``refetch_interval`` seconds, so a stream of forged tokens cannot turn imds into a
request amplifier against the issuer. A failed refetch keeps the keys already held.

A token that does not verify raises ``Unauthenticated`` (401) with a short reason that
never repeats the token; an unreachable or malformed discovery document or JWKS, with
no keys held, raises ``UpstreamError`` (502) naming the URL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from imds import log
from imds.config import Settings
from imds.errors import Unauthenticated, UpstreamError
from imds.models import Principal
from imds.services.admission.auth import ALL_SCOPES
from imds.upstream.oidc import Discovery, IssuerKeys

_log = log.get("oidc")

LEEWAY_SECONDS = 30.0
REFETCH_INTERVAL_SECONDS = 30.0
MAX_AGE_SECONDS = 600.0

# Accepted algorithms: the key type (and EC curve) each one needs.
_ALGORITHMS: dict[str, tuple[str, str | None]] = {
    **{f"{family}{bits}": ("RSA", None) for family in ("RS", "PS") for bits in (256, 384, 512)},
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", None),
}
_KEY_READERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "RSA": RSAAlgorithm.from_jwk,
    "EC": ECAlgorithm.from_jwk,
    "OKP": OKPAlgorithm.from_jwk,
}
_REASONS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "token has expired"),
    (jwt.ImmatureSignatureError, "token is not yet valid"),
    (jwt.InvalidAudienceError, "token audience does not match"),
    (jwt.InvalidIssuerError, "token issuer does not match"),
    (jwt.InvalidSignatureError, "token signature does not verify"),
    (jwt.InvalidKeyError, "token signing key is too weak or unusable"),
    (jwt.InvalidAlgorithmError, "token algorithm is not accepted"),
    (jwt.InvalidIssuedAtError, "token iat is invalid"),
    (jwt.DecodeError, "malformed token"),
)


@dataclass(frozen=True)
class _Key:
    """One usable verification key from the JWKS."""

    kty: str
    crv: str | None
    alg: str | None
    key: Any


class OidcVerifier:
    """Verifies JWTs issued by ``settings.oidc_issuer`` against its JWKS."""

    def __init__(
        self,
        settings: Settings,
        discovery: Discovery,
        *,
        refetch_interval: float = REFETCH_INTERVAL_SECONDS,
        max_age: float = MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not settings.admin.oidc_issuer:
            msg = "OidcVerifier needs settings.oidc_issuer"
            raise ValueError(msg)
        self._issuer = settings.admin.oidc_issuer
        bare = self._issuer.rstrip("/")
        self._issuers = (bare, bare + "/")
        self._audience = settings.admin.oidc_audience
        self._roles_claim = settings.admin.oidc_roles_claim
        self._username_claim = settings.admin.oidc_username_claim
        self._jwks = IssuerKeys(discovery, bare, settings.admin.oidc_jwks_url)
        self._refetch_interval = refetch_interval
        self._max_age = max_age
        self._clock = clock
        self._lock = asyncio.Lock()
        self._keys: dict[str | None, _Key] | None = None
        self._fetched_at = 0.0
        self._attempted_at: float | None = None
        self._last_error: str | None = None
        if not self._audience:
            _log.warning("oidc.no_audience", issuer=self._issuer, hint="any token of this issuer is accepted")

    async def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise Unauthenticated("missing bearer token (Authorization: Bearer <token>)")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated("malformed token") from exc
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in _ALGORITHMS:
            raise Unauthenticated(f"token algorithm is not accepted (one of: {', '.join(_ALGORITHMS)})")
        if kid is not None and not isinstance(kid, str):
            raise Unauthenticated("malformed token")  # PyJWT checks this too
        key = await self._key_for(kid, alg)
        claims = self._decode(token, key, alg)
        return Principal(self._subject(claims), self._scopes(claims))

    # -- verification --------------------------------------------------------------

    def _decode(self, token: str, key: _Key, alg: str) -> dict[str, Any]:
        required = ["exp", "iss", "aud"] if self._audience else ["exp", "iss"]
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuers,
                leeway=LEEWAY_SECONDS,
                options={
                    "require": required,
                    "verify_aud": bool(self._audience),
                    "enforce_minimum_key_length": True,
                },
            )
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(f"token lacks the {exc.claim} claim") from exc
        except jwt.PyJWTError as exc:
            reason = next((text for kind, text in _REASONS if isinstance(exc, kind)), "invalid token")
            raise Unauthenticated(reason) from exc
        return claims

    def _subject(self, claims: Mapping[str, Any]) -> str:
        names = dict.fromkeys((self._username_claim, "sub"))
        for name in names:
            value = _claim(claims, name)
            if isinstance(value, str) and value:
                return value
        raise Unauthenticated(f"token names no subject (claim {' or '.join(map(repr, names))})")

    def _scopes(self, claims: Mapping[str, Any]) -> frozenset[str]:
        value = _claim(claims, self._roles_claim)
        if isinstance(value, str):
            names = value.split()
        elif isinstance(value, list):
            names = [item for item in value if isinstance(item, str)]
        else:
            names = []
        return ALL_SCOPES.intersection(names)

    async def _key_for(self, kid: str | None, alg: str) -> _Key:
        """The key ``kid`` names (a lone key when there is no kid) that fits ``alg``."""
        if not self._holds(kid, self._clock()):
            async with self._lock:
                await self._refresh_for(kid)
        keys = self._keys or {}
        key = keys.get(kid)
        if key is None and kid is None and len(keys) == 1:
            key = next(iter(keys.values()))
        if key is None:
            raise Unauthenticated("token is signed by an unknown key" if kid else "token names no key (kid)")
        kty, crv = _ALGORITHMS[alg]
        if key.kty != kty or (crv is not None and key.crv != crv) or (key.alg is not None and key.alg != alg):
            raise Unauthenticated("token algorithm does not match its key")
        return key

    # -- the key set ---------------------------------------------------------------

    def _holds(self, kid: str | None, now: float) -> bool:
        """Whether the key set is loaded, younger than max_age, and has ``kid``."""
        return self._keys is not None and kid in self._keys and now - self._fetched_at < self._max_age

    async def _refresh_for(self, kid: str | None) -> None:
        """Refetch the JWKS if it is missing, old or lacks ``kid``, within the rate limit."""
        now = self._clock()
        keys = self._keys
        if self._holds(kid, now):
            return  # another request refreshed the set while this one waited
        if self._attempted_at is not None and now - self._attempted_at < self._refetch_interval:
            if keys is None:
                reason = self._last_error or f"the JWKS of {self._issuer} is not loaded"
                raise UpstreamError(f"{reason} (retrying in at most {self._refetch_interval:g} s)")
            return  # rate-limited: keep the keys held
        self._attempted_at = now
        try:
            self._keys = await self._fetch_keys()
        except UpstreamError as exc:
            self._last_error = exc.message
            if keys is None:
                raise
            _log.warning("oidc.jwks_refresh_failed", error=exc.message, keeping=len(keys))
            return
        self._fetched_at = now
        self._last_error = None

    async def _fetch_keys(self) -> dict[str | None, _Key]:
        url, document = await self._jwks.fetch()
        items = document.get("keys")
        if not isinstance(items, list):
            raise UpstreamError(f'JWKS at {url} is malformed: no "keys" list')
        keys: dict[str | None, _Key] = {}
        for item in items:
            parsed = _parse_jwk(item)
            if parsed is not None:
                kid, key = parsed
                keys.setdefault(kid, key)
        if not keys:
            raise UpstreamError(f"JWKS at {url} has no usable signing keys (RSA, EC or OKP public keys)")
        _log.info("oidc.jwks_fetched", url=url, keys=len(keys), ignored=len(items) - len(keys))
        return keys


def _parse_jwk(item: Any) -> tuple[str | None, _Key] | None:
    """A public signing key, or None for keys imds cannot or must not use (symmetric, private, enc)."""
    if not isinstance(item, dict):
        return None
    kty, kid, alg, crv = item.get("kty"), item.get("kid"), item.get("alg"), item.get("crv")
    reader = _KEY_READERS.get(kty) if isinstance(kty, str) else None
    if reader is None or item.get("use", "sig") != "sig" or "d" in item:
        return None
    if (kid is not None and not isinstance(kid, str)) or (alg is not None and alg not in _ALGORITHMS):
        return None
    try:
        key = reader(item)
    except (jwt.InvalidKeyError, ValueError, TypeError, KeyError):
        _log.warning("oidc.jwk_unusable", kid=kid, kty=kty)
        return None
    return kid, _Key(kty=str(kty), crv=crv if isinstance(crv, str) else None, alg=alg, key=key)


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    """The claim ``name``; a dotted name not present as such walks nested objects."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value
