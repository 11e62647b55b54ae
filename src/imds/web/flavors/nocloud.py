"""The NoCloud flavor: ``/nocloud/meta-data``, ``user-data``, ``vendor-data``, ``network-config``.

cloud-init's NoCloud-Net reads ``<seedfrom>meta-data``, ``user-data`` and ``vendor-data``
(``seedfrom=http://169.254.169.254/nocloud/``). ``user-data`` always answers 200 (empty
when the instance has none); ``network-config`` is 404 when the record describes no
network. ``/nocloud/`` lists the files. Errors are plain text, never 500.
"""

from __future__ import annotations

import contextlib

from imds.errors import ImdsError, NotFound, RecordNotFound
from imds.models import METADATA, USERDATA
from imds.services import Services
from imds.services.render.nocloud import USER_DATA, nocloud_tree
from imds.services.render.tree import body, resolve
from imds.web.errors import status_for
from imds.web.replies import plain, userdata_type
from imds.web.routing import READ_METHODS, InstanceCall, Locator, Reply


class NoCloudFlavor:
    """Serves the NoCloud seed files rendered from the caller's record."""

    def __init__(self, _services: Services, locator: Locator) -> None:
        self._locator = locator

    async def handle(self, call: InstanceCall) -> Reply:
        """Any path under ``/nocloud``."""
        scope = call.scope
        if scope["method"] not in READ_METHODS:
            return plain(405)
        rest = "/".join(part for part in scope["path"].split("/")[2:] if part)
        kind = USERDATA if rest == USER_DATA else METADATA
        try:
            entry = await self._locator.entry(call, kind, needs_record=kind == METADATA)
            if kind == USERDATA and entry.instance.userdata is None:
                # NoCloud's user-data is always there: empty when the instance has none.
                with contextlib.suppress(RecordNotFound):
                    entry = await self._locator.record(call, entry, kind)
            node = resolve(entry.render("nocloud", nocloud_tree), rest)
            if node is None:
                raise NotFound(f"no {rest!r} under /nocloud")
        except ImdsError as exc:
            return plain(status_for(exc))
        self._locator.served(kind)
        if kind == USERDATA:
            return Reply(200, body(node), entry.render("nocloud/user-data:type", userdata_type), fixed=True)
        return Reply(200, body(node), fixed=True)

