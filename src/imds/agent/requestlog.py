"""haproxy's request log, re-emitted through the agent's own structured log.

The agent makes a datagram socket pair; haproxy inherits one end (``log fd@N``, written
non-blocking: a full socket drops lines, never a request) and the agent reads the other in a
thread of its own, so a slow resync never holds haproxy up. Each request is one JSON line
(``imds.agent.haproxy.LOG_FORMAT``) and becomes one ``haproxy.request`` event with the
VM's port, instance id, tenant, method, path (no query string), status, bytes and timings.
Anything else haproxy says there (a proxy stopping on reload) becomes ``haproxy.message``.

Usage::

    requests = RequestLog(log.get("agent"))
    Haproxy(binary, state, secret, log_fd=requests.haproxy_end)
    requests.start()   # ... requests.stop() when the agent stops
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any

import structlog

SEND_BUFFER = 4 << 20  # bytes queued for the agent before haproxy drops lines (a few thousand)
SO_SNDBUFFORCE = 32  # Linux's <asm-generic/socket.h>; Python's socket module does not name it
_NUMBERS = ("status", "bytes", "request_ms", "connect_ms", "response_ms", "total_ms")
_TEXT_MAX = 512


def parse(line: bytes) -> tuple[str, dict[str, Any]]:
    """(event, fields) for one datagram: a request line, or any other text haproxy logged."""
    text = line.decode("utf-8", "replace").rstrip("\n")
    try:
        fields = json.loads(text)
    except ValueError:
        fields = None
    if not isinstance(fields, dict) or "status" not in fields:
        return "haproxy.message", {"text": text[:_TEXT_MAX]}
    found: dict[str, Any] = {}
    for key, value in fields.items():
        if value in ("", "-", None):
            continue  # a field haproxy had nothing for (no backend, no port, no TLS error)
        found[key] = value if key not in _NUMBERS or not isinstance(value, int) or value >= 0 else None
    return "haproxy.request", {k: v for k, v in found.items() if v is not None}


class RequestLog:
    """The socket pair and the thread re-emitting what haproxy writes into it."""

    def __init__(self, logger: structlog.typing.FilteringBoundLogger) -> None:
        self._log = logger
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):  # SO_SNDBUFFORCE needs CAP_NET_ADMIN; the default buffer still works
            self._theirs.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, SEND_BUFFER)
        self._theirs.set_inheritable(True)
        self._thread: threading.Thread | None = None

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
                line = self._ours.recv(65536)
            except OSError:
                return
            if not line:
                return
            event, fields = parse(line)
            self._log.info(event, **fields)

    def stop(self) -> None:
        """Stop reading (haproxy is gone by now) and close both ends."""
        with contextlib.suppress(OSError):
            self._ours.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._ours.close()
        self._theirs.close()
