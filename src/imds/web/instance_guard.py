"""Wraps the guarded routes (``imds.web.routes``) of the flavors listed in ``--instance-auth``.

The check itself lives in ``imds.services.identity.instance_auth``; this module reads the headers
and answers a refusal in the flavor's own error style (JSON for the Equinix flavor, plain
text ``401 - Unauthorized`` for the others).
"""

from __future__ import annotations

from imds import log
from imds.config import INSTANCE_AUTH_FLAVORS
from imds.errors import ImdsError
from imds.services import Services
from imds.services.identity.instance_auth import InstanceAuth
from imds.web.errors import status_for
from imds.web.replies import plain
from imds.web.routing import Handler, InstanceCall, Locator, Reply, error_reply, header

_log = log.get("instance_auth")


def _refusal(flavor: str, exc: ImdsError) -> Reply:
    return error_reply(exc) if flavor == "json" else plain(status_for(exc))


class FlavorGuard:
    """Applies ``--instance-auth`` to the handlers of the protected flavors."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._protected = services.settings.callers.instance_auth
        self._auth = InstanceAuth(services.tokens)
        self._locator = locator
        open_flavors = [f for f in INSTANCE_AUTH_FLAVORS if f not in self._protected]
        if services.settings.ec2.imdsv2 == "required" and open_flavors:
            # EC2 needs tokens, but these flavors serve the same userdata to a plain GET (what SSRF makes).
            _log.warning("instance_auth.partial", imdsv2="required", open_flavors=open_flavors,
                         hint="--instance-auth all (breaks cloud-init's OpenStack and NoCloud-Net datasources)")

    def wrap(self, flavor: str, handler: Handler) -> Handler:
        """The handler of a guarded route of ``flavor``: as it is, or checked first when ``flavor`` is protected."""
        if flavor not in self._protected:
            return handler

        async def caller_id(call: InstanceCall) -> str:
            return (await self._locator.entry(call, count=False)).instance.id

        async def guarded(call: InstanceCall) -> Reply:
            try:
                await self._auth.check(lambda name: header(call.scope, name.encode()), lambda: caller_id(call))
            except ImdsError as exc:
                return _refusal(flavor, exc)
            return await handler(call)

        return guarded
