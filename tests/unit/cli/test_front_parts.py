"""The front's parts without sockets: eager starts, the Exchange's framing, the bytes it writes itself."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from helpers import FakeClock
from imds.cli.front import eager
from imds.cli.front.exchange import DateLine, Exchange
from imds.cli.front.heap import Heap
from imds.cli.front.wire import Last, Wire, recalled, refusal
from imds.errors import HeadTooLarge
from imds.web.memo import Remembered

pytestmark = pytest.mark.anyio
DATE = b"date: Sat, 28 Nov 2026 10:00:00 GMT\r\n"


class Transport:
    """What an Exchange writes, and whether it closed the connection."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, parts: list[bytes]) -> None:
        self.data += b"".join(parts)

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _exchange(**begin: bool) -> tuple[Exchange, Transport]:
    transport = Transport()
    date = DateLine()
    date.line = DATE
    exchange = Exchange(transport, FlowControl(transport), date, transport.close)  # type: ignore[arg-type]
    exchange.begin(**{"keep_alive": True, "http10": False, "head_only": False, **begin})
    return exchange, transport


def _run(coro) -> None:
    with pytest.raises(StopIteration):
        coro.send(None)


async def test_a_coroutine_that_never_waits_finishes_in_place():
    """eager.start runs it to the end at once and hands back no task."""
    done: list[int] = []

    async def answer() -> None:
        done.append(1)

    assert eager.start(asyncio.get_running_loop(), answer()) is None
    assert done == [1]


async def test_a_coroutine_that_waits_goes_on_in_a_task_from_where_it_stopped():
    """What ran before the wait ran at once; the task resumes it with the awaited value."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = loop.create_future()
    seen: list[str] = []

    async def answer() -> None:
        seen.append("before")
        seen.append(await future)

    task = eager.start(loop, answer())
    assert task is not None
    assert seen == ["before"]
    future.set_result("after")
    await asyncio.wait_for(task, 10)
    assert seen == ["before", "after"]


async def test_an_error_before_the_first_wait_is_raised_in_place():
    """eager.start raises what the coroutine raised before it ever waited."""

    async def broken() -> None:
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        eager.start(asyncio.get_running_loop(), broken())


class _Held:
    """Something only a driven coroutine's failure handler refers to."""


async def test_a_driven_coroutine_is_freed_by_refcounting_when_it_ends():
    """A driven coroutine leaves no reference cycle: what it held (the connection, its socket) goes as soon as it ends.

    A cycle would keep it for the cyclic GC; a boot storm's full collections of those took 50-200 ms.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    ran: list[bool] = []

    async def waits() -> None:
        await future
        ran.append(True)

    held = _Held()
    gone = weakref.ref(held)
    gc.disable()
    try:
        eager.drive(waits(), loop, lambda _exc, kept=[held]: kept.clear())
        del held
        future.set_result(None)
        for _ in range(3):
            await asyncio.sleep(0)
        assert ran == [True]
        assert gone() is None
    finally:
        gc.enable()


async def test_a_driven_coroutine_that_fails_hands_the_error_over():
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    failures: list[BaseException] = []

    async def fails() -> None:
        await future
        raise ConnectionResetError

    eager.drive(fails(), loop, failures.append)
    future.set_result(None)
    for _ in range(3):
        await asyncio.sleep(0)
    assert [type(exc) for exc in failures] == [ConnectionResetError]


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits():
    """The task's cancellation reaches the coroutine (its finally runs), and the task ends cancelled."""
    loop = asyncio.get_running_loop()
    cleaned: list[bool] = []

    async def held() -> None:
        try:
            await loop.create_future()
        finally:
            cleaned.append(True)

    task = eager.start(loop, held())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]


def test_an_answer_goes_out_as_one_write_with_the_date():
    """Start and body become status line, date, headers and body in one write; keep-alive: no close."""
    exchange, transport = _exchange()
    _run(exchange.send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", b"5")]}))
    assert transport.data == b""  # the head waits for the body: one write
    _run(exchange.send({"type": "http.response.body", "body": b"hello"}))
    assert transport.data == (b"HTTP/1.1 200 OK\r\n" + DATE + b"content-type: text/plain\r\ncontent-length: 5\r\n\r\n"
                              b"hello")
    assert exchange.complete
    assert not transport.closed


def test_a_head_request_sends_the_length_and_no_body():
    """HEAD: the content-length of the body is sent, the (empty) body part is accepted."""
    exchange, transport = _exchange(head_only=True)
    _run(exchange.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}))
    _run(exchange.send({"type": "http.response.body", "body": b""}))
    assert transport.data.endswith(b"content-length: 5\r\n\r\n")
    assert exchange.complete


