"""One front ``Connection`` fed bytes by hand: order, the memo's turn, limits and deadlines, no sockets.

The app is the real one (``build_served_app``, memory store, the demo instance at
127.0.0.1); the transport records what is written. ASGI requests run as tasks, so each
test lets the loop run until the expected answers are there (bounded waits).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from helpers import ADMIN_TOKEN, make_settings, wait_for_async
from imds.app import build_served_app
from imds.cli.front import connection as connection_module
from imds.cli.front.connection import Connection
from imds.cli.front.shared import Shared
from imds.services.demo import load_demo

pytestmark = pytest.mark.anyio
DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"


class Transport:
    """Records writes and closes; reading can be paused and resumed."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, parts: list[bytes]) -> None:
        self.data += b"".join(parts)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, _name: str, default: Any = None) -> Any:
        return default

    def answers(self) -> list[tuple[int, dict[str, str], bytes]]:
        """The responses written so far: (status, headers, body), framed by content-length."""
        found, rest = [], self.data
        while b"\r\n\r\n" in rest:
            head, rest = rest.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            length = int(headers.get("content-length", "0"))
            found.append((int(lines[0].split()[1]), headers, rest[:length]))
            rest = rest[length:]
        return found


@pytest.fixture
async def shared() -> AsyncIterator[Shared]:
    settings = make_settings(max_requests_per_source=0, header_timeout=2.0, keepalive_timeout=1.0)
    app = build_served_app(settings)
    async with app.app.services.running():
        await load_demo(app.app.services.records)
        yield Shared(app, settings, asyncio.get_running_loop())


