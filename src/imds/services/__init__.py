"""The domain layer: knows models, errors and the Store protocol; never HTTP or SQL.

``Services`` holds one of each service, built from Settings by ``build_services`` and
started/stopped by the application's lifespan (or ``running()`` in tests).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from imds import log
from imds.config import Settings
from imds.errors import AuthNotConfigured, StoreUnavailable
from imds.metrics import Metrics
from imds.services.auth import Authenticator, Chain, NoAuth, StaticTokens
from imds.services.breaker import Breaker
from imds.services.catalog import Catalog
from imds.services.channel import Channel, ChannelLimits, EventHub
from imds.services.identity import IdentitySigner
from imds.services.limits import Limits
from imds.services.lookup import Lookup, LookupPolicy
from imds.services.os_crypto import PrivateCipher
from imds.services.os_definitions import OsDefinitions
from imds.services.os_records import OsRecords
from imds.services.proxied import SignedIdentity
from imds.services.proxytrust import warn_stored
from imds.services.templates import Template, compile_all
from imds.services.tokens import TokenIssuer
from imds.services.upsert import Records
from imds.signing import read_secret
from imds.store import Store, open_store
from imds.upstream.auth import ClientCredentials, NoCredentials, OAuth2ClientCredentials, StaticBearer, UpstreamAuth
from imds.upstream.client import UpstreamClient

_log = log.get("services")


@dataclass
class Services:
    """Everything the web layer calls, plus the resources they share."""

    settings: Settings
    store: Store
    catalog: Catalog
    records: Records
    auth: Authenticator
    templates: tuple[Template, ...]
    metrics: Metrics
    http: httpx.AsyncClient
    tokens: TokenIssuer
    channel: Channel
    lookup: Lookup | None = None
    os: OsRecords | None = None  # Ganeti OS records; always set by build_services
    limits: Limits = field(default_factory=Limits)
    signed: SignedIdentity | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _signer: IdentitySigner | None = None

    @property
    def signer(self) -> IdentitySigner:
        """The identity-document signer, loaded (or generated) on first use."""
        if self._signer is None:
            s = self.settings
            self._signer = IdentitySigner.load(key_file=s.identity_key, cert_file=s.identity_cert, data_dir=s.key_dir)
        return self._signer

    async def start(self, *, background: bool = False) -> None:
        """Load keys and the catalog, and start following the change feed.

        With ``background`` the catalog loads in a task (retrying while the store is
        unavailable) so the listener can answer 503 meanwhile instead of staying silent.
        """
        if self.settings.identity_key or self.settings.key_dir:
            _ = self.signer  # a bad key fails at startup, not at the first identity request
        if background:
            self._tasks.append(asyncio.create_task(self._load_then_follow(), name="imds-catalog-load"))
        else:
            await self._loaded()
            self._tasks.append(asyncio.create_task(self.catalog.follow(), name="imds-feed-follower"))
        self._tasks.append(asyncio.create_task(self.channel.hub.follow(), name="imds-event-follower"))
        if self.lookup is not None and self.settings.lookup_refresh_after > 0:
            self._tasks.append(asyncio.create_task(self.lookup.refresh_loop(), name="imds-lookup-refresh"))

    async def _loaded(self) -> None:
        await self.catalog.load()
        warn_stored(self.catalog.holdings(), self.settings.trusted_proxies)

    async def _load_then_follow(self) -> None:
        delay = 0.5
        while True:
            try:
                await self._loaded()
                break
            except StoreUnavailable as exc:
                self.catalog.phase = "waiting"
                _log.warning("catalog.load_failed", problem=exc.message, retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            except Exception:
                _log.exception("catalog.load_error")  # a bug, not an outage: /readyz stays 503 and says loading
                raise
        await self.catalog.follow()

    async def stop(self) -> None:
        """Stop background work and close the store and HTTP client."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.http.aclose()
        await self.store.close()

    @contextlib.asynccontextmanager
    async def running(self, *, background: bool = False) -> AsyncIterator[Services]:
        """``start`` on entry and ``stop`` on exit."""
        await self.start(background=background)
        try:
            yield self
        finally:
            await self.stop()


