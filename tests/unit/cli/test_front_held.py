"""A connection answered before the loop has it (``imds.cli.front.held``), over real sockets.

The listener reads what a client sent with its connection, and the connection answers it
on a ``Held`` transport: an answer that ends the connection is sent and the socket
closed with no loop transport at all; anything else is handed to the loop's transport
when it is made, in order. The app is the real one (memory store, the demo instance at
127.0.0.1); the listener is the front's, on a real loopback socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from helpers import make_settings, wait_for_async
from imds.app import build_served_app
from imds.cli.front.held import Held
from imds.cli.front.listener import Listener
from imds.cli.front.shared import Shared
from imds.cli.tally import Tally
from imds.services.demo import load_demo

pytestmark = pytest.mark.anyio
DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"


class Seen:
    """A listener on 127.0.0.1 and how many sockets it gave the loop (``connect_accepted_socket``)."""

    def __init__(self, listener: Listener, tally: Tally) -> None:
        self.listener = listener
        self.tally = tally
        self.adopted = 0
        self.port = int(listener.sock.getsockname()[1])


@pytest.fixture
async def seen(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Seen]:
    settings = make_settings(max_requests_per_source=0, header_timeout=5.0, keepalive_timeout=5.0)
    app = build_served_app(settings)
    loop = asyncio.get_running_loop()
    async with app.app.services.running():
        await load_demo(app.app.services.records)
        shared = Shared(app, settings, loop)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        tally = Tally()
        found = Seen(Listener(shared, sock, 16, tally), tally)
        adopt = loop.connect_accepted_socket

        def counted(*args: Any, **kwargs: Any) -> Any:
            found.adopted += 1
            return adopt(*args, **kwargs)

        monkeypatch.setattr(loop, "connect_accepted_socket", counted)
        found.listener.start()
        try:
            yield found
        finally:
            found.listener.stop()
            for connection in list(shared.connections):
                if connection.transport is not None:
                    connection.transport.abort()
            sock.close()


async def _exchange(seen: Seen, *requests: bytes) -> bytes:
    """Connect, send each request (the first before the server accepts), read until the server closes."""
    client = socket.create_connection(("127.0.0.1", seen.port), timeout=10)
    client.setblocking(False)  # noqa: FBT003 - socket API
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(client, requests[0])
        received = b""
        for request in requests[1:]:  # each after the answer before it
            received += await asyncio.wait_for(loop.sock_recv(client, 65536), 10)
            await loop.sock_sendall(client, request)
        while chunk := await asyncio.wait_for(loop.sock_recv(client, 65536), 10):
            received += chunk
        return received
    finally:
        client.close()


def _get(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: imds", *headers]) + "\r\n\r\n").encode()


def _bodies(raw: bytes) -> list[tuple[int, bytes]]:
    found = []
    while b"\r\n\r\n" in raw:
        head, raw = raw.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        found.append((int(lines[0].split()[1]), raw[:length]))
        raw = raw[length:]
    return found


async def _released(seen: Seen) -> None:
    await wait_for_async(lambda: seen.listener.open == 0 and not seen.listener.shared.connections,
                         what="the connection's slot given back", timeout=10)
    assert seen.tally.count("127.0.0.1") == 0


async def test_a_read_that_ends_the_connection_is_answered_without_a_loop_transport(seen):
    raw = await _exchange(seen, _get("/metadata", "Connection: close"))
    ((status, body),) = _bodies(raw)
    assert (status, json.loads(body)["id"]) == (200, DEMO_ID)
    assert b"connection: close" in raw.lower()
    assert seen.adopted == 0
    await _released(seen)


async def test_a_kept_connection_goes_to_the_loop_and_answers_the_next_request_too(seen):
    raw = await _exchange(seen, _get("/latest/meta-data/instance-id"), _get("/metadata", "Connection: close"))
    answers = _bodies(raw)
    assert [status for status, _ in answers] == [200, 200]
    assert answers[0][1] == DEMO_ID.encode()
    assert json.loads(answers[1][1])["id"] == DEMO_ID
    assert seen.adopted == 1
    await _released(seen)


async def test_a_request_for_the_asgi_app_is_answered_through_the_loop_transport(seen):
    """/readyz goes to the ASGI app in a task: what it writes before or after the hand-over arrives, once."""
    raw = await _exchange(seen, _get("/readyz", "Connection: close"))
    ((status, body),) = _bodies(raw)
    assert (status, json.loads(body)["status"]) == (200, "ready")
    assert seen.adopted == 1
    await _released(seen)


async def test_a_token_put_that_ends_the_connection_is_answered_without_a_loop_transport(seen):
    """The IMDSv2 token PUT of a boot crawl (a connection of its own) goes as a read does: no loop, no ASGI."""
    put = (b"PUT /latest/api/token HTTP/1.1\r\nHost: imds\r\nConnection: close\r\nContent-Length: 0\r\n"
           b"X-aws-ec2-metadata-token-ttl-seconds: 21600\r\n\r\n")
    raw = await _exchange(seen, put)
    ((status, token),) = _bodies(raw)
    assert status == 200
    assert b"x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n" in raw.lower()
    assert seen.adopted == 0
    await _released(seen)
    raw = await _exchange(seen, _get("/latest/meta-data/instance-id", "Connection: close",
                                     f"X-aws-ec2-metadata-token: {token.decode()}"))
    assert _bodies(raw) == [(200, DEMO_ID.encode())]


async def test_a_refusal_is_sent_and_the_connection_closed_without_a_loop_transport(seen):
    raw = await _exchange(seen, b"NOT HTTP AT ALL\r\n\r\n")
    ((status, body),) = _bodies(raw)
    assert status == 400
    assert json.loads(body)["errors"]
    assert seen.adopted == 0
    await _released(seen)


# -- Held by itself ------------------------------------------------------------------------


class Transport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def close(self) -> None:
        self.calls.append(("close", b""))

    def abort(self) -> None:
        self.calls.append(("abort", b""))

    def pause_reading(self) -> None:
        self.calls.append(("pause", b""))

    def is_closing(self) -> bool:
        return any(name in {"close", "abort"} for name, _ in self.calls)


def test_held_hands_over_what_it_kept_in_order_then_forwards():
    held = Held()
    held.write(b"one ")
    held.writelines([b"two ", b""])
    held.pause_reading()
    assert not held.is_closing()
    real = Transport()
    held.attach(real)  # type: ignore[arg-type]
    held.write(b"three")
    held.close()
    assert real.calls == [("write", b"one two "), ("pause", b""), ("write", b"three"), ("close", b"")]
    assert held.is_closing()


def test_held_closed_before_the_hand_over_closes_after_its_bytes_and_an_abort_drops_them():
    closed, aborted = Held(), Held()
    for held in (closed, aborted):
        held.write(b"answer")
    closed.close()
    aborted.abort()
    assert closed.is_closing()
    real, cut = Transport(), Transport()
    closed.attach(real)  # type: ignore[arg-type]
    aborted.attach(cut)  # type: ignore[arg-type]
    assert real.calls == [("write", b"answer"), ("close", b"")]
    assert cut.calls == [("abort", b"")]


async def test_a_failure_while_answering_early_closes_that_connection_and_keeps_the_listener(seen, monkeypatch):
    from imds.cli.front.connection import Connection  # noqa: PLC0415 - the class whose callback is broken here

    def broken(_self: Connection, _data: bytes) -> None:
        raise RuntimeError

    with monkeypatch.context() as patched:
        patched.setattr(Connection, "data_received", broken)
        assert await _exchange(seen, _get("/metadata", "Connection: close")) == b""  # closed, no answer
    await _released(seen)
    raw = await _exchange(seen, _get("/metadata", "Connection: close"))  # the listener still accepts
    assert _bodies(raw)[0][0] == 200


# -- what an accept costs: a bare socket, counted only if it outlives the accept -----------------


async def test_an_answer_larger_than_what_the_socket_takes_at_once_goes_on_through_the_loop(seen):
    """The listener's send never blocks the loop, though the socket is still blocking (MSG_DONTWAIT).

    What the socket did not take at once goes out through the loop's transport, whole and in order.
    """
    from imds.models import UserdataWrite  # noqa: PLC0415 - only this test writes a record
    from imds.services.demo import DEMO_ADDRESSES  # noqa: PLC0415

    userdata = bytes(range(256)) * 3600  # 900 KiB: more than one non-blocking send takes on a fresh connection
    records = seen.listener.shared.app.app.services.records
    await records.put_userdata(UserdataWrite(DEMO_ID, DEMO_ADDRESSES, userdata), subject="test")
    # Accepted sockets inherit the listener's send buffer: a fixed one (the kernel grows a free one to megabytes
    # on loopback) and a client's small window make the listener's one send stop short.
    seen.listener.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.settimeout(10)
    client.connect(("127.0.0.1", seen.port))
    client.setblocking(False)  # noqa: FBT003 - socket API
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(client, _get("/latest/user-data", "Connection: close"))
        raw = b""
        while chunk := await asyncio.wait_for(loop.sock_recv(client, 65536), 10):
            raw += chunk
    finally:
        client.close()
    assert _bodies(raw) == [(200, userdata)]
    assert seen.adopted == 1  # what the accept could not send went to the loop
    await _released(seen)


async def test_a_connection_answered_at_its_accept_is_not_counted_against_its_source(seen):
    """Only connections that outlive their accept hold a slot the warden could take back: only they count."""
    seen.tally.budget = 1
    loop = asyncio.get_running_loop()
    kept = socket.create_connection(("127.0.0.1", seen.port), timeout=10)
    kept.setblocking(False)  # noqa: FBT003 - socket API
    try:
        await loop.sock_sendall(kept, _get("/latest/meta-data/instance-id"))  # kept alive: to the loop, counted
        assert (await asyncio.wait_for(loop.sock_recv(kept, 65536), 10)).startswith(b"HTTP/1.1 200 ")
        await wait_for_async(lambda: seen.tally.count("127.0.0.1") == 1, what="the kept connection counted",
                             timeout=10)
        raw = await _exchange(seen, _get("/metadata", "Connection: close"))  # answered and closed at its accept
        assert _bodies(raw)[0][0] == 200
        assert seen.tally.count("127.0.0.1") == 1
        assert not seen.tally.alarmed_since(0)  # a second connection counted would have been over the budget
        raw = await _exchange(seen, _get("/readyz", "Connection: close"))  # goes to the loop (ASGI): counted
        assert _bodies(raw)[0][0] == 200
        assert seen.tally.alarmed_since(0)
    finally:
        kept.close()
    await _released(seen)
