"""The EC2 flavor: ``/<version>/meta-data/…``, ``user-data``, ``dynamic/…``, IMDSv2 tokens.

Errors answer with EC2's plain-text bodies (``404 - Not Found``), never JSON, never 500.
IMDSv2: ``PUT /latest/api/token`` mints a token bound to the caller; a request that
carries ``X-aws-ec2-metadata-token`` must carry a valid one for the same instance, and
with ``--imdsv2 required`` every read must. A token PUT that came through a proxy (any
header of ``imds.services.identity.tokens.FORWARDING_HEADERS``) is refused, as AWS does,
unless a trusted proxy signed the instance id and sent only ``X-Forwarded-For`` naming the
VM (rule in ``imds.services.identity.proxied``). A read carrying the token header more than
once is answered when one of them is valid: aws-node-termination-handler adds the new token
to the same request after a 401 (``pkg/ec2metadata``'s ``Request``), so its retry carries the
stale one first.

A read carrying one token is answered from the read memo (``imds.web.memo``) when it holds
that path's answer for the caller: the flavor's ``TokenGate`` checks the token as ``_read``
does and says its TTL header, the only part of the answer the token changes. Every AWS
version reads one tree, so the memo keeps one answer for a path under all of them
(``memo_path``), and the answers to every path of the tree are made ahead of the first read
(``ahead_reads``, for ``imds.web.answers``).
"""

from __future__ import annotations

import re
from functools import partial

from imds.errors import ImdsError, NotFound, Refused, Unauthenticated
from imds.models import METADATA, USERDATA, Instance
from imds.services import Services
from imds.services.catalog.catalog import Entry
from imds.services.identity.ahead import SigningQueue
from imds.services.identity.proxied import may_mint_through
from imds.services.identity.tokens import TOKEN_HEADER, TTL_HEADER, TokenIssuer, forwarding, is_token_path, parse_ttl
from imds.services.render.context import Context
from imds.services.render.ec2 import AWS_VERSIONS, HOLLOW_VERSION, IDENTITY, VERSIONS, version_root, versions_listing
from imds.services.render.tree import Dir, Later, body, resolve, walk
from imds.web.errors import status_for
from imds.web.flavors.gce import GOOGLE_ROOT, google_flavored
from imds.web.replies import plain
from imds.web.routing import READ_METHODS, InstanceCall, Locator, Reply, header

_TTL = TTL_HEADER.encode()
_TOKEN = TOKEN_HEADER.encode()
_NEEDS_METADATA = frozenset({"meta-data", "dynamic"})
_COUNTED = frozenset({"meta-data", "user-data"})  # reads that count as hollow's metadata/userdata hits
_VERSION_SHAPE = re.compile(r"\d{4}-\d{2}-\d{2}|1\.0|latest.*")  # fullmatch
_AHEAD_ROOM = 64  # signing jobs queued at most while building ahead: the rest of the queue is the reads'
_AWS = frozenset(AWS_VERSIONS)  # the versions that read the one AWS tree (``ec2/aws``)
_LATEST = "latest"


def memo_path(path: str) -> str:
    """The path the read memo keeps an EC2 answer under: ``/<any AWS version>/x`` is ``/latest/x`` (one tree).

    Any other path is its own (hollow's 2009-04-04 has a tree of its own).
    """
    if path[:1] == "/":
        version, slash, rest = path[1:].partition("/")
        if version in _AWS and version != _LATEST:
            return f"/{_LATEST}{slash}{rest}"
    return path


class TokenGate:
    """IMDSv2's token as a ``imds.web.routing.Gate``: what a read carrying one is answered with, beside the document.

    A valid token for the instance adds its TTL header (the seconds it has left, as
    ``Ec2Flavor._read`` answers); a read without one is admitted unless ``--imdsv2 required``.
    Anything else (a token invalid, expired or another instance's) is not admitted: the
    handler answers it (401).
    """

    __slots__ = ("_required", "_tokens", "header", "says")

    def __init__(self, tokens: TokenIssuer, *, required: bool) -> None:
        self._tokens = tokens
        self._required = required
        self.header = _TOKEN
        self.says = _TTL

    def admit(self, value: bytes | None, entry: Entry) -> tuple[tuple[bytes, bytes], ...] | None:
        """``((TTL header, seconds left),)`` for a valid token of ``entry``'s instance; () without one if optional."""
        if value is None:
            return None if self._required else ()
        try:
            left = self._tokens.check(value.decode("latin-1"), entry.id)  # its id, without materialising it
        except Unauthenticated:
            return None
        return _said(left)


def _said(left: int) -> tuple[tuple[bytes, bytes], ...]:
    """The headers of a read answered with a token that has ``left`` seconds left."""
    return ((_TTL, str(left).encode()),)


