"""Operational endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from imds.errors import StoreUnavailable
from imds.services import Services
from imds.services.render.json import encode
from imds.web.errors import JSON


def ops_router(services: Services) -> APIRouter:
    """``/healthz``, ``/readyz`` and ``/metrics``."""
    router = APIRouter(include_in_schema=False)

    @router.get("/healthz")
    async def healthz() -> Response:
        return Response(encode({"status": "ok"}), media_type=JSON)

    @router.get("/readyz")
    async def readyz() -> Response:
        catalog = services.catalog
        problems = [] if catalog.loaded else ["instance index not loaded"]
        try:
            await services.store.ping()
        except StoreUnavailable as exc:
            problems.append(exc.message)
        body = {"status": "not ready" if problems else "ready", "instances": len(catalog), "problems": problems}
        return Response(encode(body), status_code=503 if problems else 200, media_type=JSON)

    @router.get("/metrics")
    async def metrics() -> Response:
        services.metrics.instances.set(len(services.catalog))
        services.metrics.feed_position.set(services.catalog.position)
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
