"""The application factory: ``build_app(settings)`` → the ASGI app ``imds serve`` runs.

The instance-facing front (raw ASGI) answers instance routes from memory and hands
every other request to the FastAPI admin app. The admin app's lifespan opens and closes
the services; nothing happens at import time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from imds import __version__, log
from imds.config import Settings
from imds.errors import AuthNotConfigured, ImdsError
from imds.metad.luxi import serving as metad_serving
from imds.metrics import Metrics
from imds.services import Services
from imds.services.admission.auth import Authenticator, Chain, NoAuth, StaticTokens
from imds.services.catalog.catalog import Catalog
from imds.services.channel import Channel, EventHub
from imds.services.demo import load_demo
from imds.services.explain import Explainer
from imds.services.fleet import Fleet
from imds.services.ganeti.crypto import PrivateCipher
from imds.services.ganeti.definitions import OsDefinitions
from imds.services.ganeti.records import OsRecords
from imds.services.ganeti.sources import OsSources
from imds.services.identity.proxied import SignedIdentity
from imds.services.identity.tokens import TokenIssuer
from imds.services.lookup.breaker import Breaker
from imds.services.lookup.pull import Lookup, LookupPolicy
from imds.services.notices.records import NoticeRecords
from imds.services.readiness import ReadinessProbe
from imds.services.records.audit import AuditLog
from imds.services.records.limits import Limits
from imds.services.records.projects import ProjectRecords
from imds.services.records.upsert import Records
from imds.services.transfer.stored import StoredRecords
from imds.signing import read_secret
from imds.store import Store, open_store
from imds.upstream.auth import ClientCredentials, NoCredentials, OAuth2ClientCredentials, StaticBearer, UpstreamAuth
from imds.upstream.client import UpstreamClient
from imds.upstream.destination import DestinationPolicy, fetch_client
from imds.upstream.oidc import Discovery
from imds.web.admin.audit import audit_router
from imds.web.admin.channel import channel_admin_router
from imds.web.admin.docs import docs_router
from imds.web.admin.explain import explain_router
from imds.web.admin.ganeti import ganeti_admin_router
from imds.web.admin.notices import notices_router
from imds.web.admin.openstack import openstack_admin_router
from imds.web.admin.projects import projects_router
from imds.web.admin.push import admin_router
from imds.web.admin.records import records_admin_router
from imds.web.admin.refresh import refresh_router
from imds.web.admin.scopes import gate
from imds.web.admin.ui import ui_router
from imds.web.bounded import Bounded
from imds.web.errors import handle_http_error, handle_imds_error, handle_invalid_parameters, handle_unexpected
from imds.web.instance import InstanceFront
from imds.web.ops import ops_router
from imds.web.routes import API_V1, aliased

_log = log.get("app")


def build_app(
    settings: Settings, *, store: Store | None = None, http: httpx.AsyncClient | None = None,
    clock: Callable[[], float] = time.time,
) -> InstanceFront:
    """Build the whole service for ``settings``; tests may inject ``store``, ``http`` and ``clock`` (wall seconds)."""
    services = build_services(settings, store=store, http=http, clock=clock)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with services.running(background=True):  # the listener answers 503 until the catalog is loaded
            if settings.store.demo:
                instance_id, written = await load_demo(services.records)
                _log.info("demo.loaded", instance_id=instance_id, addresses=["127.0.0.1", "::1"], written=written)
            _log.info("imds.started", version=__version__, instances=len(services.catalog))
            async with metad_serving(services):  # --ganeti-metad-socket (imds.metad)
                yield
        _log.info("imds.stopped")

    admin = FastAPI(
        title="imds admin API",
        version=__version__,
        lifespan=lifespan,
        exception_handlers={ImdsError: handle_imds_error, HTTPException: handle_http_error,
                            RequestValidationError: handle_invalid_parameters, Exception: handle_unexpected},
        openapi_url=None,  # served by ops_router, behind a token (read or metrics scope)
        docs_url=None,  # imds.web.admin.docs serves /docs with local assets (no CDN)
        redoc_url=None,
        redirect_slashes=False,  # a 307 to http://<Host header>/… would be an open redirect: 404 as hollow
        dependencies=[gate(services)],  # every route's scopes (web/admin/scopes.py), before its parameters
    )
    routers: list[APIRouter] = [admin_router(services), refresh_router(services), openstack_admin_router(services),
                                  records_admin_router(services)]
    routers.append(ganeti_admin_router(services))  # Ganeti OS records
    routers.append(projects_router(services))  # GCE project attributes
    routers.append(notices_router(services))  # lifecycle notices
    routers.append(audit_router(services))  # the audit log (GET /audit)
    routers.append(explain_router(services))  # imds explain (GET /explain)
    # (router, also under /api/v1), in the order they are included
    mounted = [(ui_router(services), False), *((router, True) for router in routers)]  # ui: GET /ui and its search
    mounted += [(ops_router(services, admin.openapi), False),
                (docs_router(title=admin.title, openapi_url="/openapi.json"), False),
                (channel_admin_router(services), False)]  # the host's side of the instance<->host channel
    admin_routes: list[tuple[str, str]] = []  # (method, path) of every admin route, aliases included
    for router, versioned in mounted:
        admin.include_router(router)
        declared = [(method, str(getattr(route, "path", ""))) for route in router.routes
                    for method in getattr(route, "methods", None) or ()]
        if versioned:
            admin.include_router(router, prefix=API_V1, include_in_schema=False)
            declared = [(method, alias) for method, path in declared for alias in aliased(path)]
        admin_routes += declared
    return InstanceFront(services, admin, admin_routes=admin_routes)


def build_served_app(settings: Settings) -> Bounded:
    """``build_app`` behind the request limits of ``imds.web.bounded``: what ``imds serve`` runs."""
    return Bounded(build_app(settings), settings)



# -- wiring: the services for Settings (nothing connects until Services.start) --------


def _os_gone(os_records: OsRecords) -> Callable[[str, str], None]:
    """When an OS record leaves the catalog: the vault forgets its secrets, the cipher its unreadable values."""
    def gone(instance_id: str, generation: str) -> None:
        os_records.vault.forget(instance_id, generation)
        os_records.cipher.forget(instance_id)

    return gone


def build_services(
    settings: Settings, *, store: Store | None = None, http: httpx.AsyncClient | None = None,
    fetch: httpx.AsyncClient | None = None, clock: Callable[[], float] = time.time,
) -> Services:
    """Wire the services for ``settings``. Nothing connects until ``start``.

    ``http`` serves operator-configured URLs (lookup, OIDC); ``fetch`` the URLs records name
    (``os-image``, ``package.url``), under ``--fetch-allow``'s destination policy. ``clock``
    (wall-clock seconds) is what IMDSv2 token lifetimes and notices' moments follow.
    """
    if store is None:
        store = open_store(settings.store.db, connect_timeout=settings.store.db_connect_timeout,
                           statement_timeout=settings.store.db_statement_timeout)
    http = http if http is not None else httpx.AsyncClient(timeout=5.0)
    discovery = Discovery(http)  # one discovery fetch per OIDC issuer, whoever needs it
    metrics = Metrics()
    catalog = Catalog(store, poll_interval=settings.store.feed_poll_interval,
                      render_cache_bytes=settings.store.render_cache_bytes, clock=clock)
    catalog.ahead.enabled = settings.store.render_ahead  # off: nothing noted, no task (``Services.start``)
    records = Records(store, catalog, metrics, trusted=settings.callers.trusted_proxy)
    os_records = OsRecords(
        store, catalog, cipher=PrivateCipher.from_file(settings.ganeti.private_key_file),
        definitions=OsDefinitions.load(settings.ganeti.os_definitions_dir, settings.ganeti.ganeti_os_search_path),
    )
    catalog.on_os_gone = _os_gone(os_records)  # no secret outlives its record (issue 11)
    fetch = fetch if fetch is not None else fetch_client(destination_policy(settings))
    lookup = _lookup(settings, discovery, records, catalog, metrics)
    notices = NoticeRecords(store, catalog, clock=clock)
    channel = _channel(settings, store)
    channel.acknowledge = notices.acknowledge  # a guest's "notice-ack" event (imds.services.notices.records)
    return Services(
        settings=settings,
        store=store,
        catalog=catalog,
        records=records,
        projects=ProjectRecords(store, catalog),
        notices=notices,
        lookup=lookup,
        auth=_authenticator(settings, discovery),
        templates=settings.templates.compiled,
        metrics=metrics,
        http=http,
        fetch=fetch,
        os_sources=OsSources.of(settings, fetch),
        audit=AuditLog(store),
        explainer=Explainer(store, catalog, settings.templates.compiled, lookup),
        fleet=Fleet(catalog, store),
        transfer=StoredRecords(store, records, os_records, notices),
        readiness=ReadinessProbe(catalog, store, os_records.cipher),
        tokens=TokenIssuer.load(key_file=settings.ec2.imdsv2_key_file, data_dir=settings.store.key_dir, clock=clock),
        os=os_records,
        limits=limits_of(settings),
        signed=_signed_identity(settings),
        channel=channel,
    )


def destination_policy(settings: Settings) -> DestinationPolicy:
    """Where fetches on a record's behalf may connect: public addresses, ``--fetch-allow``, never imds itself."""
    return DestinationPolicy(allow=settings.ganeti.fetch_allow,
                             listeners=(*settings.http.listen, *settings.http.admin_listen))


