"""imds's own HTTP/1.1 front (``--server front``, the default): uvloop and httptools, no ASGI hand-off for reads.

The instance reads (every flavor's GET and HEAD answered from the catalog) and the bodiless
IMDSv2 token PUT are answered in the connection's parser callback by the same
``InstanceFront.serve`` coroutine the ASGI entry point runs (``imds.cli.front.connection``);
everything else (admin API, writes, requests with a body, ``/docs``, ``/ui``) is handed to
the ASGI app, unchanged, as uvicorn's request cycle would, on the same port and in the
same process. Why one process and one port: both kinds share the catalog, the change feed
and the per-caller limits in memory, and guests and operators reach the same address as
with granian or uvicorn (docs/server.md).

``run`` (what ``imds.cli.servers.serve_front`` runs) runs the app's lifespan (uvicorn's
``LifespanOn``), accepts on every socket (``imds.cli.front.listener``: ``--max-connections``
per listener), ticks once a second (the ``date`` header; header and keep-alive deadlines, checked every 0.25 s;
what survived a full garbage collection frozen, ``imds.cli.front.heap``) and on
SIGINT/SIGTERM stops accepting, lets the answers under way finish (at most
``--shutdown-timeout``), runs the lifespan shutdown and returns.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import Any

import click
import uvicorn
from uvicorn.lifespan.on import LifespanOn

from imds import log
from imds.cli.front.heap import Heap
from imds.cli.front.listener import Listener
from imds.cli.front.shared import Shared
from imds.cli.tally import Tally
from imds.config import Settings

_log = log.get("serve")
TICK = 0.25  # seconds between deadline checks (the header and keep-alive timeouts are this precise)


async def run(app: Any, sockets: list[socket.socket], settings: Settings, counts: Tally | None = None) -> None:
    """Serve ``app`` on ``sockets`` until SIGINT/SIGTERM; the answers under way finish first.

    ``counts``: where the instance listeners' connections are counted per source, for the
    connection warden (``imds.cli.tally``); the admin-only listeners (last) are not counted.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    lifespan = LifespanOn(uvicorn.Config(app, lifespan="on", log_config=None, proxy_headers=False))
    await lifespan.startup()
    if lifespan.should_exit:
        raise click.ClickException("imds did not start; see the log above")
    shared = Shared(app, settings, loop)
    instances = len(sockets) - len(settings.http.admin_listen)
    listeners = [Listener(shared, sock, settings.http.max_connections, counts if index < instances else None)
                 for index, sock in enumerate(sockets)]
    for listener in listeners:
        listener.start()
    heap = Heap(loop.time)
    heap.start()
    ticking = loop.create_task(_tick(shared, heap))
    await stop.wait()
    _log.info("stopping", in_flight_grace=settings.http.shutdown_timeout)
    for listener in listeners:
        listener.stop()
    await _drain(shared, settings.http.shutdown_timeout)
    ticking.cancel()
    heap.stop()
    await lifespan.shutdown()


async def _tick(shared: Shared, heap: Heap) -> None:
    """The ``date`` header once a second; connections past their head or idle deadline closed; the heap frozen."""
    ticks = 0
    while True:
        await asyncio.sleep(TICK)
        heap.tick()
        ticks += 1
        if ticks % round(1 / TICK) == 0:
            shared.redate()
        shared.now = now = shared.loop.time()
        for connection in list(shared.connections):
            connection.expired(now)


async def _drain(shared: Shared, grace: float) -> None:
    """Close the idle connections, let the rest finish their answer (at most ``grace`` s), then cut them."""
    shared.stopping = True
    for connection in list(shared.connections):
        connection.shutdown()
    if shared.connections:
        try:
            await asyncio.wait_for(shared.drained.wait(), grace)
        except TimeoutError:
            _log.warning("stop.timeout", seconds=grace, connections=len(shared.connections))
    for task in list(shared.tasks):
        task.cancel()
    for connection in list(shared.connections):
        if connection.transport is not None:
            connection.transport.abort()
    if shared.tasks:
        await asyncio.wait(list(shared.tasks), timeout=1.0)
