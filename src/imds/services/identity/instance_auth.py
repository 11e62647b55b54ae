"""The anti-SSRF policy for the instance-facing flavors other than EC2.

A server-side request forgery (a web application on the instance fetching a URL an
attacker chose) can make a plain GET but cannot add request headers. So a flavor listed
in ``--instance-auth`` answers only requests that carry proof of a deliberate metadata
client: the header ``Metadata: true`` (Azure's), any ``Metadata-Flavor`` header (GCE's
``Metadata-Flavor: Google``; e.g. ``Metadata-Flavor: imds``), or a valid IMDSv2 token
(``X-aws-ec2-metadata-token``) minted for the calling instance. EC2 paths are governed by
``--imdsv2`` alone (EC2 clients speak tokens). The policy is opt-in per flavor because
cloud-init's OpenStack and NoCloud datasources send none of these headers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from imds.errors import Unauthenticated
from imds.services.identity.tokens import TOKEN_HEADER, TokenIssuer

METADATA_HEADER = "metadata"
FLAVOR_HEADER = "metadata-flavor"

class InstanceAuth:
    """Checks one request of a protected flavor; raises Unauthenticated when it lacks proof."""

    def __init__(self, tokens: TokenIssuer) -> None:
        self._tokens = tokens

    async def check(self, header: Callable[[str], str | None], instance_id: Callable[[], Awaitable[str]]) -> None:
        """``header(name)`` reads a request header; ``instance_id()`` finds the caller (only for a token)."""
        if (header(METADATA_HEADER) or "").strip().lower() == "true":
            return
        if (header(FLAVOR_HEADER) or "").strip():
            return
        token = header(TOKEN_HEADER)
        if token is not None:
            self._tokens.check(token, await instance_id())
            return
        msg = ("this path needs the header 'Metadata: true', a 'Metadata-Flavor' header "
               "or an IMDSv2 token (--instance-auth)")
        raise Unauthenticated(msg)