def test_a_reply_without_length_is_chunked_for_http11():
    """No content-length, HTTP/1.1: transfer-encoding chunked, each part a chunk, the last one empty."""
    exchange, transport = _exchange()
    _run(exchange.send({"type": "http.response.start", "status": 200, "headers": []}))
    _run(exchange.send({"type": "http.response.body", "body": b"abc", "more_body": True}))
    _run(exchange.send({"type": "http.response.body", "body": b""}))
    head, _, body = transport.data.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body == b"3\r\nabc\r\n0\r\n\r\n"


def test_a_reply_without_length_to_http10_ends_with_the_connection():
    """No content-length, HTTP/1.0 (keep-alive asked): close-delimited, ``connection: close``, then closed."""
    exchange, transport = _exchange(http10=True)
    _run(exchange.send({"type": "http.response.start", "status": 200, "headers": []}))
    _run(exchange.send({"type": "http.response.body", "body": b"abc"}))
    assert b"connection: close\r\n" in transport.data
    assert transport.data.endswith(b"\r\n\r\nabc")
    assert transport.closed


def test_http10_keep_alive_is_answered_keep_alive():
    """HTTP/1.0 with keep-alive asked and a length: ``connection: keep-alive``, the connection stays."""
    exchange, transport = _exchange(http10=True)
    _run(exchange.send({"type": "http.response.start", "status": 204, "headers": []}))
    _run(exchange.send({"type": "http.response.body", "body": b""}))
    assert b"connection: keep-alive\r\n" in transport.data
    assert not transport.closed


def test_a_header_with_a_line_break_is_never_written():
    """A header value holding CR/LF (response splitting) raises instead of being written."""
    exchange, transport = _exchange()
    _run(exchange.send({"type": "http.response.start", "status": 200,
                        "headers": [(b"x-evil", b"a\r\nset-cookie: b"), (b"content-length", b"0")]}))
    with pytest.raises(RuntimeError, match="line break"):
        exchange.send({"type": "http.response.body", "body": b""}).send(None)
    assert transport.data == b""


def test_a_body_shorter_than_its_length_is_an_error():
    """Fewer bytes than content-length at the last part: an error (the front cuts the connection)."""
    exchange, _ = _exchange()
    _run(exchange.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]}))
    with pytest.raises(RuntimeError, match="shorter"):
        exchange.send({"type": "http.response.body", "body": b"abc"}).send(None)


async def test_receive_gives_the_empty_body_then_waits_for_the_disconnect():
    """First receive: the (empty) request; the next waits until the connection is gone."""
    exchange, _ = _exchange()
    assert await exchange.receive() == {"type": "http.request", "body": b"", "more_body": False}
    waiting = asyncio.ensure_future(exchange.receive())
    await asyncio.sleep(0)
    assert not waiting.done()
    exchange.gone()
    assert await asyncio.wait_for(waiting, 10) == {"type": "http.disconnect"}


def test_a_remembered_read_is_built_once_per_date():
    """The kept answer's bytes are reused for the same date line and remade for a new one."""
    found = Remembered(200, ((b"content-type", b"application/json"), (b"content-length", b"2")), b"{}", ())
    first = recalled(found, DATE, head_only=False, keep_alive=True, http10=False)
    assert first == b"HTTP/1.1 200 OK\r\n" + DATE + b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    assert recalled(found, DATE, head_only=False, keep_alive=True, http10=False) is first
    later = b"date: Sat, 28 Nov 2026 10:00:01 GMT\r\n"
    assert recalled(found, later, head_only=False, keep_alive=True, http10=False).count(later) == 1
    assert recalled(found, later, head_only=True, keep_alive=True, http10=False).endswith(b"\r\n\r\n")


def test_a_remembered_read_that_ends_the_connection_says_so():
    """Not kept alive: ``connection: close`` and a ``Last`` (the connection closes after it)."""
    found = Remembered(200, ((b"content-length", b"2"),), b"{}", ())
    answer = recalled(found, DATE, head_only=False, keep_alive=False, http10=False)
    assert isinstance(answer, Last)
    assert answer.endswith(b"content-length: 2\r\nconnection: close\r\n\r\n{}")
    kept10 = recalled(found, DATE, head_only=False, keep_alive=True, http10=True)
    assert not isinstance(kept10, Last)
    assert b"connection: keep-alive\r\n" in kept10