def limits_of(settings: Settings) -> Limits:
    """The write limits configured in ``settings``."""
    return Limits.of(settings.limits)


def _signed_identity(settings: Settings) -> SignedIdentity:
    """The proxy and fleet secrets, read once here (current first, then the previous during a rotation)."""
    callers = settings.callers
    shared = _secrets((callers.proxy_shared_secret_file, "--proxy-shared-secret-file"),
                      (callers.proxy_previous_secret_file, "--proxy-previous-secret-file"))
    fleet = _secrets((callers.proxy_fleet_secret_file, "--proxy-fleet-secret-file"),
                     (callers.proxy_previous_fleet_secret_file, "--proxy-previous-fleet-secret-file"))
    if shared and callers.trusted_proxy:
        # Said once at startup: any holder of this secret (any host) can sign as any instance.
        _log.warning("serve.proxy_shared_secret", mode="one secret for every host",
                     advice="give each host its own key: --proxy-fleet-secret-file and imds host-key")
    return SignedIdentity(callers.trusted_proxy, shared, fleet_secrets=fleet, window=callers.proxy_signature_window,
                          accept_unstamped=callers.accept_unstamped_signatures)


def _secrets(*files: tuple[Path | None, str]) -> list[bytes]:
    return [read_secret(path, flag) for path, flag in files if path is not None]


