"""What each admin route needs, as data, and the gate that checks it before anything else.

``NEEDS`` maps every admin route (method, path as FastAPI declares it, without ``/api/v1``)
to the scope groups it needs: one scope of *each* group. A route's groups cover everything
its answer holds: a config drive holds the metadata and the userdata, so it needs a read
scope for both. Needs that depend on the data (an instance's Ganeti OS record in
``GET /device-records``, ``/explain``) are checked by the route itself on top of these.
``PUBLIC`` lists the routes that answer anyone. docs/admin-auth.md has the same table, and
``tests/integration/test_admin_scopes.py`` walks it against the app's routes.

``gate`` is a dependency of the whole admin app. FastAPI solves it before it validates a
route's own parameters, so an anonymous caller gets 401 (and a token without the scopes
403) before any parameter is looked at: a refused call never sees its input echoed back.
A route in neither table is refused (403): a new route is closed until it is listed.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request

from imds.errors import Refused
from imds.models import METADATA, NOTICE_KIND, OS_KIND, PROJECT_KIND, USERDATA
from imds.services import Services
from imds.services.admission.auth import delete_scopes, ops_scopes, read_scopes, upsert_scopes
from imds.web.admin.auth import admit
from imds.web.routes import API_V1

Groups = tuple[tuple[str, ...], ...]

_READ_BOTH: Groups = (read_scopes(METADATA), read_scopes(USERDATA))
_WRITE_BOTH: Groups = (upsert_scopes(METADATA), upsert_scopes(USERDATA))
_ID = "/{instance_id}"
_PROJECT = "/projects/{project_id}/attributes"
_NOTICE = "/device-notices/{notice_id}"
METRICS_PATH = "/metrics"


def _read_and_head(path: str, groups: Groups) -> dict[tuple[str, str], Groups]:
    return {("GET", path): groups, ("HEAD", path): groups}


NEEDS: dict[tuple[str, str], Groups] = {
    # hollow's routes
    ("POST", "/device-metadata"): (upsert_scopes(METADATA),),
    ("POST", "/device-userdata"): (upsert_scopes(USERDATA),),
    **_read_and_head("/device-metadata" + _ID, (read_scopes(METADATA),)),
    **_read_and_head("/device-userdata" + _ID, (read_scopes(USERDATA),)),
    ("DELETE", "/device-metadata" + _ID): (delete_scopes(METADATA),),
    ("DELETE", "/device-userdata" + _ID): (delete_scopes(USERDATA),),
    # a refresh stores what the upstream answers and answers it
    ("POST", "/device-metadata/refresh" + _ID): (upsert_scopes(METADATA), read_scopes(METADATA)),
    ("POST", "/device-userdata/refresh" + _ID): (upsert_scopes(USERDATA), read_scopes(USERDATA)),
    # OpenStack parts: a drive holds the metadata and the userdata
    ("GET", "/device-configdrive" + _ID): _READ_BOTH,
    ("DELETE", "/device-password" + _ID): (delete_scopes(METADATA),),
    # whole records (+ metadata:read:os / create:os when one carries an OS record: checked by the route)
    ("GET", "/device-records"): _READ_BOTH,
    ("GET", "/device-records" + _ID): _READ_BOTH,
    ("POST", "/device-records"): _WRITE_BOTH,
    # Ganeti
    ("POST", "/device-os"): (upsert_scopes(OS_KIND),),
    **_read_and_head("/device-os" + _ID, (read_scopes(OS_KIND),)),
    ("DELETE", "/device-os" + _ID): (delete_scopes(OS_KIND),),
    ("GET", "/os-definitions"): (read_scopes(OS_KIND),),
    ("GET", "/os-definitions/{name}"): (read_scopes(OS_KIND),),
    # GCE projects
    ("PUT", _PROJECT): (upsert_scopes(PROJECT_KIND),),
    **_read_and_head(_PROJECT, (read_scopes(PROJECT_KIND),)),
    ("DELETE", _PROJECT): (delete_scopes(PROJECT_KIND),),
    # lifecycle notices
    ("POST", "/device-notices"): (upsert_scopes(NOTICE_KIND),),
    ("GET", "/device-notices"): (read_scopes(NOTICE_KIND),),
    **_read_and_head(_NOTICE, (read_scopes(NOTICE_KIND),)),
    ("PATCH", _NOTICE): (upsert_scopes(NOTICE_KIND),),
    ("DELETE", _NOTICE): (delete_scopes(NOTICE_KIND),),
    # reading about records (+ metadata:read:os for an instance with an OS record: checked by the route)
    ("GET", "/explain"): _READ_BOTH,
    ("GET", "/explain" + _ID): _READ_BOTH,
    ("GET", "/device-search"): _READ_BOTH,
    ("GET", "/device-changes"): _READ_BOTH,
    ("GET", "/audit"): (read_scopes(METADATA),),
    # the channel
    ("GET", "/device-events" + _ID): (read_scopes(METADATA),),
    ("GET", "/device-events" + _ID + "/stream"): (read_scopes(METADATA),),
    ("POST", "/device-messages" + _ID): (upsert_scopes(METADATA),),
    # operations (--metrics-public opens /metrics)
    ("GET", METRICS_PATH): (ops_scopes(),),
    ("GET", "/openapi.json"): (ops_scopes(),),
}
PUBLIC: frozenset[tuple[str, str]] = frozenset({
    ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/identity/certificate.pem"),
    ("GET", "/docs"), ("GET", "/docs/assets/{name}"), ("GET", "/ui"), ("GET", "/ui/{name}"),
})


def needs(method: str, path: str) -> Groups | None:
    """The groups ``method path`` needs (``/api/v1`` aliases as their route); None for a public route.

    Refused (403) for a route listed nowhere.
    """
    key = (method, path.removeprefix(API_V1) if path.startswith(API_V1 + "/") else path)
    if key in PUBLIC:
        return None
    found = NEEDS.get(key)
    if found is None:
        msg = f"{method} {key[1]} is in no admin scope table: refused until it is listed"
        raise Refused(msg)
    return found


def gate(services: Services) -> Any:
    """The admin app's dependency: authenticate and check ``NEEDS`` before the route parses anything."""
    metrics_public = services.settings.admin.metrics_public

    async def check(request: Request) -> None:
        path = str(getattr(request.scope.get("route"), "path", ""))
        groups = needs(request.method, path)
        if groups is None or (metrics_public and path == METRICS_PATH):
            return
        await admit(services, request, groups)

    return Depends(check)
