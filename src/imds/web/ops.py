"""Operational endpoints: liveness, readiness (public), Prometheus metrics and the API description.

``/healthz`` and ``/readyz`` answer anyone (load balancers and orchestrators probe them).
``/metrics`` and ``/openapi.json`` need a token with the ``read`` or ``metrics``
scope: they reveal instance counts, error rates and the admin surface. ``--metrics-public``
keeps ``/metrics`` open for scrapers that cannot send a token (hollow's behaviour).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from imds.services import Services
from imds.services.render.json import encode
from imds.web.errors import JSON


def ops_router(services: Services, openapi: Callable[[], dict[str, Any]]) -> APIRouter:
    """``/healthz``, ``/readyz``, ``/metrics`` and ``/openapi.json`` (``openapi``: the schema)."""
    router = APIRouter(include_in_schema=False)

    @router.get("/healthz")
    async def healthz() -> Response:
        return Response(encode({"status": "ok"}), media_type=JSON)

    @router.get("/readyz")
    async def readyz() -> Response:
        state = await services.readiness.check()
        headers = None if state.ready else {"retry-after": "1"}
        return Response(encode(state.document()), status_code=200 if state.ready else 503, media_type=JSON,
                        headers=headers)

    @router.get("/openapi.json")
    async def openapi_json() -> Response:
        return Response(encode(openapi()), media_type=JSON)

    @router.get("/metrics")
    async def metrics() -> Response:
        services.metrics.instances.set(len(services.catalog))
        services.metrics.feed_position.set(services.catalog.position)
        services.metrics.ahead_pending.set(services.catalog.ahead.pending)
        services.metrics.ahead_built.set(services.catalog.ahead.built)
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
