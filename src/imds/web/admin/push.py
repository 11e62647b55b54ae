"""The admin API: push, read and delete records by instance id (hollow's routes).

Mounted at ``/`` and under ``/api/v1``. Every call needs a bearer token with a matching
scope (see ``imds.services.admission.auth``); credentials are checked before the body is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from imds.models import METADATA, USERDATA, WriteResult
from imds.services import Services
from imds.services.admission.auth import upsert_scopes
from imds.services.catalog.addresses import display
from imds.services.records.wire import parse_body, parse_instance_id, parse_metadata_write, parse_userdata_write
from imds.services.render.json import encode, metadata_bytes
from imds.web.admin.auth import ID_EXTRA, authorize, record_schema, request_body
from imds.web.body import read_limited
from imds.web.errors import JSON, documented

_IP_LIST = {
    "type": "array",
    "items": {"type": "string", "description": "IPv4/IPv6 host address or CIDR"},
    "description": "The complete list: unlisted addresses are dropped; listed ones move here.",
}
METADATA_SCHEMA = record_schema(
    ("ipAddresses", "metadata"),
    ipAddresses=_IP_LIST,
    metadata={
        "oneOf": [
            {"type": "object", "properties": {
                "devices": {"type": "array", "items": {"type": "object"}, "description":
                            "OpenStack device role tags (meta_data.json devices), checked against "
                            "device-role-tagging.schema.json (Draft 2020-12) and the rule that a tag names one "
                            "device per type (same-serial disks excepted)."},
                "network_data": {"type": "object", "description":
                                 "OpenStack network_data.json (links, networks, services); derived from "
                                 "network when absent."},
                "vendor_data": {"type": "object", "description": "OpenStack vendor_data.json."},
            }},
            {"type": "string", "description": "a JSON-encoded object"},
        ],
        "description": "The Equinix-shaped document. A top-level updated_at older than the stored one "
        "makes the write a no-op (applied: false). The optional top-level devices, network_data and "
        "vendor_data keys are the OpenStack parts of the record (a 400 names any offending field). A "
        "top-level host is the hypervisor the instance runs on (never served to the instance).",
    },
    host={"type": ["string", "null"], "description": "Where the instance runs (Nova's instance.host, Ganeti's "
          "primary node), stored as the document's host: a signature from another host's key is refused. "
          "The same as metadata.host (the two must agree)."},
)
USERDATA_SCHEMA = record_schema(
    ("ipAddresses", "userdata"),
    ipAddresses=_IP_LIST,
    userdata={"type": "string", "description": "Text, or strict base64 (decoded)."},
    userdata_encoding={"type": "string", "enum": ["text", "base64"], "description": "Overrides the guess."},
)


def _write_response(result: WriteResult) -> Response:
    body: dict[str, Any] = {"id": result.instance_id, "applied": result.applied}
    if result.applied:
        body["ipAddresses"] = [display(a) for a in result.addresses]
        body["moved"] = {display(a): held_by for a, held_by in result.moved.items()}
        body["dropped"] = [display(a) for a in result.dropped]
        if result.warnings:
            body["warnings"] = list(result.warnings)
    else:
        body["reason"] = result.reason
    header = {"X-Imds-Write": "applied" if result.applied else "stale"}
    return Response(encode(body), media_type=JSON, headers=header)


def _data_response(request: Request, body: bytes, media_type: str) -> Response:
    if request.method == "HEAD":
        return Response(media_type=media_type, headers={"content-length": str(len(body))})
    return Response(body, media_type=media_type)


Endpoint = Callable[[Request], Awaitable[Response]]
UPSERT_PATHS = ("/device-metadata", "/device-userdata")  # POST: the write path at fleet rates


def upsert_endpoints(services: Services) -> dict[str, Endpoint]:
    """``POST /device-metadata`` and ``/device-userdata``, by path.

    The admin router registers them (routing, the OpenAPI description); the instance front
    also calls them directly, so a write does not pay the framework's routing on its way
    (``imds.web.instance``).
    """
    records = services.records
    limit = services.settings.limits.max_body_bytes

    async def post_metadata(request: Request) -> Response:
        subject = await authorize(services, request, upsert_scopes(METADATA))
        write = await parse_body(parse_metadata_write, await read_limited(request, limit), services.limits)
        return _write_response(await records.put_metadata(write, subject=subject))

    async def post_userdata(request: Request) -> Response:
        subject = await authorize(services, request, upsert_scopes(USERDATA))
        write = await parse_body(parse_userdata_write, await read_limited(request, limit), services.limits)
        return _write_response(await records.put_userdata(write, subject=subject))

    return dict(zip(UPSERT_PATHS, (post_metadata, post_userdata), strict=True))


def admin_router(services: Services) -> APIRouter:
    """The admin routes, bound to ``services``."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 404, 413, 503))
    records = services.records

    upserts = upsert_endpoints(services)
    router.post("/device-metadata", openapi_extra=request_body(METADATA_SCHEMA),
                summary="Create or replace metadata")(upserts["/device-metadata"])
    router.post("/device-userdata", openapi_extra=request_body(USERDATA_SCHEMA),
                summary="Create or replace userdata")(upserts["/device-userdata"])

    # GET and HEAD are separate routes so each gets its own OpenAPI operation id.
    @router.get("/device-metadata/{instance_id}", summary="Read metadata by instance id", openapi_extra=ID_EXTRA)
    @router.head("/device-metadata/{instance_id}", summary="Headers of the metadata read", openapi_extra=ID_EXTRA)
    async def get_metadata(request: Request, instance_id: str) -> Response:
        instance = await records.get(METADATA, parse_instance_id(instance_id))
        return _data_response(request, metadata_bytes(instance, services.templates), JSON)

    # GET and HEAD are separate routes so each gets its own OpenAPI operation id.
    @router.get("/device-userdata/{instance_id}", summary="Read userdata by instance id", openapi_extra=ID_EXTRA)
    @router.head("/device-userdata/{instance_id}", summary="Headers of the userdata read", openapi_extra=ID_EXTRA)
    async def get_userdata(request: Request, instance_id: str) -> Response:
        instance = await records.get(USERDATA, parse_instance_id(instance_id))
        return _data_response(request, instance.userdata or b"", "application/octet-stream")

    @router.delete("/device-metadata/{instance_id}", summary="Delete metadata")
    async def delete_metadata(request: Request, instance_id: str) -> Response:
        subject = await authorize(services, request)
        await records.delete(METADATA, parse_instance_id(instance_id), subject=subject)
        return Response(encode({"id": instance_id.lower(), "deleted": METADATA}), media_type=JSON)

    @router.delete("/device-userdata/{instance_id}", summary="Delete userdata")
    async def delete_userdata(request: Request, instance_id: str) -> Response:
        subject = await authorize(services, request)
        await records.delete(USERDATA, parse_instance_id(instance_id), subject=subject)
        return Response(encode({"id": instance_id.lower(), "deleted": USERDATA}), media_type=JSON)

    @router.get(
        "/identity/certificate.pem", summary="Certificate that verifies EC2 identity documents (public, no token)",
        response_class=Response,
    )
    async def identity_certificate() -> Response:
        return Response(services.signer.certificate_pem, media_type="application/x-pem-file")

    return router
