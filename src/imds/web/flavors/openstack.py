"""The OpenStack flavor: ``/openstack``, ``/openstack/<version>/…`` and the instance's password.

Reads answer from the catalog's per-version trees (``imds.services.render.openstack``);
``meta_data.json`` gets a fresh ``random_seed`` on every request, as Nova's does (its
``_metadata_as_json`` draws one per lookup, also from a cached ``InstanceMetadata``): the
front remembers the document and splices a new seed into each repeated read (``Reply.renew``). ``POST
/openstack/<version>/password`` (2013-04-04 and later) stores the password the instance
posts, once: 200 with an empty body, 409 when one is already set, 400 over 1020 bytes.
Errors are plain text (``404 - Not Found``), never JSON, never 500. ``GET
/openstack/latest/notices.json`` answers the lifecycle notices document of the JSON flavor's
``/notices`` (``imds.services.render.events``): imds's own, so Nova's listings do not show it
and a config drive does not hold it (a drive cannot follow notices).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from imds.errors import Conflict, ImdsError, InvalidInput, NotFound
from imds.models import METADATA, USERDATA
from imds.services import Services
from imds.services.records.upsert import PASSWORD_MAX_BYTES
from imds.services.render.events import notices_document
from imds.services.render.openstack import (
    GRIZZLY,
    LATEST,
    NOTICES,
    PASSWORD,
    USER_DATA,
    VERSIONS,
    SeededJson,
    since,
    splice,
    version_dir,
    versions_listing,
)
from imds.services.render.seeds import SeedPool
from imds.services.render.tree import body, resolve
from imds.web.replies import declared_over, plain, plain_error, read_body, userdata_type
from imds.web.routing import JSON, READ_METHODS, InstanceCall, Locator, Pending, Receive, Reply


class OpenStackFlavor:
    """Serves Nova's metadata layout rendered from the caller's record."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._records = services.records
        self._locator = locator
        self._seeds = SeedPool()

    async def handle(self, call: InstanceCall) -> Reply:
        """Any path under ``/openstack``."""
        scope = call.scope
        parts = [part for part in scope["path"].split("/")[2:] if part]
        method = scope["method"]
        try:
            if not parts:
                return Reply(200, versions_listing().encode()) if method in READ_METHODS else plain(405)
            version, rest = parts[0], "/".join(parts[1:])
            if version not in VERSIONS:
                raise NotFound(f"no OpenStack metadata version {version!r}")
            if rest == PASSWORD and not since(version, GRIZZLY):
                raise NotFound(f"/openstack/{version} has no password")
            if method == "POST" and rest == PASSWORD:
                return await self._post_password(call)
            if method not in READ_METHODS:
                return plain(405)
            return await self._read(call, version, rest)
        except ImdsError as exc:
            return plain_error(exc)

    async def _read(self, call: InstanceCall, version: str, rest: str) -> Reply:
        if version == LATEST and rest.rstrip("/") == NOTICES:
            return await self._notices(call)
        kind = USERDATA if rest == USER_DATA else METADATA
        entry = await self._locator.entry(call, kind, needs_record=True)
        root = entry.render(f"openstack/{version}", lambda found: version_dir(found, version))
        node = resolve(root, rest)
        if node is None:
            raise NotFound(f"no {rest!r} under /openstack/{version}")
        self._locator.served(kind)
        if isinstance(node, SeededJson):
            renew = partial(_seeded, node.opening(), self._seeds.take)
            return Reply(200, renew(), JSON, fixed=True, renew=renew)
        if rest.endswith(".json"):
            return Reply(200, body(node), JSON, fixed=True)
        if kind == USERDATA:
            return Reply(200, body(node), entry.render("openstack/user_data:type", userdata_type), fixed=True)
        return Reply(200, body(node), fixed=True)

    async def _notices(self, call: InstanceCall) -> Reply:
        """``latest/notices.json``: the JSON flavor's notices document (not Nova's, so not listed, not on a drive)."""
        entry = await self._locator.entry(call, METADATA, needs_record=True)
        body = entry.render_in_context("json/notices", lambda _instance, context: notices_document(context))
        return Reply(200, body, JSON, fixed=True)  # not recalled past the next moment a notice changes on its own

    async def _post_password(self, call: InstanceCall) -> Reply:
        instance = (await self._locator.entry(call)).instance
        if instance.password is not None:  # the store checks again, inside the write
            raise Conflict(f"instance {instance.id} already has a password")
        if declared_over(call.scope, PASSWORD_MAX_BYTES):
            raise InvalidInput.one("body", f"a password is at most {PASSWORD_MAX_BYTES} bytes")
        records, instance_id = self._records, instance.id

        async def complete(receive: Receive) -> Reply:
            try:
                await records.set_password(instance_id, await read_body(receive, PASSWORD_MAX_BYTES))
            except ImdsError as exc:
                return plain_error(exc)
            return Reply(200, b"")

        return Pending(complete=complete)


def _seeded(opening: bytes, take: Callable[[], bytes]) -> bytes:
    """A ``meta_data.json`` with a seed never handed out before (each the same length: ``SEED_BYTES``, base64)."""
    return splice(opening, take())
