"""A connection's transport before the event loop has it: what is written is kept, a close is noted.

A client that connects to ask one thing (cloud-init, a boot storm: a new connection per
request, ``Connection: close``) has usually sent it by the time it is accepted. The
listener reads it at once (``imds.cli.front.listener``) and the connection parses and
answers it on a ``Held`` transport. If that answer is whole and ends the connection, the
listener sends it on the socket and closes it: the event loop never makes a transport
for it (its set-up, registration and teardown were most of the server's cost per such
request). Otherwise the socket goes to the loop as usual, and once the loop's transport
is made the ``Held`` one hands it what it kept (the bytes, then a pause, close or abort)
and forwards every later call to it, for what still holds it (an ASGI request cycle begun
meanwhile, ``FlowControl``).
"""

from __future__ import annotations

import asyncio
from typing import Any


class Held:
    """Stands in for an ``asyncio.Transport`` until ``attach`` gives it the loop's."""

    __slots__ = ("aborted", "closed", "data", "paused", "real")

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.paused = False
        self.real: asyncio.Transport | None = None

    def write(self, data: bytes) -> None:
        if self.real is not None:
            self.real.write(data)
        elif data:
            self.data.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.write(part)

    def close(self) -> None:
        if self.real is not None:
            self.real.close()
        self.closed = True

    def abort(self) -> None:
        if self.real is not None:
            self.real.abort()
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.real.is_closing() if self.real is not None else self.closed

    def pause_reading(self) -> None:
        if self.real is not None:
            self.real.pause_reading()
        self.paused = True

    def resume_reading(self) -> None:
        if self.real is not None:
            self.real.resume_reading()
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.real.get_extra_info(name, default) if self.real is not None else default

    def take(self) -> bytes:
        """What was written so far, as one piece (and no longer kept)."""
        data, self.data = b"".join(self.data), []
        return data

    def attach(self, real: asyncio.Transport) -> None:
        """The loop's transport exists: hand it what was kept, and forward to it from now on."""
        self.real = real
        if self.aborted:
            real.abort()
            return
        if self.data:
            real.write(self.take())
        if self.closed:
            real.close()
        elif self.paused:
            real.pause_reading()
