"""Raw-socket HTTP abuse against a real ``imds serve`` (the default server, granian).

Each case is something one instance could do to take the service down for the others
(issue 13): oversized or unfinished heads, endless chunks, slowloris, too many
connections, smuggling shapes, request floods. Each asserts the attacker is refused or
cut off AND that a well-behaved client is still answered with the right body. Timeouts
are set short (2 s) on the command line; waits poll with generous bounds.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serve_process import ADMIN_TOKEN, Server, client_at, serving

DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"
MAX_CONNECTIONS = 40
LIMITS = ("--demo", "--db", "memory://", "--header-timeout", "2", "--body-timeout", "2",
          "--max-connections", str(MAX_CONNECTIONS), "--rate-limit", "0")
RSS_GROWTH_BOUND_KB = 64 * 1024  # 20 connections x 20 MB unfinished heads: was 450 MB before the limits
CLOSE_WITHIN = 15.0  # generous bound for a 2 s timeout to close a connection
SAMPLE_EVERY = 0.02  # seconds between two samples of the server's RSS or socket count while a flood runs
FD_WATCH = 1.0  # seconds the socket count is watched once 150 connections are open


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server with short timeouts and a small connection cap; the demo instance answers 127.0.0.1."""
    with serving(tmp_path_factory.mktemp("abuse"), *LIMITS) as running:
        yield running


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=CLOSE_WITHIN)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    return sock


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send what the server takes; it may cut the connection midway (that is the point)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket timeout)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def _status(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def _good_client_is_served(server: Server) -> None:
    """The demo instance gets its own metadata (body checked, not just the status)."""
    with client_at("127.0.0.1") as guest:
        answer = guest.get(f"{server.url}/metadata", timeout=CLOSE_WITHIN)
    assert answer.status_code == 200
    assert answer.json()["id"] == DEMO_ID


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _socket_fds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed while we looked
            count += str(fd.readlink()).startswith("socket:")
    return count


@pytest.mark.parametrize("head", [
    pytest.param(b"X-Big: " + b"a" * 1_000_000 + b"\r\n", id="1MB-header"),
    pytest.param(b"".join(b"X-Forwarded-For: 10.0.0.%d\r\n" % (i % 250) for i in range(10_000)), id="10k-headers"),
    pytest.param(b"".join(b"X-N%d: 1\r\n" % i for i in range(150)), id="150-headers"),
])
def test_oversized_heads_are_refused_and_the_connection_closed(server, head):
    """A 1 MB header, 10,000 headers or 150 headers: 431 (or a closed connection), never a 200."""
    with _connect(server) as sock:
        _send_quietly(sock, b"GET /metadata HTTP/1.1\r\nHost: imds\r\n" + head + b"\r\n")
        answer = _read_until_closed(sock)
    assert _status(answer) in {431, 400, None}, answer[:200]
    assert b'"id"' not in answer
    _good_client_is_served(server)


def test_unfinished_20mb_heads_on_20_connections_keep_memory_bounded(server):
    """20 connections each sending a never-ending 20 MB header grow the server by less than the bound."""
    before = _rss_kb(server.process.pid)
    chunk = b"a" * 65536

    def flood() -> None:
        with _connect(server) as sock:
            _send_quietly(sock, b"GET /metadata HTTP/1.1\r\nHost: imds\r\nX-Flood: ")
            for _ in range(20 * 1024 * 1024 // len(chunk)):
                try:
                    sock.sendall(chunk)
                except OSError:  # cut off by the server: the head limit worked
                    return

    threads = [threading.Thread(target=flood) for _ in range(20)]
    for thread in threads:
        thread.start()
    peak = before
    for thread in threads:  # one RSS sample per SAMPLE_EVERY while any flood is still sending
        while thread.is_alive():
            peak = max(peak, _rss_kb(server.process.pid))
            thread.join(timeout=SAMPLE_EVERY)
    for thread in threads:
        thread.join(timeout=CLOSE_WITHIN)
    peak = max(peak, _rss_kb(server.process.pid))
    print(f"RSS {before} kB -> peak {peak} kB")  # noqa: T201 - the figure the issue asks to report (pytest -s)
    assert peak - before < RSS_GROWTH_BOUND_KB, f"RSS grew {peak - before} kB"
    _good_client_is_served(server)


def _admin_post(rest: bytes) -> bytes:
    """An authorised JSON POST /device-metadata head; ``rest`` is its framing header and the start of a body."""
    return (b"POST /device-metadata HTTP/1.1\r\nHost: imds\r\nAuthorization: Bearer " + ADMIN_TOKEN.encode()
            + b"\r\nContent-Type: application/json\r\n" + rest)


def test_an_endless_chunk_is_cut_after_the_body_timeout(server):
    """A chunk declared FFFFFFFFFFFFFFFF (then silence) gets a 4xx and a closed connection, not a held one."""
    with _connect(server) as sock:
        _send_quietly(sock, _admin_post(b'Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n{"id": '))
        answer = _read_until_closed(sock)  # returns once the server closes; the socket timeout bounds it
    assert _status(answer) in {400, 408, 413}, answer[:200]
    _good_client_is_served(server)


def test_a_trickled_body_is_cut_after_the_body_timeout(server):
    """A body declared with Content-Length that never arrives: 408 with a JSON body naming the flag."""
    with _connect(server) as sock:
        _send_quietly(sock, _admin_post(b"Content-Length: 1000\r\n\r\n{"))
        answer = _read_until_closed(sock)
    assert _status(answer) == 408, answer[:300]
    assert b"--body-timeout" in answer


def test_slowloris_connections_are_closed_while_a_good_client_is_served(server):
    """Heads sent one header at a time are closed after the header timeout; others are answered meanwhile."""
    slow = [_connect(server) for _ in range(MAX_CONNECTIONS // 2)]
    try:
        for sock in slow:
            _send_quietly(sock, b"GET /metadata HTTP/1.1\r\nHost: imds\r\n")
        _good_client_is_served(server)
        for sock in slow:
            _send_quietly(sock, b"X-Still-Here: 1\r\n")
        _good_client_is_served(server)
        for sock in slow:  # each recv is bounded by the socket timeout: a held connection fails the test
            assert _status(_read_until_closed(sock)) in {None, 408}
    finally:
        for sock in slow:
            sock.close()


def test_open_connections_are_bounded_and_drain(server):
    """150 idle connections against a cap of 40: the server holds at most ~40 sockets, then serves again."""
    pid = server.process.pid
    baseline = _socket_fds(pid)
    idle = [_connect(server) for _ in range(150)]
    try:
        deadline = time.monotonic() + FD_WATCH
        most = 0
        while time.monotonic() < deadline:
            most = max(most, _socket_fds(pid) - baseline)
            time.sleep(SAMPLE_EVERY)
        assert most <= MAX_CONNECTIONS + 2, f"{most} sockets open"
        _good_client_is_served(server)  # queued behind the idle ones, answered once header timeouts free slots
    finally:
        for sock in idle:
            sock.close()


def test_ambiguous_framing_is_not_desynchronised(server):
    """CL+TE and conflicting Content-Lengths never let a second, smuggled request through."""
    smuggled = b"GET /metadata HTTP/1.1\r\nHost: imds\r\n\r\n"
    with _connect(server) as sock:
        _send_quietly(sock, (
            b"POST /device-metadata HTTP/1.1\r\nHost: imds\r\nContent-Length: " + str(len(smuggled) + 5).encode()
            + b"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled
        ))
        answer = _read_until_closed(sock)
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert DEMO_ID.encode() not in answer
    with _connect(server) as sock:
        _send_quietly(sock, (
            b"POST /device-metadata HTTP/1.1\r\nHost: imds\r\nContent-Length: 5\r\nContent-Length: 44\r\n\r\nhello"
            + smuggled
        ))
        answer = _read_until_closed(sock)
    assert _status(answer) == 400, answer
    assert answer.count(b"HTTP/1.1 ") == 1


def test_a_flooding_instance_gets_429_with_retry_after_and_others_are_unaffected(tmp_path):
    """Past its burst an address gets 429 + Retry-After (JSON body); another address is still served."""
    with serving(tmp_path, "--demo", "--db", "memory://", "--rate-limit", "0.5", "--rate-burst", "3") as limited:
        with client_at("127.0.0.1") as flood:
            answers = [flood.get(f"{limited.url}/metadata") for _ in range(5)]
        assert [a.status_code for a in answers[:3]] == [200, 200, 200]
        assert answers[0].json()["id"] == DEMO_ID
        assert answers[3].status_code == 429
        assert int(answers[3].headers["retry-after"]) >= 1
        assert "too many requests" in answers[3].json()["message"]
        with client_at("127.0.0.2") as other:
            answer = other.get(f"{limited.url}/metadata")
        assert answer.status_code == 404  # not rate limited: its own bucket, and no instance at that address
        with httpx.Client(timeout=5.0) as admin:  # the admin API is not behind the instance rate limit
            assert admin.get(f"{limited.url}/healthz").status_code == 200


def test_the_default_rate_limit_lets_a_whole_boot_through(tmp_path):
    """With the default limit (50/s, burst 200) a boot's crawl of ~150 reads from one address is all 200."""
    defaults = ("--demo", "--db", "memory://", "--rate-limit", "50", "--rate-burst", "200")
    with serving(tmp_path, *defaults) as running, client_at("127.0.0.1") as guest:
        listing = guest.get(f"{running.url}/latest/meta-data/").text.split()
        paths = [f"/latest/meta-data/{leaf}" for leaf in listing if not leaf.endswith("/")]
        crawl = (paths * (150 // max(len(paths), 1) + 1))[:150]
        statuses = {guest.get(f"{running.url}{path}").status_code for path in crawl}
        assert statuses == {200}
        assert guest.get(f"{running.url}/metadata").json()["id"] == DEMO_ID
