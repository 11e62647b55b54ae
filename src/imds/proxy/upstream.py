"""A small keep-alive HTTP/1.1 client for ``imds proxy``'s one upstream, plain or TLS.

Why not httpx: on this hot path httpx cost ~2.3 ms per sequential request against a
local ``imds serve`` where a bare asyncio stream took ~0.3 ms (the proxy then served ~330
req/s on one connection). This client does only what the proxy needs: one origin, plain
HTTP/1.1, a pool of idle keep-alive connections (TCP_NODELAY), the request written in one
go, the response parsed by ``httptools`` (the parser uvicorn uses) and streamed back.

A request that fails on a *reused* connection before any response byte arrived (the
upstream closed it while idle) is retried once on a fresh connection: the upstream never
saw it. Any other failure is ``UpstreamFailed``. Only the connect has a bound here
(``connect_timeout``, then ``UpstreamFailed``): how long the whole exchange may take is the
caller's deadline (``imds.proxy.forward`` wraps the request and the streamed body in one
``asyncio.timeout``), so a slow upstream cannot stretch it read by read.

An ``https://`` upstream is reached through an ``ssl.SSLContext`` (``tls_context``: a
private CA, a client certificate for mutual TLS, or no verification at all when asked
explicitly). A handshake that fails (an unknown CA, a name that does not match, a client
certificate the server refuses) is ``UpstreamFailed`` naming the TLS reason, before any
byte of a request is sent or of an answer passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httptools

from imds.errors import ConfigError

_CHUNK = 64 * 1024


class UpstreamFailed(Exception):
    """The upstream could not be reached, or broke the connection."""


def tls_context(
    *, ca_file: Path | None = None, cert_file: Path | None = None, key_file: Path | None = None,
    insecure: bool = False,
) -> ssl.SSLContext:
    """The client context for an https:// upstream; ConfigError naming the file that does not load.

    Verification against ``ca_file`` (else the system's CAs) and the upstream's host name,
    unless ``insecure``; the client certificate ``cert_file`` with ``key_file`` when given.
    """
    try:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (ssl.SSLError, OSError) as exc:
        msg = f"--upstream-ca-file: cannot load {ca_file}: {_reason(exc)}"
        raise ConfigError(msg) from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        try:
            context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        except (ssl.SSLError, OSError) as exc:
            msg = f"--upstream-cert-file / --upstream-key-file: cannot load {cert_file}: {_reason(exc)}"
            raise ConfigError(msg) from exc
    return context


def _reason(exc: BaseException) -> str:
    """What went wrong, in OpenSSL's words when it is a TLS error (``certificate verify failed: ...``)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):  # OpenSSL's reason code, as its own text spells it
        return exc.reason.replace("_", " ").lower() if exc.reason else str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def _failed(what: str, exc: BaseException) -> UpstreamFailed:
    prefix = "TLS with the upstream failed" if isinstance(exc, ssl.SSLError) else what
    return UpstreamFailed(f"{prefix}: {_reason(exc)}")


@dataclass
class _Parsed:
    """httptools callbacks: what has arrived of one response so far."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)
    headers_done: bool = False
    done: bool = False
    keep_alive: bool = False
    parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        # Asked here: once the message is complete the parser has reset and says False.
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()
        self.done = True


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, reused: bool = False) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = reused

    def close(self) -> None:
        self.writer.close()


class Response:
    """An upstream answer: status and headers now, the body streamed by ``chunks``."""

    def __init__(
        self,
        pool: UpstreamPool,
        conn: _Connection,
        parser: httptools.HttpResponseParser,
        parsed: _Parsed,
        *,
        head: bool,
    ) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._parser = parser
        self._parsed = parsed
        self._head = head
        self.status = parser.get_status_code()
        self.headers = parsed.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; the connection goes back to the pool when it is complete."""
        parsed, conn = self._parsed, self._conn
        assert conn is not None  # noqa: S101 - chunks() is consumed once
        try:
            while True:
                if parsed.body:
                    pending, parsed.body[:] = list(parsed.body), []
                    for piece in pending:
                        yield piece
                if parsed.done or self._head:
                    break
                await self._more(conn)
        except BaseException:
            self.close()
            raise
        self._conn = None
        self._pool.release(conn, keep=self._parsed.keep_alive and not self._head)

    async def _more(self, conn: _Connection) -> None:
        data = await self._pool.read(conn)
        if not data:
            raise UpstreamFailed("upstream closed the connection mid-answer")
        _feed(self._parser, data)

    def close(self) -> None:
        """Drop the connection (an answer not read to its end cannot be reused)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _feed(parser: httptools.HttpResponseParser, data: bytes) -> None:
    try:
        parser.feed_data(data)
    except httptools.HttpParserError as exc:
        msg = f"upstream sent invalid HTTP: {exc}"
        raise UpstreamFailed(msg) from exc


class UpstreamPool:
    """Keep-alive connections to one ``http(s)://host:port`` (at most ``size`` kept idle).

    ``tls``: the context for an https:// upstream (default: ``tls_context()``, the system's CAs).
    """

    def __init__(
        self, url: str, *, size: int = 64, connect_timeout: float = 2.0, tls: ssl.SSLContext | None = None
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            msg = f"--upstream {url!r}: only http://HOST[:PORT] or https://HOST[:PORT] is supported"
            raise ConfigError(msg)
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = (tls or tls_context()) if parts.scheme == "https" else None
        self._authority = (f"[{self.host}]" if ":" in self.host else self.host) + (
            f":{parts.port}" if parts.port else ""
        )
        self.prefix = parts.path.rstrip("/").encode()
        self._size = size
        self._connect_timeout = connect_timeout
        self._idle: deque[_Connection] = deque()

    async def request(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes | None
    ) -> Response:
        """Send one request; the answer's status and headers (the body via ``Response.chunks``)."""
        lines = [f"{method} ".encode() + self.prefix + target + b" HTTP/1.1", b"host: " + self._authority.encode()]
        lines += [name + b": " + value for name, value in headers]
        if body is not None:
            lines.append(b"content-length: " + str(len(body)).encode())
        payload = b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")
        head = method == "HEAD"
        for _attempt in range(2):
            conn = await self._acquire()
            try:
                return await self._exchange(conn, payload, head=head)
            except _StaleConnection:
                conn.close()
                continue
            except BaseException:
                conn.close()
                raise
        raise UpstreamFailed("upstream closed two connections in a row")

    async def _exchange(self, conn: _Connection, payload: bytes, *, head: bool) -> Response:
        parsed = _Parsed()
        parser = parsed.parser = httptools.HttpResponseParser(parsed)
        try:
            conn.writer.write(payload)
            await conn.writer.drain()
        except (ConnectionError, OSError) as exc:
            if conn.reused:
                raise _StaleConnection from exc
            raise _failed("upstream connection failed", exc) from exc
        received = False
        while not parsed.headers_done:
            try:
                data = await self.read(conn)
            except UpstreamFailed as exc:
                if conn.reused and not received:
                    raise _StaleConnection from exc
                raise
            if not data:
                if conn.reused and not received:
                    raise _StaleConnection
                raise UpstreamFailed("upstream closed the connection before answering")
            received = True
            _feed(parser, data)
        return Response(self, conn, parser, parsed, head=head)

    async def read(self, conn: _Connection) -> bytes:
        """The next bytes from the upstream (b"" at EOF); no bound of its own (the caller's deadline is)."""
        try:
            return await conn.reader.read(_CHUNK)
        except (ConnectionError, OSError) as exc:  # ssl.SSLError too: a TLS alert after the handshake
            raise _failed("upstream connection failed", exc) from exc

    async def _acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                conn.reused = True
                return conn
            conn.close()
        try:
            async with asyncio.timeout(self._connect_timeout):  # the TLS handshake included
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self._tls, server_hostname=self.host if self._tls else None
                )
        except TimeoutError as exc:
            msg = f"could not connect to the upstream within {self._connect_timeout:g} s"
            raise UpstreamFailed(msg) from exc
        except OSError as exc:  # ssl.SSLError too: an unknown CA, a wrong name, a refused client certificate
            raise _failed("cannot connect to the upstream", exc) from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer)

    def release(self, conn: _Connection, *, keep: bool) -> None:
        """Return a connection whose answer was read to the end."""
        if keep and len(self._idle) < self._size and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        """Close every idle connection."""
        while self._idle:
            conn = self._idle.pop()
            conn.close()
            with contextlib.suppress(Exception):
                await conn.writer.wait_closed()


class _StaleConnection(Exception):
    """A reused connection failed before any response byte: safe to retry on a fresh one."""