def test_a_remembered_read_that_ends_the_connection_is_joined_from_the_parts_made_once():
    """A boot's crawl asks each answer once, on a connection of its own: only the date-free lines are kept.

    The bytes are the kept-alive answer's with ``connection: close`` before the blank line.
    """
    headers = ((b"content-type", b"text/plain"), (b"content-length", b"5"))
    closing = recalled(Remembered(200, headers, b"hello", ()), DATE, head_only=False, keep_alive=False, http10=False)
    found = Remembered(200, headers, b"hello", ())
    kept = recalled(found, DATE, head_only=False, keep_alive=True, http10=False)
    assert closing == kept.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)
    found = Remembered(200, headers, b"hello", ())
    recalled(found, DATE, head_only=True, keep_alive=False, http10=False)
    assert isinstance(found.wire, Wire)
    assert (found.wire.fields, found.wire.date, found.wire.whole) == (
        b"content-type: text/plain\r\ncontent-length: 5\r\n", None, b"")
    with pytest.raises(RuntimeError, match="line break"):
        recalled(Remembered(200, ((b"x-split", b"a\r\nb: c"),), b"", ()), DATE, head_only=False, keep_alive=False,
                 http10=False)


def test_answers_recalled_anew_share_the_kept_answers_wire():
    """A renewed body rides on the kept answer's head; a gate's line goes before its kept header lines.

    Each answer's bytes equal the ones made from scratch for the same status, headers and body.
    """
    headers = ((b"content-type", b"application/json"), (b"content-length", b"4"))
    origin = Remembered(200, headers, b'{"a"', ())
    fresh = [Remembered(200, headers, body, (), origin=origin) for body in (b'{"b"', b'{"c"')]
    answers = [recalled(found, DATE, head_only=False, keep_alive=True, http10=False) for found in fresh]
    assert answers == [recalled(Remembered(200, headers, found.body, ()), DATE, head_only=False, keep_alive=True,
                                http10=False) for found in fresh]
    assert fresh[0].wire is fresh[1].wire is origin.wire  # the header lines were made once
    assert recalled(origin, DATE, head_only=False, keep_alive=True, http10=False).endswith(b'\r\n\r\n{"a"')
    ttl = (b"x-aws-ec2-metadata-token-ttl-seconds", b"299")
    gated = Remembered(200, (ttl, *headers), origin.body, (), origin=origin)
    answer = recalled(gated, DATE, head_only=False, keep_alive=True, http10=False)
    assert answer == recalled(Remembered(200, (ttl, *headers), origin.body, ()), DATE, head_only=False,
                              keep_alive=True, http10=False)
    assert isinstance(gated.wire, Wire)
    assert isinstance(origin.wire, Wire)
    assert gated.wire is not origin.wire
    assert origin.wire.fields == b"content-type: application/json\r\ncontent-length: 4\r\n"  # untouched
    closing = recalled(fresh[1], DATE, head_only=False, keep_alive=False, http10=False)
    assert closing.endswith(b'connection: close\r\n\r\n{"c"')


def test_a_refusal_is_json_from_the_error_table_and_closes():
    """A head over the limit: 431 with the JSON body naming the flag, ``connection: close``, a ``Last``."""
    answer = refusal(HeadTooLarge(16384), DATE)
    assert isinstance(answer, Last)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    assert b"connection: close" in head
    assert "--max-header-bytes" in json.loads(body)["errors"][0]["message"]


# -- the heap: frozen after a full collection ---------------------------------------------------


def test_what_survives_a_full_collection_is_frozen_at_the_next_tick_and_unfrozen_once_an_interval():
    clock = FakeClock(0.0)
    heap = Heap(clock, unfreeze=3600.0)
    heap.start()
    try:
        survivor = [[] for _ in range(10)]  # tracked objects alive across the collection
        heap.tick()
        assert heap.frozen == 0  # no full collection yet: nothing frozen
        gc.collect()  # a full collection, as the interpreter runs them (the callback notes it)
        assert heap.full
        heap.tick()
        assert heap.frozen == 1
        assert gc.get_freeze_count() >= len(survivor)
        heap.tick()
        assert heap.frozen == 1  # once per full collection
        clock.advance(3600.0)
        heap.tick()
        assert gc.get_freeze_count() == 0  # everything is scanned (and collectable) again
    finally:
        heap.stop()
        gc.unfreeze()
    assert heap.watch not in gc.callbacks
