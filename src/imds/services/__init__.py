"""The domain layer: knows models, errors and the Store protocol; never HTTP or SQL.

``Services`` holds one of each service, built from Settings by ``imds.app.build_services`` and
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
from imds.errors import StoreUnavailable
from imds.metrics import Metrics
from imds.services.admission.auth import Authenticator
from imds.services.catalog.catalog import Catalog
from imds.services.channel import Channel
from imds.services.explain import Explainer
from imds.services.fleet import Fleet
from imds.services.ganeti.records import OsRecords
from imds.services.ganeti.sources import OsSources
from imds.services.identity.document import IdentitySigner
from imds.services.identity.idtoken import IdTokens, serve_url
from imds.services.identity.proxied import SignedIdentity
from imds.services.identity.proxytrust import warn_stored
from imds.services.identity.tokens import TokenIssuer
from imds.services.lookup.pull import Lookup
from imds.services.notices.records import NoticeRecords
from imds.services.readiness import ReadinessProbe
from imds.services.records.audit import AuditLog
from imds.services.records.limits import Limits
from imds.services.records.projects import ProjectRecords
from imds.services.records.upsert import Records
from imds.services.render.templates import Template
from imds.services.transfer.stored import StoredRecords
from imds.store import Store

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
    fetch: httpx.AsyncClient  # fetches on a record's behalf, under the destination policy (upstream/destination.py)
    tokens: TokenIssuer
    channel: Channel
    os: OsRecords  # Ganeti OS records: always there (no OS definition is loaded without --os-definitions-dir)
    projects: ProjectRecords  # GCE project attributes
    notices: NoticeRecords  # lifecycle notices the host sends to its guests
    os_sources: OsSources  # where the Ganeti flavor's packages and images come from
    audit: AuditLog
    explainer: Explainer
    fleet: Fleet  # the admin page's search and recent changes
    transfer: StoredRecords  # whole records read out and written back (GET|POST /device-records)
    readiness: ReadinessProbe  # /readyz
    lookup: Lookup | None = None
    limits: Limits = field(default_factory=Limits)
    signed: SignedIdentity | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _signer: IdentitySigner | None = None
    _idtokens: IdTokens | None = None

    @property
    def signer(self) -> IdentitySigner:
        """The identity-document signer, loaded (or generated) on first use."""
        if self._signer is None:
            ec2 = self.settings.ec2
            self._signer = IdentitySigner.load(
                key_file=ec2.identity_key, cert_file=ec2.identity_cert, data_dir=self.settings.store.key_dir,
            )
        return self._signer

    @property
    def idtokens(self) -> IdTokens:
        """The GCE identity-token signer and its key set, loaded (or generated) on first use."""
        if self._idtokens is None:
            gce = self.settings.gce
            self._idtokens = IdTokens.load(
                issuer=gce.identity_issuer or serve_url(self.settings.http.listen), key_file=gce.identity_key_file,
                previous_file=gce.identity_previous_key_file, data_dir=self.settings.store.key_dir,
            )
        return self._idtokens

    async def start(self, *, background: bool = False) -> None:
        """Load keys and the catalog, and start following the change feed.

        With ``background`` the catalog loads in a task (retrying while the store is
        unavailable) so the listener can answer 503 meanwhile instead of staying silent.
        """
        if self.settings.ec2.identity_key or self.settings.store.key_dir:
            _ = self.signer  # a bad key fails at startup, not at the first identity request
        if self.settings.gce.identity_key_file or self.settings.store.key_dir:
            _ = self.idtokens  # likewise for the GCE identity token key
        if background:
            self._tasks.append(asyncio.create_task(self._load_then_follow(), name="imds-catalog-load"))
        else:
            await self._loaded()
            self._tasks.append(asyncio.create_task(self.catalog.follow(), name="imds-feed-follower"))
        self._tasks.append(asyncio.create_task(self.channel.hub.follow(), name="imds-event-follower"))
        self._tasks.append(asyncio.create_task(self.catalog.follow_clock(), name="imds-notice-clock"))
        if self.catalog.ahead.enabled:  # --render-ahead
            self._tasks.append(asyncio.create_task(self.catalog.run_ahead(), name="imds-render-ahead"))
        if self.lookup is not None and self.settings.lookup.lookup_refresh_after > 0:
            self._tasks.append(asyncio.create_task(self.lookup.refresh_loop(), name="imds-lookup-refresh"))

    async def _loaded(self) -> None:
        await self.catalog.load()
        warn_stored(self.catalog.holdings(), self.settings.callers.trusted_proxy)
        self.os.cipher.audit(self.catalog.os_records())  # clear private values warn; unreadable ones: /readyz

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
        await self.fetch.aclose()
        await self.store.close()

    @contextlib.asynccontextmanager
    async def running(self, *, background: bool = False) -> AsyncIterator[Services]:
        """``start`` on entry and ``stop`` on exit."""
        await self.start(background=background)
        try:
            yield self
        finally:
            await self.stop()