def build_services(
    settings: Settings, *, store: Store | None = None, http: httpx.AsyncClient | None = None
) -> Services:
    """Wire the services for ``settings``. Nothing connects until ``start``."""
    if store is None:
        store = open_store(settings.db_url, connect_timeout=settings.db_connect_timeout,
                           statement_timeout=settings.db_statement_timeout)
    http = http if http is not None else httpx.AsyncClient(timeout=5.0)
    metrics = Metrics()
    catalog = Catalog(store, poll_interval=settings.feed_poll_interval,
                      render_cache_bytes=settings.render_cache_bytes)
    records = Records(store, catalog, metrics, trusted=settings.trusted_proxies)
    return Services(
        settings=settings,
        store=store,
        catalog=catalog,
        records=records,
        lookup=_lookup(settings, http, records, catalog, metrics),
        auth=_authenticator(settings, http),
        templates=compile_all(settings.templates),
        metrics=metrics,
        http=http,
        tokens=TokenIssuer.load(key_file=settings.imdsv2_key_file, data_dir=settings.key_dir),
        os=OsRecords(
            store, catalog, cipher=PrivateCipher.from_file(settings.private_key_file),
            definitions=OsDefinitions.load(settings.os_definitions_dir),
        ),
        limits=limits_of(settings),
        signed=_signed_identity(settings),
        channel=_channel(settings, store),
    )


def limits_of(settings: Settings) -> Limits:
    """The write limits configured in ``settings``."""
    return Limits(settings.max_addresses, settings.max_document_depth, settings.max_document_keys)


def _signed_identity(settings: Settings) -> SignedIdentity:
    """The proxy secrets, read once here (current first, then the previous during a rotation)."""
    files = (
        (settings.proxy_shared_secret_file, "--proxy-shared-secret-file"),
        (settings.proxy_previous_secret_file, "--proxy-previous-secret-file"),
    )
    secrets = [read_secret(path, flag) for path, flag in files if path is not None]
    return SignedIdentity(settings.trusted_proxies, secrets)


def _channel(settings: Settings, store: Store) -> Channel:
    s = settings
    limits = ChannelLimits(
        rate=s.event_rate, burst=s.event_burst, event_max_bytes=s.event_max_bytes, retain=s.event_retain,
        message_max_bytes=s.message_max_bytes, max_queued=s.message_max_queued,
    )
    return Channel(store, limits, EventHub(store, s.feed_poll_interval))


def _lookup(
    settings: Settings, http: httpx.AsyncClient, records: Records, catalog: Catalog, metrics: Metrics
) -> Lookup | None:
    if not settings.lookup_url:
        return None
    auth: UpstreamAuth = NoCredentials()
    if settings.lookup_token:
        auth = StaticBearer(settings.lookup_token)
    elif settings.lookup_oidc_issuer and settings.lookup_client_id and settings.lookup_client_secret:
        credentials = ClientCredentials(
            settings.lookup_oidc_issuer, settings.lookup_client_id, settings.lookup_client_secret,
            settings.lookup_scopes, settings.lookup_audience,
        )
        auth = OAuth2ClientCredentials(http, credentials)
    client = UpstreamClient(http, settings.lookup_url, auth=auth, timeout=settings.lookup_timeout)
    policy = LookupPolicy(
        timeout=settings.lookup_timeout,
        negative_ttl=settings.lookup_negative_ttl,
        refresh_after=settings.lookup_refresh_after,
        cache_ttl=settings.lookup_cache_ttl,
        concurrency=settings.lookup_concurrency,
        limits=limits_of(settings),
    )
    breaker = Breaker(failures=settings.lookup_breaker_failures, reset=settings.lookup_breaker_reset)
    return Lookup(client, records, catalog, metrics, policy=policy, breaker=breaker)


def _authenticator(settings: Settings, http: httpx.AsyncClient) -> Authenticator:
    static = StaticTokens.from_settings(settings.admin_token, settings.admin_tokens_file)
    jwt: Authenticator | None = None
    if settings.oidc_issuer:
        from imds.services.oidc import OidcVerifier  # noqa: PLC0415 - only when OIDC is configured

        jwt = OidcVerifier(settings, http)
    if not static and jwt is None:
        _log.warning("admin.auth_not_configured", problem=AuthNotConfigured().message)
        return NoAuth()
    return Chain(static, jwt)
