"""What every connection of one serving process shares: the app, its fast path, the limits, the clock line."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

from imds.cli.front.exchange import DateLine
from imds.config import Settings
from imds.web.bounded import Bounded
from imds.web.instance import InstanceFront, Receive, Send
from imds.web.memo import Remembered
from imds.web.routing import Handler, Scope

if TYPE_CHECKING:
    from imds.cli.front.connection import Connection

Serve = Callable[[Scope, Send, Handler, Receive], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class FastPath:
    """How the served app answers an instance request without the ASGI hand-off.

    ``untouched(headers)``: the request limits would hand it on as it is (``Bounded``);
    ``route(scope)``: the instance handler, or None for the admin app; ``serve``: the
    coroutine the ASGI entry point runs for it (``InstanceFront.serve``); ``remembered``:
    a repeated read answered whole (``imds.web.memo``), bookkeeping done; ``again``: the
    same read by its bytes, still answered so; ``mints(path)``: whether a bodiless PUT there is
    the IMDSv2 token request (``serve`` answers it too); and ``instance_listener(server)``:
    whether a local address takes instance requests.
    """

    untouched: Callable[[list[tuple[bytes, bytes]]], bool]
    route: Callable[[Scope], Handler | None]
    serve: Serve
    remembered: Callable[[tuple[str, int], str, str, list[tuple[bytes, bytes]]], Remembered | None]
    again: Callable[[tuple[str, int], str, Remembered], bool]
    mints: Callable[[str], bool]
    instance_listener: Callable[[tuple[str, int]], bool]

    @classmethod
    def of(cls, app: Any) -> FastPath | None:
        """The fast path of ``imds serve``'s app (``Bounded`` around ``InstanceFront``); None for any other."""
        if isinstance(app, Bounded) and isinstance(app.app, InstanceFront):
            front = app.app
            return cls(app.untouched, front.route, front.serve, front.remembered, front.again, front.mints,
                       front.instance_listener)
        return None


class Shared:
    """The serving process's state every connection reads: app, fast path, limits, open connections."""

    def __init__(self, app: Any, settings: Settings, loop: asyncio.AbstractEventLoop) -> None:
        http = settings.http
        self.loop = loop
        self.app = app
        self.fast = FastPath.of(app)
        self.max_header_bytes = http.max_header_bytes
        self.header_timeout = http.header_timeout
        self.idle_timeout = min(http.keepalive_timeout, http.header_timeout)  # between keep-alive requests
        self.logger = logging.getLogger("imds.front")
        self.date = DateLine()
        self.default_headers: list[tuple[bytes, bytes]] = []  # the date, for answers the ASGI app makes
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # requests that went on in a task, and ASGI requests
        self.stopping = False
        self.drained = asyncio.Event()  # set when stopping and the last connection has closed
        self.now = loop.time()  # the loop's clock at the last tick: what idle deadlines count from
        self._listeners: dict[tuple[str, int], bool] = {}  # local address -> instance_listener (a few)
        self.redate()

    def redate(self) -> None:
        """Refresh the ``date`` header (once a second is enough: its resolution is a second)."""
        value = formatdate(usegmt=True).encode()
        self.date.line = b"date: " + value + b"\r\n"
        self.default_headers = [(b"date", value)]

    def instance_listener(self, server: tuple[str, int]) -> bool:
        """Whether connections accepted on local address ``server`` carry instance requests (remembered)."""
        known = self._listeners.get(server)
        if known is None:
            known = self._listeners[server] = self.fast is not None and self.fast.instance_listener(server)
        return known

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a reference to ``task`` until it is done (so it is neither collected nor forgotten at stop)."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def closed(self, connection: Connection) -> None:
        """A connection ended: forget it; the last one while stopping sets ``drained``."""
        self.connections.discard(connection)
        if self.stopping and not self.connections:
            self.drained.set()