def _channel(settings: Settings, store: Store) -> Channel:
    return Channel(store, settings.channel, EventHub(store, settings.store.feed_poll_interval))


def _lookup(
    settings: Settings, discovery: Discovery, records: Records, catalog: Catalog, metrics: Metrics
) -> Lookup | None:
    up = settings.lookup
    if not up.lookup_url:
        return None
    auth: UpstreamAuth = NoCredentials()
    if up.lookup_token:
        auth = StaticBearer(up.lookup_token)
    elif up.lookup_oidc_issuer and up.lookup_client_id and up.lookup_client_secret:
        credentials = ClientCredentials(
            up.lookup_oidc_issuer, up.lookup_client_id, up.lookup_client_secret, up.lookup_scope, up.lookup_audience,
        )
        auth = OAuth2ClientCredentials(discovery.http, credentials, discovery=discovery)
    client = UpstreamClient(discovery.http, up.lookup_url, auth=auth, timeout=up.lookup_timeout)
    policy = up.fill(LookupPolicy, prefix="lookup_", limits=limits_of(settings))
    breaker = Breaker(failures=settings.lookup.lookup_breaker_failures, reset=settings.lookup.lookup_breaker_reset)
    return Lookup(client, records, catalog, metrics, policy=policy, breaker=breaker)


def _authenticator(settings: Settings, discovery: Discovery) -> Authenticator:
    static = StaticTokens.from_settings(settings.admin.admin_token, settings.admin.admin_tokens_file)
    jwt: Authenticator | None = None
    if settings.admin.oidc_issuer:
        from imds.services.admission.oidc import OidcVerifier  # noqa: PLC0415 - only when OIDC is configured

        jwt = OidcVerifier(settings, discovery)
    if not static and jwt is None:
        _log.warning("admin.auth_not_configured", problem=AuthNotConfigured().message)
        return NoAuth()
    return Chain(static, jwt)


__all__ = ["Services", "build_app", "build_served_app", "build_services"]
