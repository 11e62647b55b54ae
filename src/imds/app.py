"""The application factory: ``build_app(settings)`` → the ASGI app ``imds serve`` runs.

The instance-facing front (raw ASGI) answers instance routes from memory and hands
every other request to the FastAPI admin app. The admin app's lifespan opens and closes
the services; nothing happens at import time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import APIRouter, FastAPI
from starlette.exceptions import HTTPException

from imds import __version__, log
from imds.config import Settings
from imds.errors import ImdsError
from imds.services import Services, build_services
from imds.services.demo import load_demo
from imds.store import Store
from imds.web.admin import admin_router
from imds.web.audit_admin import audit_router
from imds.web.channel_admin import channel_admin_router
from imds.web.docs import docs_router
from imds.web.errors import handle_http_error, handle_imds_error, handle_unexpected
from imds.web.explain_admin import explain_router
from imds.web.ganeti_admin import ganeti_admin_router
from imds.web.instance import InstanceFront
from imds.web.openstack_admin import openstack_admin_router
from imds.web.ops import ops_router
from imds.web.records_admin import records_admin_router
from imds.web.refresh import refresh_router
from imds.web.ui import ui_router

_log = log.get("app")


def build_app(
    settings: Settings, *, store: Store | None = None, http: httpx.AsyncClient | None = None
) -> InstanceFront:
    """Build the whole service for ``settings``; ``store``/``http`` may be injected by tests."""
    services = build_services(settings, store=store, http=http)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with services.running(background=True):  # the listener answers 503 until the catalog is loaded
            if settings.demo:
                instance_id = await load_demo(services.records)
                _log.info("demo.loaded", instance_id=instance_id, addresses=["127.0.0.1", "::1"])
            _log.info("imds.started", version=__version__, instances=len(services.catalog))
            yield
        _log.info("imds.stopped")

    admin = FastAPI(
        title="imds admin API",
        version=__version__,
        lifespan=lifespan,
        exception_handlers={ImdsError: handle_imds_error, HTTPException: handle_http_error,
                            Exception: handle_unexpected},
        openapi_url=None,  # served by ops_router, behind a token (read or metrics scope)
        docs_url=None,  # imds.web.docs serves /docs with local assets (no CDN)
        redoc_url=None,
        redirect_slashes=False,  # a 307 to http://<Host header>/… would be an open redirect: 404 as hollow
    )
    routers: list[APIRouter] = [admin_router(services), refresh_router(services), openstack_admin_router(services),
                                  records_admin_router(services)]
    routers.append(ganeti_admin_router(services))  # Ganeti OS records
    routers.append(audit_router(services))  # the audit log (GET /audit)
    routers.append(explain_router(services))  # imds explain (GET /explain)
    admin.include_router(ui_router(services))  # the admin web page (GET /ui) and its search/changes endpoints
    for router in routers:
        admin.include_router(router)
        admin.include_router(router, prefix="/api/v1", include_in_schema=False)
    admin.include_router(ops_router(services, admin.openapi))
    admin.include_router(docs_router(title=admin.title, openapi_url="/openapi.json"))
    admin.include_router(channel_admin_router(services))  # the host's side of the instance<->host channel
    return InstanceFront(services, admin)


__all__ = ["Services", "build_app"]
