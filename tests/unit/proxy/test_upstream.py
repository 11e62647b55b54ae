"""The proxy's upstream client against small real servers on loopback: reuse, retry, chunked, timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from imds.proxy.upstream import UpstreamFailed, UpstreamPool

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server on 127.0.0.1 running ``handler`` per connection; yields its URL and a connection counter."""
    connections: list[int] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    srv = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        srv.close()
        await srv.wait_closed()


async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int = 1000) -> None:
    for _ in range(limit):
        try:
            await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return
        writer.write(OK)
        await writer.drain()


async def body(pool: UpstreamPool, target: bytes = b"/x") -> tuple[int, bytes]:
    response = await pool.request("GET", target, [], None)
    return response.status, b"".join([chunk async for chunk in response.chunks()])


async def test_keep_alive_reuses_one_connection():
    async with server(answer_each) as (url, connections):
        pool = UpstreamPool(url)
        for _ in range(5):
            assert await body(pool) == (200, b"ok")
        await pool.aclose()
    assert len(connections) == 1


async def test_a_connection_closed_while_idle_is_retried_on_a_fresh_one():
    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_each(reader, writer, limit=1)

    async with server(one_then_close) as (url, connections):
        pool = UpstreamPool(url)
        assert await body(pool) == (200, b"ok")
        await asyncio.sleep(0)  # let the server's close reach us (the retry covers it either way)
        assert await body(pool) == (200, b"ok")
        await pool.aclose()
    assert len(connections) == 2


async def test_chunked_answers_stream_and_the_request_carries_host_and_body():
    seen: list[bytes] = []

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head + await reader.readexactly(3))
        writer.write(b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\nx-a: b\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        writer.write(b"2\r\nde\r\n0\r\n\r\n")
        await writer.drain()

    async with server(chunked) as (url, _):
        pool = UpstreamPool(url + "/base")
        response = await pool.request("POST", b"/p?q=1", [(b"x-instance-id", b"i")], b"pwd")
        assert (response.status, (b"x-a", b"b") in response.headers) == (201, True)
        assert b"".join([chunk async for chunk in response.chunks()]) == b"abcde"
        await pool.aclose()
    request = seen[0]
    assert request.startswith(b"POST /base/p?q=1 HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"x-instance-id: i\r\n" in request
    assert b"content-length: 3\r\n" in request
    assert request.endswith(b"pwd")


async def test_an_upstream_that_never_answers_is_ended_by_the_callers_deadline():
    """The pool has no per-read bound: the proxy's one deadline (an asyncio.timeout) ends it, connection dropped."""
    async def silent(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up

    async with server(silent) as (url, _):
        pool = UpstreamPool(url)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.request("GET", b"/", [], None)
        assert not pool._idle  # the cut connection is not kept for reuse
        await pool.aclose()


async def test_nothing_listening_is_upstream_failed():
    async with server(answer_each) as (url, _):
        pass  # closed: the port is free again
    with pytest.raises(UpstreamFailed, match="cannot connect"):
        await UpstreamPool(url).request("GET", b"/", [], None)
