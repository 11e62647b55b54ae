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
from imds.web.routing import READ_METHODS, Handler, Locator, Reply, Scope

PREFIX = "nocloud"


class NoCloudFlavor:
    """Serves the NoCloud seed files rendered from the caller's record."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._locator = locator
        self._metrics = services.metrics

    def prefixes(self) -> dict[str, Handler]:
        """First path segments this flavor answers."""
        return {PREFIX: self.handle}

    def handle(self, scope: Scope) -> Reply:
        """Any path under ``/nocloud``."""
        if scope["method"] not in READ_METHODS:
            return plain(405)
        rest = "/".join(part for part in scope["path"].split("/")[2:] if part)
        kind = USERDATA if rest == USER_DATA else METADATA
        try:
            entry = self._locator.entry(scope, kind)
            instance = entry.instance
            if kind == METADATA and instance.metadata is None:
                self._locator.record_missing(scope, RecordNotFound(METADATA, instance.id))
            if kind == USERDATA and instance.userdata is None:
                # NoCloud's user-data is always there: empty when the instance has none.
                with contextlib.suppress(RecordNotFound):
                    self._locator.record_missing(scope, RecordNotFound(USERDATA, instance.id))
            node = resolve(entry.render("nocloud", nocloud_tree), rest)
            if node is None:
                raise NotFound(f"no {rest!r} under /nocloud")
        except ImdsError as exc:
            return plain(status_for(exc))
        self._metrics.count_read(kind, hit=True)
        if kind == USERDATA:
            return Reply(200, body(node), entry.render("nocloud/user-data:type", userdata_type))
        return Reply(200, body(node))

