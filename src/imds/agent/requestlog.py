"""haproxy's request log, re-emitted as the agent's own structured log lines.

The agent makes a datagram socket pair; haproxy inherits one end (``log fd@N``, written
non-blocking: a full socket drops lines, never a request) and the agent reads the other in a
thread of its own, so a slow resync never holds haproxy up. Each request is one JSON object
(``imds.agent.haproxy.LOG_FORMAT``: the VM's port, instance id, tenant, method, path without
the query string, status, bytes and timings) and becomes one line of the agent's log, the
shape structlog gives every other line (``component``, ``event`` ``haproxy.request``,
``level``, ``timestamp``) written through structlog's own ``PrintLogger`` for stderr (so it
never interleaves with the agent's other lines). The object is not parsed and rendered again:
that cost the datapath a large share of its throughput (bench/results-datapath.md, 2026-11-28).
An empty string is a field haproxy had nothing for (no tenant, no TLS error, no instance for
an unknown source: haproxy's own ``-`` for those), ``-1`` a step that did not happen (no
connection to serve). Anything else haproxy says there (a proxy stopping on reload, a line
cut at ``LOG_LENGTH``) goes through structlog as ``haproxy.message``.

Usage::

    requests = RequestLog(log.get("agent"))
    Haproxy(binary, state, secret, log_fd=requests.haproxy_end)
    requests.start()   # ... requests.stop() when the agent stops
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import sys
import threading
from typing import Protocol

import structlog

SEND_BUFFER = 4 << 20  # bytes queued for the agent before haproxy drops lines (a few thousand)
SO_SNDBUFFORCE = 32  # Linux's <asm-generic/socket.h>; Python's socket module does not name it
_TEXT_MAX = 512
_REQUEST = b'{"port":'  # how LOG_FORMAT begins
_ABSENT = b'":"-"'  # a string field haproxy had no value for (it writes "-")


class Output(Protocol):
    """Where request lines go: ``structlog.PrintLogger`` (its ``msg`` writes one whole line under a lock)."""

    def msg(self, message: str) -> None:
        """Write one line."""


def request_line(datagram: bytes, now: dt.datetime, component: str = "agent") -> str | None:
    """The agent's log line for one request haproxy logged, or None when the datagram is not one.

    ``now`` is UTC; the timestamp is written as structlog's ``TimeStamper(fmt="iso", utc=True)``.
    """
    line = datagram.rstrip(b"\n")
    if not line.startswith(_REQUEST) or not line.endswith(b"}") or b"\n" in line:
        return None
    stamp = now.isoformat().replace("+00:00", "Z")
    head = f'{{"component":"{component}","event":"haproxy.request","level":"info","timestamp":"{stamp}",'
    # haproxy writes "-" for a sample it had nothing for; no field's real value is "-" (ids and
    # tenants begin with a letter or digit, a path with "/"), so each such "-" becomes "".
    return head + line[1:].replace(_ABSENT, b'":""').decode("utf-8", "replace")


class RequestLog:
    """The socket pair and the thread re-emitting what haproxy writes into it.

    ``out``: where request lines go (default: structlog's ``PrintLogger`` on stderr, as
    ``imds.log`` writes); ``enabled``: False when the log level is above ``info``.
    """

    def __init__(
        self, logger: structlog.typing.FilteringBoundLogger, *, out: Output | None = None, enabled: bool = True
    ) -> None:
        self._log = logger
        self._out = out if out is not None else structlog.PrintLogger(sys.stderr)
        self._enabled = enabled
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):  # SO_SNDBUFFORCE needs CAP_NET_ADMIN; the default buffer still works
            self._theirs.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, SEND_BUFFER)
        self._theirs.set_inheritable(True)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def haproxy_end(self) -> int:
        """The descriptor haproxy inherits and writes to (``log fd@N``)."""
        return self._theirs.fileno()

    def start(self) -> None:
        """Read and re-emit in a daemon thread until ``stop``."""
        self._thread = threading.Thread(target=self._pump, name="haproxy-log", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                datagram = self._ours.recv(65536)
            except OSError:
                return
            if not datagram:
                if self._stopping.is_set():
                    return
                continue  # an empty datagram: nothing to say
            line = request_line(datagram, dt.datetime.now(dt.UTC))
            if line is not None:
                if self._enabled:
                    self._out.msg(line)
            else:
                text = datagram.decode("utf-8", "replace").rstrip("\n")[:_TEXT_MAX]
                self._log.info("haproxy.message", text=text)

    def stop(self) -> None:
        """Stop reading (haproxy is gone by now) and close both ends."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._ours.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._ours.close()
        self._theirs.close()
