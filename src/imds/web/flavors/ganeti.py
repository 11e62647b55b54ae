"""The Ganeti flavor: ``/ganeti/<version>/…``, as Ganeti's metad serves it to an instance being installed.

``os/parameters.json`` (metad's ``{name: [value, visibility]}``), ``os/scripts/<name>``
from the OS definition of the instance's ``os_type``, ``os/os-install-package`` (that
definition as a tar.gz) and ``os/package`` (the personalization package, fetched on
demand and checked). Answered (``read`` and ``write`` too) only while the instance's OS record has an install
mode or ``communication`` on; otherwise, like every unknown path, ``404 - Not Found``. Errors
are plain text, never JSON, never 500; a refused package is a 502 whose body says why.
metad itself answers only ``latest``; ``VERSIONS`` is where dated versions would go.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from types import MappingProxyType

from imds.errors import ImdsError, NotFound, UpstreamError
from imds.models import Instance
from imds.services import Services
from imds.services.ganeti.definitions import OsDefinition
from imds.services.ganeti.memory import PackageAuth
from imds.services.ganeti.records import OsRecords, active
from imds.services.ganeti.urls import IMAGE_PARAMETER
from imds.web.errors import status_for
from imds.web.replies import plain
from imds.web.routing import (
    BINARY,
    JSON,
    READ_METHODS,
    Handler,
    InstanceCall,
    Locator,
    Pending,
    Receive,
    Reply,
    Streamed,
)

VERSIONS = ("latest",)
GZIP = b"application/gzip"
PARAMETERS, SCRIPTS, INSTALL_PACKAGE, PACKAGE = "parameters.json", "scripts", "os-install-package", "package"
ENVIRONMENT, IMAGE = "environment", "image"
PACKAGE_PARAMETER = "os-package"
NODE_PARAMETERS = {PACKAGE: PACKAGE_PARAMETER, INSTALL_PACKAGE: "os-install-package"}  # leaf → Ganeti's parameter
NODE_TYPES = ((".tar.gz", b"application/x-tgz"), (".tgz", b"application/x-tgz"), (".gz", b"application/x-gzip"),
              (".tar", b"application/x-tar"))
# /ganeti/<version>/read and /write: the instance↔host channel (issue 11 §3).
CHANNEL_PATHS = ("read", "write")


class GanetiFlavor:
    """Serves metad's layout from the caller's OS record."""

    def __init__(self, services: Services, locator: Locator, channel: Mapping[str, Handler]) -> None:
        self._os: OsRecords = services.os
        self._locator = locator
        sources = services.os_sources
        self._fetcher, self._images, self._node_packages = sources.packages, sources.images, sources.node_packages
        # The channel's handlers for "read" and "write" (``imds.web.flavors.channel``), given
        # by the front; one that is missing answers 404, as metad's stubs do.
        self.channel: Mapping[str, Handler] = MappingProxyType(dict(channel))

    async def handle(self, call: InstanceCall) -> Reply:
        """Any path under ``/ganeti``."""
        scope = call.scope
        parts = [part for part in scope["path"].split("/")[2:] if part]
        try:
            if parts and parts[0] in VERSIONS and "/".join(parts[1:]) in CHANNEL_PATHS:
                channel = self.channel.get(parts[1])
                if channel is None:
                    raise NotFound(f"/ganeti/{parts[0]}/{parts[1]} is not wired yet")
                if not active((await self._locator.entry(call, count=False)).instance.os):
                    raise NotFound("no Ganeti OS installation is under way for this instance")
                return await channel(call)
            if scope["method"] not in READ_METHODS:
                return plain(405)
            return await self._read(call, parts)
        except ImdsError as exc:
            return plain(status_for(exc))

    async def _read(self, call: InstanceCall, parts: list[str]) -> Reply:
        instance = (await self._locator.entry(call, count=False)).instance
        if not active(instance.os):
            raise NotFound("no Ganeti OS installation is under way for this instance")
        if not parts:
            return Reply(200, "\n".join(VERSIONS).encode())
        if parts[0] not in VERSIONS:
            raise NotFound(f"no Ganeti version {parts[0]!r}")
        if len(parts) == 1:
            return Reply(200, b"os/")
        if parts[1] != "os":
            raise NotFound("no such path")
        return self._os_leaf(instance, "/".join(parts[2:]))

    def _os_leaf(self, instance: Instance, leaf: str) -> Reply:
        record = instance.os
        assert record is not None  # noqa: S101 - active() checked it
        own = self._instance_leaf(instance, leaf)
        if own is not None:
            return own
        definition = self._os.definitions.get(record.os_type)
        scripts = definition.scripts if definition is not None else {}
        name = leaf.removeprefix(f"{SCRIPTS}/")
        if leaf.startswith(f"{SCRIPTS}/") and name in scripts:
            return Reply(200, scripts[name], BINARY)
        if definition is None:
            raise NotFound(f"no OS definition {record.os_type!r} is loaded")
        served = self._os.served(instance)
        listings = {
            "": _os_listing(definition, has_package=record.package_url is not None or PACKAGE_PARAMETER in served,
                            has_image=IMAGE_PARAMETER in served),
            SCRIPTS: "\n".join(sorted(scripts)),
        }
        if leaf in listings:
            return Reply(200, listings[leaf].encode())
        if leaf == INSTALL_PACKAGE:
            return Reply(200, definition.package, GZIP)
        raise NotFound("no such path")

    def _instance_leaf(self, instance: Instance, leaf: str) -> Reply | None:
        """The leaves made from the instance's own record (no OS definition needed), or None."""
        record = instance.os
        assert record is not None  # noqa: S101 - active() checked it
        if leaf == PARAMETERS:
            return Reply(200, self._os.parameters_json(instance), JSON)
        if leaf == ENVIRONMENT:
            return Reply(200, self._os.environment(instance))
        if leaf == PACKAGE and record.package_url is not None:
            return self._package(record.package_url, self._os.package_auth(instance))
        served = self._os.served(instance) if leaf in {IMAGE, PACKAGE, INSTALL_PACKAGE} else {}
        image = served.get(IMAGE_PARAMETER) if leaf == IMAGE else None
        if image is not None:
            return self._image(image[0], record.package_url, self._os.package_auth(instance))
        # Ganeti's node paths, served as ganeti-metad serves them; os-install-package only where allowed
        # (otherwise the loaded OS definition's archive, below)
        node = served.get(NODE_PARAMETERS.get(leaf, ""))
        if node is not None and (leaf == PACKAGE or self._node_packages.directories):
            return self._node_package(node[0], NODE_PARAMETERS[leaf])
        return None

    def _package(self, url: str, auth: PackageAuth | None) -> Reply:
        fetcher = self._fetcher

        async def complete(_receive: Receive) -> Reply:
            try:
                data = await fetcher.fetch(url, auth)
            except UpstreamError as exc:
                return Reply(502, f"502 - Bad Gateway: {exc.message}".encode())
            except ImdsError as exc:
                return plain(status_for(exc))
            return Reply(200, data, GZIP)

        return Pending(complete=complete)


    def _node_package(self, value: str, field: str) -> Reply:
        packages = self._node_packages

        async def complete(_receive: Receive) -> Reply:
            try:
                data = await packages.read(value, field)
            except ImdsError as exc:
                return _refusal(exc)
            return Reply(200, data, _node_type(value))

        return Pending(complete=complete)

    def _image(self, value: str, package_url: str | None, auth: PackageAuth | None) -> Reply:
        images = self._images

        async def complete(_receive: Receive) -> Reply:
            try:
                image = await images.open(value, package_url=package_url, auth=auth)
            except ImdsError as exc:
                return _refusal(exc)
            return Streamed(200, b"", BINARY, chunks=image.chunks, length=image.length, close=image.close)

        return Pending(complete=complete)


def _node_type(path: str) -> bytes:
    """A node file's content type by its name, as ganeti-metad's file server (Snap) gives it."""
    return next((kind for suffix, kind in NODE_TYPES if path.endswith(suffix)), BINARY)


def _refusal(exc: ImdsError) -> Reply:
    """A plain-text error that says why: ``403 - Forbidden: os-image names a node path outside …``."""
    status = status_for(exc)
    return Reply(status, f"{status} - {HTTPStatus(status).phrase}: {exc.message}".encode())


def _os_listing(definition: OsDefinition, *, has_package: bool, has_image: bool) -> str:
    entries = [PARAMETERS, ENVIRONMENT, INSTALL_PACKAGE]
    if definition.scripts:
        entries.append(f"{SCRIPTS}/")
    if has_package:
        entries.append(PACKAGE)
    if has_image:
        entries.append(IMAGE)
    return "\n".join(sorted(entries))
