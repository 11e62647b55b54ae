"""The Unix socket Ganeti's node daemon talks to, with Luxi framing, as ``ganeti-metad`` offers it.

A message is a JSON object followed by the byte 0x03: ``{"method", "args"}`` in,
``{"success", "result"}`` out, several per connection (Ganeti's ``rpc.transport``). On a
failed call ``result`` is ``["GenericError", [message]]``, which Ganeti's client raises as
``errors.GenericError``; a request that cannot be parsed gets the message alone, as metad
answers. A message without its 0x03 before the peer closes gets an error answer; one over
``--max-body-bytes`` gets an error answer and the connection is closed (the rest is never
read). Nothing is stored for a refused call, and the server keeps serving.

The socket is created mode 0600 (bound, chmod-ed, then listened on, so no connection is
accepted before the mode is set); a stale socket file at the path is replaced, as metad does,
anything else there is refused. It serves while ``imds serve`` runs, in the one worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from imds import log
from imds.errors import ConfigError, ImdsError, InvalidInput
from imds.metad.methods import Methods
from imds.services import Services
from imds.services.records.wire import loads_strict

EOM = b"\x03"  # Ganeti's LUXI_EOM
READ_TIMEOUT = 60.0  # seconds a connection may stay silent (metad's recvTmo)
FLAG = "--ganeti-metad-socket / IMDS_GANETI_METAD_SOCKET"
_log = log.get("metad")


def _framed(success: bool, result: Any) -> bytes:
    message = {"success": success, "result": result}
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    try:
        return body.encode() + EOM  # json escapes every control character, 0x03 included
    except UnicodeEncodeError:  # a lone surrogate (echo("\udc80")): JSON's own escape carries it back as sent
        return json.dumps(message, separators=(",", ":")).encode() + EOM


def answer(result: Any) -> bytes:
    """A framed successful answer."""
    return _framed(True, result)  # noqa: FBT003 - Luxi's pair


def refusal(result: Any) -> bytes:
    """A framed failed answer."""
    return _framed(False, result)  # noqa: FBT003 - Luxi's pair


def error_text(exc: ImdsError) -> str:
    """What a refused call says: every problem (field first when it has one), never a value."""
    if isinstance(exc, InvalidInput):
        return "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in exc.problems)
    return exc.message


def parse_request(raw: bytes) -> tuple[str, list[Any]]:
    """``{"method": STRING, "args": LIST}``, or InvalidInput saying what is wrong."""
    request = loads_strict(raw, "request")
    if not isinstance(request, dict):
        raise InvalidInput.one("request", "must be a JSON object")
    for key in ("method", "args"):
        if key not in request:
            raise InvalidInput.one("request", f"key {key!r} not found")
    method, args = request["method"], request["args"]
    if not isinstance(method, str) or not isinstance(args, list):
        raise InvalidInput.one("request", "method must be a string and args a list")
    return method, args


class LuxiServer:
    """Reads framed requests, answers each through ``Methods``."""

    def __init__(self, methods: Methods, *, max_bytes: int) -> None:
        self._methods = methods
        self.max_bytes = max_bytes
        self._connections: set[asyncio.StreamWriter] = set()

    async def respond(self, raw: bytes) -> bytes:
        """The framed answer to one request (without its 0x03).

        The JSON and the call's checks run in a worker thread: a large push (up to
        ``--max-body-bytes``) or a flood of them never holds the event loop, which serves
        every HTTP request of this process.
        """
        try:
            method, args = await asyncio.to_thread(parse_request, raw)
        except InvalidInput as exc:
            return refusal(f"Failed to parse request: {error_text(exc)}")
        try:
            prepared = await asyncio.to_thread(self._methods.prepare, method, args)
            return answer(await self._methods.run(prepared))
        except ImdsError as exc:
            _log.warning("metad.refused", method=method[:64], problem=error_text(exc))
            return refusal(["GenericError", [error_text(exc)]])
        except Exception:  # noqa: BLE001 - one bad call must not stop the server; logged with its traceback
            _log.exception("metad.failed", method=method[:64])
            return refusal(["GenericError", ["internal error: see imds's log"]])

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection until the peer closes, goes silent or oversteps the size cap."""
        self._connections.add(writer)
        try:
            while (raw := await self._next(reader, writer)) is not None:
                writer.write(await self.respond(raw))
                await writer.drain()
        except (ConnectionError, TimeoutError):
            pass
        finally:
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _next(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
        """The next request without its 0x03; None once the connection is to be closed."""
        try:
            return (await asyncio.wait_for(reader.readuntil(EOM), READ_TIMEOUT))[:-1]
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                writer.write(refusal("message ended without its 0x03 terminator"))
                await writer.drain()
            return None
        except asyncio.LimitOverrunError:
            _log.warning("metad.too_large", limit=self.max_bytes)
            writer.write(refusal(f"message larger than {self.max_bytes} bytes (--max-body-bytes)"))
            await writer.drain()
            return None

    def close_connections(self) -> None:
        """Close every open connection (at shutdown)."""
        for writer in list(self._connections):
            writer.close()


def bind(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600; a stale socket there is replaced."""
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
        else:
            msg = f"{FLAG}: {path} exists and is not a socket"
            raise ConfigError(msg)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        path.chmod(0o600)  # before listen(): nothing can connect while the mode is still the umask's
        sock.listen(64)
    except OSError as exc:
        sock.close()
        msg = f"{FLAG}: cannot listen on {path}: {exc.strerror or exc}"
        raise ConfigError(msg) from exc
    return sock


@contextlib.asynccontextmanager
async def serving(services: Services) -> AsyncIterator[LuxiServer | None]:
    """Serve ``--ganeti-metad-socket`` (when set) for the duration of the block, then remove it."""
    path = services.settings.ganeti.ganeti_metad_socket
    if path is None:
        yield None
        return
    luxi = LuxiServer(Methods(services), max_bytes=services.settings.limits.max_body_bytes)
    # The stream limit is the size cap: readuntil() refuses a longer message without buffering it all.
    server = await asyncio.start_unix_server(luxi.connection, sock=bind(path), limit=luxi.max_bytes + 1)
    _log.info("metad.listening", socket=str(path), max_bytes=luxi.max_bytes)
    try:
        yield luxi
    finally:
        server.close()
        luxi.close_connections()
        await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