class Ec2Flavor:
    """Serves the EC2 trees rendered from the caller's record; ``gate``: its token, for the read memo."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._services = services
        self._locator = locator
        self._tokens = services.tokens
        self._required = services.settings.ec2.imdsv2 == "required"
        self.gate = TokenGate(self._tokens, required=self._required)
        # Every AWS version serves the same tree (``version_root``): one rendering for all of them.
        self._roots = {version: ("ec2/hollow", partial(self._root, version)) if version == HOLLOW_VERSION
                       else ("ec2/aws", partial(self._root, version)) for version in VERSIONS}
        self._signing = SigningQueue()
        services.catalog.ahead.builders.append(self)  # the AWS tree and its signatures, before the first read

    def ready(self) -> bool:
        """Whether the signing thread can take an instance built ahead (``RenderAhead``'s ``Builder``)."""
        return self._signing.queued < _AHEAD_ROOM

    def build(self, entry: Entry) -> bool:
        """Render ``entry``'s AWS tree as its first read would (its signatures queued on the signing thread)."""
        entry.render_in_context(*self._roots[_LATEST])
        return True

    def ahead_reads(self, entry: Entry) -> tuple[list[str], list[tuple[bytes, bytes]]] | None:
        """The reads whose answers are made ahead for ``entry`` (``imds.web.answers``): paths, and headers for each.

        Every path of its AWS tree under ``/latest/`` (a directory with and without its trailing
        slash), the headers a guest's read carries (a token with ``--imdsv2 required``).
        None while a signature is being made (they are asked again later); one nobody started
        is left to its first read.
        """
        root = entry.render_in_context(*self._roots[_LATEST])
        paths = [f"/{_LATEST}/"]
        for path, node in walk(root):
            if isinstance(node, Later) and node.value is None:
                if node.pending is not None:
                    return None
                continue
            paths.append(f"/{_LATEST}/{path}")
            if isinstance(node, Dir):  # the listings name directories without the slash clients mostly add
                paths.append(f"/{_LATEST}/{path}/")
        token = self._tokens.issue(entry.id, 60) if self._required else None
        return paths, [] if token is None else [(_TOKEN, token.encode())]

    def claims(self, segment: str) -> bool:
        """Whether an unknown first segment looks like an EC2 version (so 404s are EC2-style)."""
        return _VERSION_SHAPE.fullmatch(segment) is not None

    @staticmethod
    def mints(path: str) -> bool:
        """Whether a PUT to (decoded) ``path`` asks for an IMDSv2 token (which reads no request body)."""
        return is_token_path(path)

    async def versions(self, call: InstanceCall) -> Reply:
        """``GET /``: the versions served, one per line (GCE's root for ``Metadata-Flavor: Google``)."""
        if call.scope["method"] not in READ_METHODS:
            return plain(405)
        if google_flavored(call):
            return GOOGLE_ROOT
        return Reply(200, versions_listing().encode())

    async def handle(self, call: InstanceCall) -> Reply:
        """Any path under ``/<version>``."""
        scope = call.scope
        _, version, *rest = scope["path"].split("/", 2)
        subpath = rest[0] if rest else ""
        method = scope["method"]
        if version not in VERSIONS:
            return plain(404)
        try:
            if method == "PUT" and self.mints(scope["path"]):
                return await self._mint(call)
            if method not in READ_METHODS:
                return plain(405)
            return await self._read(call, version, subpath)
        except ImdsError as exc:
            return plain(status_for(exc))

    async def _mint(self, call: InstanceCall) -> Reply:
        scope = call.scope
        headers = scope["headers"]
        forwarded = [v.decode("latin-1") for k, v in headers if k == b"x-forwarded-for"]
        others = forwarding(h for h in headers if h[0] != b"x-forwarded-for")  # all but a trusted proxy's own
        if others or not may_mint_through(self._locator.claim(call), forwarded):
            raise Refused("IMDSv2 tokens cannot be requested through a proxy")
        ttl = parse_ttl(header(scope, _TTL))
        entry = await self._locator.entry(call)
        token = self._tokens.issue(entry.instance.id, ttl)
        return Reply(200, token.encode(), headers=((_TTL, str(ttl).encode()),))

    async def _read(self, call: InstanceCall, version: str, subpath: str) -> Reply:
        kind = subpath.split("/", 1)[0]
        record = USERDATA if kind == "user-data" else METADATA
        needs_record = kind in _NEEDS_METADATA or kind == "user-data"
        entry = await self._locator.entry(call, record, count=kind in _COUNTED, needs_record=needs_record)
        headers: tuple[tuple[bytes, bytes], ...] = ()
        tokens = [value.decode("latin-1") for key, value in call.scope["headers"] if key == _TOKEN]
        if tokens:
            headers = _said(self._check(tokens, entry.instance.id))
        elif self._required:
            raise Unauthenticated("an IMDSv2 token is required")
        root = entry.render_in_context(*self._roots[version])
        node = resolve(root, subpath)
        if node is None:
            raise NotFound(f"no {subpath!r} under /{version}")
        if isinstance(node, Later):  # a signature: made off the loop (imds.services.identity.ahead)
            await self._signing.made(node)
        if kind in _COUNTED:
            self._locator.served(record)
        return Reply(200, body(node), headers=headers, fixed=True, gate=self.gate)  # a token's answer says its TTL

    def _root(self, version: str, instance: Instance, context: Context) -> Dir:
        """Everything under ``/<version>/`` for ``instance`` (rendered once per version of it), signatures queued."""
        root = version_root(instance, version, self._services.signer, context)
        identity = resolve(root, IDENTITY)
        if isinstance(identity, Dir):
            for leaf in identity.values():
                if isinstance(leaf, Later):
                    self._signing.ahead(leaf)
        return root

    def _check(self, tokens: list[str], instance_id: str) -> int:
        """Seconds the first valid token has left; the first one's error when none is valid."""
        failures: list[Unauthenticated] = []
        for token in tokens:
            try:
                return self._tokens.check(token, instance_id)
            except Unauthenticated as exc:
                failures.append(exc)
        raise failures[0]
