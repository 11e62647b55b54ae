"""Accepting on one listening socket, at most ``--max-connections`` open at once (per listener and worker).

asyncio servers accept whatever arrives; granian stops accepting at its cap and lets the
rest wait in the kernel's backlog, which the hostile-input suite relies on (connections
over the cap cost the process nothing). So the front accepts itself: the listening
socket is watched for readability, each accepted socket is handed to the event loop as a
``Connection`` (``loop.connect_accepted_socket``), and at the cap the socket is no longer
watched until a connection closes. An instance listener counts its connections per source
in the warden's tally (``imds.cli.tally``) as they open and close; one answered and closed
at its accept (``_answer_early``) never held a slot the warden could take back and is not
counted. Accept errors such as ``EMFILE`` (the open-files limit) pause accepting for a
moment rather than spin on a readable socket.

What one accept costs is most of what a boot storm (a new connection per request) costs:
the accepted socket is a bare ``_socket.socket`` (no ``socket.socket`` made and closed in
Python), read and written with ``MSG_DONTWAIT`` (no system call to make it non-blocking
unless it goes to the loop) and closed once its answer is sent.
"""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import errno
import ipaddress
import socket
from typing import Any, cast

from imds.cli.front import eager
from imds.cli.front.connection import Connection
from imds.cli.front.held import Held
from imds.cli.front.shared import Shared
from imds.cli.tally import Tally

ACCEPT_BATCH = 64  # connections taken per wake-up before others on the loop get a turn
EARLY_BYTES = 65536  # what is read at once from a connection just accepted
BACKOFF = 0.2  # seconds without accepting after the process ran out of files or memory
_OUT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_DONTWAIT = socket.MSG_DONTWAIT  # the accepted socket stays blocking until the loop has it: each call says so


def _address(address: Any) -> tuple[str, int]:
    """(host, port) of a socket address (IPv6 ones have four fields)."""
    return str(address[0]), int(address[1])


class _Accepted(socket.socket):
    """An accepted connection's socket whose ``family`` and ``type`` are plain ints.

    ``socket.socket`` turns both into enum members on every read (a Python-level enum
    lookup); the event loop reads them for each connection it adopts, and under a boot
    storm (a new connection per request) that was a tenth of the server's time.
    """

    __slots__ = ()

    @property
    def family(self) -> int:  # type: ignore[override] # an int: the loop compares it to ints
        return int(_socket.socket.family.__get__(self))

    @property
    def type(self) -> int:  # type: ignore[override]
        return int(_socket.socket.type.__get__(self))


class Listener:
    """Accepts connections on ``sock`` for ``shared``, up to ``cap`` open at once."""

    def __init__(self, shared: Shared, sock: socket.socket, cap: int, tally: Tally | None = None) -> None:
        self.shared = shared
        self.sock = sock
        self.cap = cap
        self.tally = tally
        self._kind = (int(sock.family), int(sock.type), sock.proto)  # what each accepted socket is made with
        host, port = _address(sock.getsockname())
        # The local address of every connection, unless bound to a wildcard (then each has its own).
        self._server = None if ipaddress.ip_address(host.split("%", 1)[0]).is_unspecified else (host, port)
        self.open = 0
        self._watching = False
        self._stopped = False

    def start(self) -> None:
        """Begin accepting."""
        self.sock.setblocking(False)  # noqa: FBT003 - socket's own API
        self._watch()

    def stop(self) -> None:
        """Accept no more (the socket stays open: other workers may share it)."""
        self._stopped = True
        self._unwatch()

    def _watch(self) -> None:
        if not self._watching and not self._stopped and self.open < self.cap:
            self.shared.loop.add_reader(self.sock.fileno(), self._accept)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self.shared.loop.remove_reader(self.sock.fileno())
            self._watching = False

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            if self.open >= self.cap:
                self._unwatch()  # the rest wait in the kernel's backlog until a connection closes
                return
            try:
                fd, address = self.sock._accept()  # type: ignore[attr-defined] # noqa: SLF001 - accept() less its enums
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF:
                    # No traceback: the errno says it all (and repeats are throttled, servers.OncePerInterval).
                    self.shared.logger.error("accept failed: %s; pausing %.1fs", exc.strerror, BACKOFF)  # noqa: TRY400
                    self._unwatch()
                    self.shared.loop.call_later(BACKOFF, self._watch)
                    return
                continue  # the client gave up before we accepted (ECONNABORTED...): next
            self.open += 1
            # (host, port): an IPv4 address as it comes, an IPv6 one less its flow info and scope
            self._adopt(_socket.socket(*self._kind, fd), address if len(address) == 2 else address[:2])

    def _adopt(self, raw: _socket.socket, client: tuple[str, int]) -> None:
        """Answer what an accepted socket brought, or hand it to the loop with a ``Connection`` on it."""
        server = self._server
        if server is None:  # bound to a wildcard: the local address is the connection's own
            try:
                server = _address(raw.getsockname())
            except OSError:  # already reset by the client
                raw.close()
                self.release()
                return
        connection = Connection(self.shared, self.release, client, server)
        # A client that connects to ask one thing has usually sent it by now: read it here and answer
        # it on a Held transport; an answer that ends the connection goes out without the loop's.
        if self._answer_early(raw, connection):
            return
        if self.tally is not None:  # it outlives its accept: counted until it closes
            self.tally.opened(client[0])
            connection.tally = self.tally  # it says when it closes
        connection.outlives_accept()
        conn = _Accepted(*self._kind, fileno=raw.detach())
        conn.setblocking(False)  # noqa: FBT003 - socket's own API

        def failed(_exc: BaseException) -> None:
            with contextlib.suppress(OSError):
                conn.close()
            if connection.transport is None:  # never connected: its slot (and count) is given back here
                self.release()
                if connection.tally is not None:
                    connection.tally.closed(client[0])
            elif isinstance(connection.transport, Held):  # made on its Held transport only: lost here
                connection.connection_lost(None)

        loop = self.shared.loop
        eager.drive(loop.connect_accepted_socket(lambda: connection, conn), loop, failed)

    def _answer_early(self, raw: _socket.socket, connection: Connection) -> bool:
        """Answer what the client sent with its connection on a Held transport; True if that ended it."""
        try:
            early = raw.recv(EARLY_BYTES, _DONTWAIT)
        except (BlockingIOError, InterruptedError, ConnectionError):
            return False
        if not early:
            return False
        connection.connection_made(cast("asyncio.Transport", Held()))
        try:
            connection.data_received(early)
        except Exception:  # a bug (the connection answers its own errors): this one goes, never the listener
            self.shared.logger.exception("front.early_failed")
            raw.close()
            connection.connection_lost(None)
            return True
        return len(early) < EARLY_BYTES and connection.answered_early() and self._send_and_close(raw, connection)

    def _send_and_close(self, raw: _socket.socket, connection: Connection) -> bool:
        """Send a connection's whole answer and close it, no transport made; False if it did not all go.

        What the socket did not take now (a full send buffer) is left on the Held transport
        for the loop's, which then closes the connection.
        """
        held = cast("Held", connection.transport)
        data = held.take()
        try:
            sent = raw.send(data, _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # reset or gone: nobody left to answer
            sent = len(data)
        if sent < len(data):
            held.data.append(data[sent:])
            return False
        raw.close()
        connection.closed_at_accept()
        return True

    def release(self) -> None:
        """A connection of this listener closed: its slot is free."""
        self.open -= 1
        self._watch()
