"""Raw HTTP/1.1 over real sockets, for tests that need to see the wire: pipelining, split heads, framing."""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass, field

TIMEOUT = 15.0  # seconds a read may wait: generous, CI is a loaded 2-core box


@dataclass
class Answer:
    """One HTTP response as it came over the wire."""

    version: bytes
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """A header's value (names compared in lower case), or None."""
        return self.headers.get(name.lower())


def connect(port: int, host: str = "127.0.0.1", source: str | None = None) -> socket.socket:
    """A connected socket (from ``source`` when given) with a generous read timeout."""
    sock = socket.create_connection((host, port), timeout=TIMEOUT, source_address=(source, 0) if source else None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request(method: str, path: str, *headers: str, version: str = "HTTP/1.1", body: bytes = b"") -> bytes:
    """A request's bytes: ``Host`` first, then ``headers`` (``"Name: value"``), then ``body``."""
    lines = [f"{method} {path} {version}", "Host: 169.254.169.254", *headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Reader:
    """Reads responses off a socket one at a time (a HEAD response has no body, whatever its length says)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def answer(self, *, head: bool = False) -> Answer:
        """The next response; AssertionError if the connection ends before it is whole."""
        while b"\r\n\r\n" not in self.buffer:
            assert self._more(), f"connection closed before a whole head: {self.buffer[:200]!r}"
        raw, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = raw.split(b"\r\n")
        version, status, *_ = status_line.split(b" ", 2)
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            assert name.lower() not in headers, f"header {name} twice"
            headers[name.lower()] = value.strip()
        length = 0 if head or int(status) in {204, 304} else int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            assert self._more(), "connection closed before the whole body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Answer(version, int(status), headers, body)

    def closed(self) -> bool:
        """Whether the server closes the connection (EOF or reset) before sending anything more."""
        try:
            return not self._more() and not self.buffer
        except ConnectionResetError:
            return not self.buffer


def drip(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` one byte per send (TCP_NODELAY: each leaves on its own; the kernel may still join some).

    What arrives in pieces is parsed whole; a head fed strictly one byte per read is tested where
    the bytes are handed over by hand (tests/unit/cli/test_front_connection.py).
    """
    for byte in data:
        sock.sendall(bytes([byte]))


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send what the server takes; it may close the connection midway (that is sometimes the point)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)
