"""The HTTP servers ``imds serve`` can run its app on, over sockets it bound itself.

The front (the default, ``imds.cli.front``) is imds's own HTTP/1.1 server on uvloop and
httptools: it answers instance reads without the ASGI hand-off and hands every other
request to the ASGI app as uvicorn would; every limit below holds on it (header bytes and
lines, header and keep-alive timeouts, connections per listener and worker).

granian (``--server granian``) serves each listening socket with one of its Rust workers inside
this process's event loop: it is given the socket's file descriptor, so TCP_NODELAY, the
hop limit and several ``--listen`` addresses (IPv4 and IPv6) work exactly as with
uvicorn. Its limits: ``--max-header-bytes`` (read buffer: larger heads get 431/close),
at most 100 header lines (hyper's fixed limit), ``--header-timeout`` (time to send a
request head, idle keep-alive included) and ``--max-connections`` (connections per
listener and worker: the rest wait in the kernel backlog). uvicorn stays available with
``--server uvicorn``; it has no header read timeout (see docs/server.md). Whichever runs,
``connection_budget`` runs the connection warden beside it (``--max-connections-per-source``,
``imds.cli.warden``): no server offers a per-source connection limit.

``--workers N`` forks N processes after binding; each runs the whole app (lifespan
included) on the shared sockets, and the parent forwards SIGINT/SIGTERM and exits 0 once
every worker has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import socket
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import click

from imds import log
from imds.cli import tally
from imds.cli.warden import Warden
from imds.config import Settings

_log = log.get("serve")
SERVER_LOGGERS = ("granian", "_granian", "asyncio", "uvicorn", "imds.front")
LOG_INTERVAL = 10.0


class OncePerInterval(logging.Filter):
    """Let one record per (logger, message) through per ``interval`` seconds from the server loggers.

    A flood of identical server errors ("Too many open files" on every accept) becomes one
    line per interval carrying how many were suppressed since the last one.
    """

    def __init__(self, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True to emit the record (first of its kind in this interval), False to drop it."""
        if not record.name.startswith(SERVER_LOGGERS):
            return True
        key = (record.name, str(record.msg))
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            record.msg = f"{record.msg} (and {suppressed} more like it in the last {self.interval:g}s)"
        return True


def quiet_server_floods(interval: float = LOG_INTERVAL) -> None:
    """Install ``OncePerInterval`` on the root handlers (where every server logger's records end)."""
    throttle = OncePerInterval(interval)
    for handler in logging.getLogger().handlers:
        handler.addFilter(throttle)


FD_RESERVE = 256  # files beside the connections: database, logs, keys, upstream clients


def raise_fd_limit(connections: int = 0) -> int:
    """Lift the soft open-files limit to the hard one; warn if it is under ``connections`` plus a reserve.

    The connection limits must bind before the fd limit: at the fd limit granian fails
    every accept, for everyone. Returns the soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft != resource.RLIM_INFINITY and soft < connections + FD_RESERVE:
        _log.warning("fd_limit.low", limit=soft, needed=connections + FD_RESERVE,
                     hint="raise LimitNOFILE (ulimit -n) or lower --max-connections")
    return soft


@contextlib.contextmanager
def connection_budget(
    app: Any, sockets: list[socket.socket], settings: Settings, counts: tally.Tally | None = None,
) -> Iterator[Warden]:
    """Run the per-source connection warden (``--max-connections-per-source``) while serving.

    Only the instance listeners are watched: ``sockets`` are the ``--listen`` ones, then the
    ``--admin-listen`` ones (``cli/serve.py``), and an admin-only listener's clients are
    operators, often all behind one TLS front. ``counts``: the server counts its instance
    connections per source there (the front), and the warden dumps only when they say so.
    """
    metrics = getattr(getattr(app, "services", None), "metrics", None)
    watched = sockets[: len(sockets) - len(settings.http.admin_listen)]
    warden = Warden(watched, settings.http.max_connections_per_source, settings.callers.trusted_proxy,
                    on_shut=metrics.connections_shut.inc if metrics is not None else lambda _n: None, tally=counts)
    warden.start()
    try:
        yield warden
    finally:
        warden.stop()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up, installed with uvicorn[standard]
    except ImportError:  # pragma: no cover - uvloop ships with the dependencies
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def serve_front(app: Any, sockets: list[socket.socket], settings: Settings) -> None:
    """Serve ``app`` on ``sockets`` with imds's own front until SIGINT/SIGTERM; in-flight requests finish first."""
    from imds.cli import front  # noqa: PLC0415 - the server stack loads only when serving

    counts = tally.shared() if settings.http.max_connections_per_source > 0 else None
    with connection_budget(app, sockets, settings, counts), asyncio.Runner(loop_factory=_new_loop) as runner:
        runner.run(front.run(app, sockets, settings, counts))


def serve_granian(app: Any, sockets: list[socket.socket], settings: Settings) -> None:
    """Serve ``app`` on ``sockets`` with granian until SIGINT/SIGTERM; in-flight requests finish first."""
    with connection_budget(app, sockets, settings), asyncio.Runner(loop_factory=_new_loop) as runner:
        runner.run(_granian_main(app, sockets, settings))