def _connect(shared: Shared, client: str = "127.0.0.1") -> tuple[Connection, Transport]:
    released: list[bool] = []
    connection = Connection(shared, lambda: released.append(True), (client, 40000), ("127.0.0.1", 80))
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def _get(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: imds", *headers]) + "\r\n\r\n").encode()


async def _answered(transport: Transport, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    await wait_for_async(lambda: len(transport.answers()) >= count, what=f"{count} answers", timeout=10)
    return transport.answers()


async def test_reads_are_answered_in_the_callback_that_parses_them(shared):
    """An instance read is written before data_received returns: no task, no loop turn."""
    connection, transport = _connect(shared)
    connection.data_received(_get("/metadata"))
    ((status, _, body),) = transport.answers()
    assert (status, json.loads(body)["id"]) == (200, DEMO_ID)
    connection.data_received(_get("/metadata"))  # the second one is remembered: still in place
    assert [json.loads(body)["id"] for _, _, body in transport.answers()] == [DEMO_ID, DEMO_ID]


async def test_a_pipelined_write_between_reads_is_seen_by_the_reads_after_it(shared):
    """Read, admin write, read in one segment: the last read answers the write (it waited its turn)."""
    connection, transport = _connect(shared)
    connection.data_received(_get("/latest/meta-data/hostname") + _get("/latest/meta-data/hostname"))
    body = json.dumps({"id": DEMO_ID, "ipAddresses": ["127.0.0.1", "::1"],
                       "metadata": {"id": DEMO_ID, "hostname": "changed"}}).encode()
    write = (f"POST /device-metadata HTTP/1.1\r\nHost: imds\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
             f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    connection.data_received(write + _get("/latest/meta-data/hostname") + _get("/readyz")
                             + _get("/latest/meta-data/hostname"))
    answers = await _answered(transport, 6)
    assert [a[2] for a in answers[:2]] == [b"metadata-example-01"] * 2
    assert json.loads(answers[2][2])["applied"] is True
    assert answers[3][2] == b"changed"
    assert json.loads(answers[4][2])["status"] == "ready"
    assert answers[5][2] == b"changed"


async def test_reading_pauses_while_requests_wait_and_resumes_after(shared):
    """Requests queued behind an ASGI one pause reading; once all are answered reading resumes."""
    connection, transport = _connect(shared)
    connection.data_received(_get("/readyz") + _get("/metadata"))
    assert transport.paused
    await _answered(transport, 2)
    await wait_for_async(lambda: not transport.paused, what="reading resumed", timeout=10)


async def test_a_head_in_single_bytes_is_answered_once_whole(shared):
    """Fed one byte at a time, a request is answered once, when its head is complete."""
    connection, transport = _connect(shared)
    for byte in _get("/latest/meta-data/instance-id"):
        assert transport.data == b""
        connection.data_received(bytes([byte]))
    ((status, _, body),) = transport.answers()
    assert (status, body) == (200, DEMO_ID.encode())


async def test_a_head_over_the_limit_is_refused_before_it_ends(shared):
    """An unfinished head past --max-header-bytes: 431, closed, and nothing later is read."""
    connection, transport = _connect(shared)
    connection.data_received(b"GET /metadata HTTP/1.1\r\nX-Long: " + b"a" * 20000)
    ((status, headers, body),) = transport.answers()
    assert (status, headers["connection"]) == (431, "close")
    assert "--max-header-bytes" in body.decode()
    assert transport.closed
    connection.data_received(b"\r\n\r\n" + _get("/metadata"))
    assert len(transport.answers()) == 1


async def test_an_idle_connection_expires_and_a_busy_one_does_not(shared):
    """Past the idle deadline an idle connection closes; one with an answer under way has none."""
    connection, transport = _connect(shared)
    connection.data_received(_get("/metadata"))
    assert not connection.expired(shared.loop.time() + 0.5)
    assert connection.expired(shared.loop.time() + 5.0)
    assert transport.closed
    busy, busy_transport = _connect(shared)
    busy.data_received(_get("/metadata?wait_for_change=true&timeout_sec=30"))  # held: an answer under way
    assert busy.deadline == 0.0
    assert not busy.expired(shared.loop.time() + 60.0)
    busy.connection_lost(None)  # the client went away: the held read ends
    assert busy_transport.answers() == [] or busy_transport.answers()[0][0] == 200


async def test_a_malformed_request_after_good_ones_is_refused_in_its_turn(shared):
    """Two reads then garbage: two answers, then a JSON 400, then the connection closes."""
    connection, transport = _connect(shared)
    connection.data_received(_get("/metadata") + _get("/metadata") + b"NOT HTTP\r\n\r\n")
    answers = transport.answers()
    assert [a[0] for a in answers] == [200, 200, 400]
    assert json.loads(answers[2][2])["errors"][0]["field"] == "request"
    assert transport.closed


class _Feeds:
    """Wraps a parser: counts the chunks fed to it."""

    def __init__(self, parser: Any) -> None:
        self.parser, self.fed = parser, 0

    def feed_data(self, data: bytes) -> None:
        self.fed += 1
        self.parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


async def test_the_same_bytes_again_are_answered_without_parsing_and_counted(shared):
    """A read remembered, then the same bytes alone again: answered unparsed, counted, fresh after a write."""
    connection, transport = _connect(shared)
    feeds = connection.parser = _Feeds(connection.parser)  # type: ignore[assignment]
    request = _get("/latest/meta-data/hostname", "User-Agent: poller")
    reads = shared.fast.serve.__self__.services.metrics.tally.reads  # type: ignore[union-attr]
    before = reads[("metadata", True)]
    for _ in range(4):
        connection.data_received(request)
    assert [a[2] for a in transport.answers()] == [b"metadata-example-01"] * 4
    assert feeds.fed == 2  # the first went the whole way, the second was remembered, the rest came again
    assert reads[("metadata", True)] - before == 4
    front = shared.fast.serve.__self__  # type: ignore[union-attr]
    body = json.dumps({"id": DEMO_ID, "ipAddresses": ["127.0.0.1", "::1"],
                       "metadata": {"id": DEMO_ID, "hostname": "polled"}}).encode()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front, client=("192.0.2.250", 1)),
                                 base_url="http://imds", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
        assert (await admin.post("/device-metadata", content=body,
                                 headers={"Content-Type": "application/json"})).status_code == 200
    connection.data_received(request)
    assert transport.answers()[-1][2] == b"polled"
    assert feeds.fed == 3  # the memo no longer had that answer: parsed again


async def test_the_same_bytes_again_still_meet_the_rate_limit(shared):
    """Past the caller's burst, the same bytes again get the 429 the whole way gives."""
    settings = make_settings(rate_limit=1.0, rate_burst=3, max_requests_per_source=0)
    app = build_served_app(settings)
    async with app.app.services.running():
        await load_demo(app.app.services.records)
        limited = Shared(app, settings, asyncio.get_running_loop())
        connection, transport = _connect(limited)
        for _ in range(5):
            connection.data_received(_get("/metadata"))
        assert [a[0] for a in transport.answers()] == [200, 200, 200, 429, 429]


def _put(path: str, *headers: str, body: bytes = b"") -> bytes:
    head = [f"PUT {path} HTTP/1.1", "Host: imds", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


TTL = "X-aws-ec2-metadata-token-ttl-seconds"


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths handed to the ASGI app (``asgi_cycle``), still answered as before."""
    paths: list[str] = []
    made = connection_module.asgi_cycle

    def counted(scope: Any, *args: Any, **kwargs: Any) -> Any:
        paths.append(f"{scope['method']} {scope['path']}")
        return made(scope, *args, **kwargs)

    monkeypatch.setattr(connection_module, "asgi_cycle", counted)
    return paths


async def test_a_bodiless_token_put_is_answered_in_the_callback_without_the_asgi_app(shared, handed):
    """The token PUT (no body, or Content-Length: 0) is written before data_received returns; its token reads."""
    connection, transport = _connect(shared)
    connection.data_received(_put("/latest/api/token", f"{TTL}: 60") + _put("/latest//api/token/", f"{TTL}: 5",
                                                                            "Content-Length: 0"))
    (status, headers, token), (again, again_headers, _) = transport.answers()
    assert (status, headers[TTL.lower()], again, again_headers[TTL.lower()]) == (200, "60", 200, "5")
    assert handed == []
    connection.data_received(_get("/latest/meta-data/instance-id", f"X-aws-ec2-metadata-token: {token.decode()}"))
    status, headers, body = transport.answers()[-1]
    assert (status, body) == (200, DEMO_ID.encode())
    assert 0 < int(headers[TTL.lower()]) <= 60
    assert handed == []


async def test_a_token_put_in_single_bytes_is_answered_once_whole_in_place(shared, handed):
    """Fed one byte at a time, a token PUT is answered once, when its head is complete, without the ASGI app."""
    connection, transport = _connect(shared)
    for byte in _put("/latest/api/token", f"{TTL}: 60", "User-Agent: drip"):
        assert transport.data == b""
        connection.data_received(bytes([byte]))
    ((status, headers, token),) = transport.answers()
    assert (status, headers[TTL.lower()]) == (200, "60")
    assert token
    assert handed == []


async def test_a_token_put_the_front_refuses_is_refused_in_place_as_before(shared, handed):
    """A bad TTL is the plain 400, a forwarded PUT the plain 403: in place too, with no token."""
    connection, transport = _connect(shared)
    connection.data_received(_put("/latest/api/token", f"{TTL}: 0") + _put("/latest/api/token")
                             + _put("/latest/api/token", f"{TTL}: 60", "X-Forwarded-For: 127.0.0.1"))
    assert [(status, body) for status, _, body in transport.answers()] == [
        (400, b"400 - Bad Request"), (400, b"400 - Bad Request"), (403, b"403 - Forbidden")]
    assert handed == []


async def test_a_put_with_a_body_or_elsewhere_still_goes_to_the_asgi_app(shared, handed):
    """A token PUT with a body, a chunked one and a PUT on another path are the ASGI app's, answered in order."""
    connection, transport = _connect(shared)
    connection.data_received(_put("/latest/api/token", f"{TTL}: 60", "Content-Length: 3", body=b"abc")
                             + _put("/latest/api/token", f"{TTL}: 60", "Transfer-Encoding: chunked", body=b"0\r\n\r\n")
                             + _put("/latest/meta-data/instance-id", "Content-Length: 0")
                             + _get("/latest/meta-data/instance-id"))
    answers = await _answered(transport, 4)
    assert [(status, headers.get(TTL.lower())) for status, headers, _ in answers] == [
        (200, "60"), (200, "60"), (405, None), (200, None)]
    assert answers[2][2] == b"405 - Method Not Allowed"
    assert answers[3][2] == DEMO_ID.encode()
    assert handed == ["PUT /latest/api/token", "PUT /latest/api/token", "PUT /latest/meta-data/instance-id"]


async def test_token_puts_in_place_meet_the_rate_limit_as_reads_do(handed):
    """Past the caller's burst a token PUT gets serve's 429 (JSON, Retry-After), still without the ASGI app."""
    settings = make_settings(rate_limit=1.0, rate_burst=2, max_requests_per_source=0)
    app = build_served_app(settings)
    async with app.app.services.running():
        await load_demo(app.app.services.records)
        connection, transport = _connect(Shared(app, settings, asyncio.get_running_loop()))
        connection.data_received(_put("/latest/api/token", f"{TTL}: 60") * 2 + _get("/metadata")
                                 + _put("/latest/api/token", f"{TTL}: 60"))
        answers = transport.answers()
        assert [status for status, _, _ in answers] == [200, 200, 429, 429]
        assert "retry-after" in answers[3][1]
        assert json.loads(answers[3][2])["message"].startswith("too many requests")
        assert handed == []


async def test_a_token_put_on_an_admin_listener_is_the_asgi_apps_as_before(handed):
    """With --admin-listen, a token PUT arriving there goes to the ASGI app (its 404); on the instance one, in place."""
    settings = make_settings(max_requests_per_source=0, admin_listen=(("127.0.0.1", 8081),))
    app = build_served_app(settings)
    async with app.app.services.running():
        await load_demo(app.app.services.records)
        shared = Shared(app, settings, asyncio.get_running_loop())
        admin = Connection(shared, lambda: None, ("127.0.0.1", 40000), ("127.0.0.1", 8081))
        admin_transport = Transport()
        admin.connection_made(admin_transport)  # type: ignore[arg-type]
        admin.data_received(_put("/latest/api/token", f"{TTL}: 60"))
        ((status, _, body),) = await _answered(admin_transport, 1)
        assert (status, json.loads(body)["message"]) == (404, "not found")
        assert handed == ["PUT /latest/api/token"]
        connection, transport = _connect(shared)  # the instance listener (127.0.0.1:80)
        connection.data_received(_put("/latest/api/token", f"{TTL}: 60"))
        ((status, headers, _),) = transport.answers()
        assert (status, headers[TTL.lower()]) == (200, "60")
        assert handed == ["PUT /latest/api/token"]