async def _granian_main(app: Any, sockets: list[socket.socket], settings: Settings) -> None:
    g = _granian()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    lifespan = g.LifespanProtocol(app)
    await lifespan.startup()
    if lifespan.interrupt:
        raise click.ClickException("imds did not start; see the log above")
    callback = g.future_watcher_wrapper(g.callback_wrapper(app, {}, lifespan.state, None))
    http1 = g.HTTP1Settings(
        header_read_timeout=int(settings.http.header_timeout * 1000),
        keep_alive=True,
        max_buffer_size=settings.http.max_header_bytes,
    )
    stopped: list[asyncio.Future[None]] = []
    signals = []
    for index, sock in enumerate(sockets):
        worker_signal = g.WorkerSignal()
        done: asyncio.Future[None] = loop.create_future()
        # granian calls this once the listener has stopped and its connections have drained.
        worker_signal.add_cb(lambda done=done: loop.call_soon_threadsafe(_resolve, done))
        worker = g.ASGIWorker(
            index + 1, (None, g.SocketHolder(sock.fileno(), False, 2048)), None,  # noqa: FBT003 - positional API
            1, 512, 1, 30, settings.http.max_connections, "1", http1, None, False, None,  # noqa: FBT003
            False, None, None, None, "tls13", None, [], False, (None, None),  # noqa: FBT003 - no TLS, no metrics
        )
        worker.serve_async(g.new_cbscheduler(loop, callback, impl_asyncio=True), loop, worker_signal)
        signals.append(worker_signal)
        stopped.append(done)
    await stop.wait()
    _log.info("stopping", in_flight_grace=settings.http.shutdown_timeout)
    for worker_signal in signals:
        worker_signal.set()
    try:
        await asyncio.wait_for(asyncio.gather(*stopped), settings.http.shutdown_timeout)
    except TimeoutError:
        _log.warning("stop.timeout", seconds=settings.http.shutdown_timeout)
    await lifespan.shutdown()


def _granian() -> Any:
    """The granian pieces its embedded server is made of (typed Any: its stubs lag its runtime).

    Imported here so ``imds --help`` and uvicorn runs never load granian. These are
    granian's internal names (checked against 2.8); tests/integration/test_serve_socket.py
    and tests/security/test_http_abuse.py fail loudly if an upgrade moves them.
    """
    from granian import _futures, _granian, asgi, http  # noqa: PLC0415

    return SimpleNamespace(
        ASGIWorker=_granian.ASGIWorker,
        SocketHolder=_granian.SocketHolder,
        WorkerSignal=_granian.WorkerSignal,
        LifespanProtocol=asgi.LifespanProtocol,
        callback_wrapper=asgi._callback_wrapper,  # noqa: SLF001 - see the docstring
        future_watcher_wrapper=_futures._future_watcher_wrapper,  # noqa: SLF001
        new_cbscheduler=_futures._new_cbscheduler,  # noqa: SLF001
        HTTP1Settings=http.HTTP1Settings,
    )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _exit_cleanly(_signum: int, _frame: object) -> None:
    """Exit 0 on a stop signal uvicorn is not handling (before it starts, or re-raised after it stopped)."""
    raise SystemExit(0)


def serve_uvicorn(app: Any, sockets: list[socket.socket], settings: Settings) -> None:
    """Serve ``app`` on ``sockets`` with uvicorn until SIGINT/SIGTERM."""
    import uvicorn  # noqa: PLC0415 - the server stack loads only when serving

    config = uvicorn.Config(
        app,
        lifespan="on",
        log_config=None,
        access_log=False,
        # The caller's address is a security decision imds makes itself (trusted proxies
        # only); uvicorn must not rewrite it from X-Forwarded-For.
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=int(settings.http.shutdown_timeout),
        timeout_keep_alive=max(1, round(settings.http.keepalive_timeout)),
        limit_concurrency=settings.http.max_connections * len(sockets),
        h11_max_incomplete_event_size=settings.http.max_header_bytes,
    )
    with connection_budget(app, sockets, settings):
        run_uvicorn(config, sockets, "imds")


def run_uvicorn(config: Any, sockets: list[socket.socket], name: str) -> None:
    """Serve ``config`` on ``sockets`` until SIGINT/SIGTERM; exit 0 after a graceful stop.

    uvicorn re-raises SIGINT/SIGTERM once it has shut down gracefully, which would end the
    process by that signal; the handler turns it into a clean exit with status 0.
    """
    import uvicorn  # noqa: PLC0415 - the server stack loads only when serving

    server = uvicorn.Server(config)
    previous = {sig: signal.signal(sig, _exit_cleanly) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        asyncio.run(server.serve(sockets=sockets))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise click.ClickException(f"{name} did not start; see the log above")


SERVERS: dict[str, Callable[[Any, list[socket.socket], Settings], None]] = {
    "front": serve_front,
    "granian": serve_granian,
    "uvicorn": serve_uvicorn,
}


def _worker_main(serve_one: Callable[[], None]) -> int:  # pragma: no cover - runs in a forked child
    """Run one worker; its exit status."""
    try:
        serve_one()
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except BaseException:
        logging.getLogger("imds").exception("worker failed")
        return 1
    return 0


def run_workers(count: int, serve_one: Callable[[], None]) -> None:
    """Fork ``count`` processes running ``serve_one``; forward SIGINT/SIGTERM; fail if any worker failed."""
    children: list[int] = []
    tally.prepare(count)  # the front's per-source connection counts, one row per worker
    for index in range(count):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            tally.shared().adopt_row(index)
            os._exit(_worker_main(serve_one))
        children.append(pid)

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    failed = 0
    try:
        running = set(children)
        while running:
            pid, status = os.wait()
            running.discard(pid)
            if os.waitstatus_to_exitcode(status) != 0:
                failed += 1
                forward(signal.SIGTERM, None)  # one worker down: stop the rest rather than serve half
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        msg = f"{failed} of {count} workers failed; see the log above"
        raise click.ClickException(msg)
