"""The IMDSv2 token PUT on imds's own front, over real sockets: answered in place as reads are, framed the same.

A bodiless ``PUT /latest/api/token`` is answered by the front through ``InstanceFront.serve``
(``imds.cli.front.connection``; the unit tests in ``tests/unit/cli/test_front_connection.py``
watch that the ASGI app is not called); one with a body is still the ASGI app's. Either
way the client must see the same answer: the token, the TTL header, the plain 400 and
403 refusals, pipelining in order, HTTP/1.0 and ``Connection: close`` as for a read, and a
token that reads afterwards. Bodies and headers are checked, not only statuses. One
difference from the ASGI path is meant: an HTTP/1.0 PUT asking to keep its connection
keeps it, as a read does (uvicorn's cycle closes every HTTP/1.0 connection).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from factories import metadata_body, new_id
from http_wire import Answer, Reader, connect, drip, request, send_quietly
from serve_process import Server, client_at, serving

DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"
TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
FRONT = ("--server", "front", "--demo", "--db", "memory://", "--imdsv2", "optional", "--max-body-bytes", "4096",
         "--header-timeout", "5", "--keepalive-timeout", "5")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One front serving the demo instance at 127.0.0.1."""
    with serving(tmp_path_factory.mktemp("front-token"), *FRONT) as running:
        yield running


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _put(*headers: str, path: str = "/latest/api/token", version: str = "HTTP/1.1", body: bytes = b"") -> bytes:
    return request("PUT", path, *headers, version=version, body=body)


def _token(answer: Answer, ttl: str = "60") -> str:
    """The token of a mint's answer, after checking the answer is one."""
    assert (answer.status, answer.header(TTL), answer.header("content-type")) == (200, ttl, "text/plain; charset=utf-8")
    assert answer.header("etag") is None  # a token is no version of the instance's document
    assert re.fullmatch(r"[A-Za-z0-9_\-.]{40,}", answer.body.decode()), answer.body
    return answer.body.decode()


def _read_with_token(reader: Reader, ttl: int = 60) -> None:
    """The next answer is the demo's instance id, read with a token (its TTL header counting down)."""
    answer = reader.answer()
    assert (answer.status, answer.body) == (200, DEMO_ID.encode()), answer
    assert 0 < int(answer.header(TTL) or "0") <= ttl


def _instance_requests(server: Server, status: str) -> float:
    """``imds_http_requests_total`` of the instance group for ``status``."""
    with client_at() as client:
        text = client.get(f"{server.url}/metrics", headers=server.admin_headers).text
    wanted = f'imds_http_requests_total{{group="instance",status="{status}"}} '
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted)), 0.0)


def test_a_token_put_mints_a_token_that_reads_and_is_counted(server):
    """PUT, then a read with the token (TTL left in its header), then a forged one (401): one connection."""
    before = _instance_requests(server, "200")
    with connect(_port(server)) as sock:
        reader = Reader(sock)
        sock.sendall(_put(f"{TTL}: 60"))
        token = _token(reader.answer())
        sock.sendall(request("GET", "/latest/meta-data/instance-id", f"{TOKEN}: {token}")
                     + request("GET", "/latest/meta-data/instance-id", f"{TOKEN}: forged.token"))
        _read_with_token(reader)
        forged = reader.answer()
        assert (forged.status, forged.body) == (401, b"401 - Unauthorized")
    assert _instance_requests(server, "200") - before == 2  # the mint and the read: the instance tally's


def test_pipelined_puts_and_reads_are_answered_in_order(server):
    """PUT, read, PUT with a body (the ASGI app's), chunked PUT, read, PUT: six answers in order, each token good."""
    with connect(_port(server)) as sock:
        reader = Reader(sock)
        sock.sendall(_put(f"{TTL}: 60") + request("GET", "/latest/meta-data/instance-id")
                     + _put(f"{TTL}: 120", body=b"ignored")
                     + _put(f"{TTL}: 30", "Transfer-Encoding: chunked") + b"5\r\nchunk\r\n0\r\n\r\n"
                     + request("GET", "/latest/meta-data/hostname") + _put(f"{TTL}: 90", "Content-Length: 0"))
        first = _token(reader.answer())
        plain = reader.answer()
        assert (plain.status, plain.body, plain.header(TTL)) == (200, DEMO_ID.encode(), None)
        tokens = [first, _token(reader.answer(), "120"), _token(reader.answer(), "30")]
        assert reader.answer().body == b"metadata-example-01"
        tokens.append(_token(reader.answer(), "90"))
        assert len(set(tokens)) == len(tokens)
        sock.sendall(b"".join(request("GET", "/latest/meta-data/instance-id", f"{TOKEN}: {token}") for token in tokens))
        for _ in tokens:
            _read_with_token(reader, 120)


def test_a_token_put_split_in_small_segments_is_answered_once_whole(server):
    """A PUT one byte per send, then PUT and read cut 3 bytes a segment: answered once each, in order."""
    with connect(_port(server)) as sock:
        reader = Reader(sock)
        drip(sock, _put(f"{TTL}: 60", "User-Agent: drip"))
        token = _token(reader.answer())
        stream = _put(f"{TTL}: 45") + request("GET", "/latest/meta-data/instance-id", f"{TOKEN}: {token}")
        for start in range(0, len(stream), 3):
            sock.sendall(stream[start:start + 3])
        _token(reader.answer(), "45")
        _read_with_token(reader)


@pytest.mark.parametrize(("headers", "status", "body"), [
    ((f"{TTL}: 0",), 400, b"400 - Bad Request"),
    ((f"{TTL}: 1.5",), 400, b"400 - Bad Request"),
    ((), 400, b"400 - Bad Request"),
    ((f"{TTL}: 60", "X-Forwarded-For: 127.0.0.1"), 403, b"403 - Forbidden"),
    ((f"{TTL}: 60", "Forwarded: for=127.0.0.1"), 403, b"403 - Forbidden"),
], ids=["ttl-0", "ttl-fraction", "no-ttl", "x-forwarded-for", "forwarded"])
def test_a_refused_token_put_is_the_plain_ec2_answer_and_the_connection_goes_on(server, headers, status, body):
    """A bad TTL or a proxy's header: EC2's plain text, no token, no TTL header; the next request is answered."""
    with connect(_port(server)) as sock:
        reader = Reader(sock)
        sock.sendall(_put(*headers) + request("GET", "/latest/meta-data/instance-id"))
        refused = reader.answer()
        assert (refused.status, refused.body, refused.header(TTL)) == (status, body, None)
        assert reader.answer().body == DEMO_ID.encode()


def test_a_token_put_with_a_body_is_still_bounded_by_the_request_limits(server):
    """Bodies are the ASGI app's: over --max-body-bytes is 413; an ambiguous length, the parser's 400; both close."""
    with connect(_port(server)) as sock:
        send_quietly(sock, _put(f"{TTL}: 60", body=b"x" * 5000))
        reader = Reader(sock)
        too_big = reader.answer()
        assert too_big.status == 413
        assert "--max-body-bytes" in too_big.body.decode()
        assert reader.closed()
    with connect(_port(server)) as sock:
        sock.sendall(_put(f"{TTL}: 60", "Content-Length: 0", "Content-Length: 0"))
        reader = Reader(sock)
        twice = reader.answer()
        assert (twice.status, json.loads(twice.body)["errors"][0]["field"]) == (400, "request")
        assert reader.closed()


@pytest.mark.parametrize(("version", "headers", "kept"), [
    ("HTTP/1.0", (), False),
    ("HTTP/1.0", ("Connection: keep-alive",), True),
    ("HTTP/1.1", ("Connection: close",), False),
], ids=["http10", "http10-keep-alive", "connection-close"])
def test_a_token_put_keeps_or_closes_its_connection_as_a_read_does(server, version, headers, kept):
    """HTTP/1.0 closes unless asked to keep alive; ``Connection: close`` closes (the request after it unanswered)."""
    with connect(_port(server)) as sock:
        reader = Reader(sock)
        sock.sendall(_put(f"{TTL}: 60", *headers, version=version)
                     + request("GET", "/latest/meta-data/instance-id", *headers, version=version))
        answer = reader.answer()
        token = _token(answer)
        if kept:
            assert answer.header("connection") == "keep-alive"
            assert reader.answer().body == DEMO_ID.encode()
        else:
            assert answer.header("connection") == "close"
            assert reader.closed()
    with connect(_port(server)) as sock:
        sock.sendall(request("GET", "/latest/meta-data/instance-id", f"{TOKEN}: {token}", "Connection: close"))
        _read_with_token(Reader(sock))


def test_a_token_from_a_written_instance_is_bound_to_it(server):
    """A new instance's PUT (from its own address) mints a token for it alone: the demo's address cannot use it."""
    instance_id, guest = new_id(), "127.0.0.61"
    server.post("/device-metadata", metadata_body(instance_id, ips=[guest], hostname="minted"))
    with connect(_port(server), source=guest) as sock:
        reader = Reader(sock)
        sock.sendall(_put(f"{TTL}: 60"))
        token = _token(reader.answer())
        sock.sendall(request("GET", "/latest/meta-data/hostname", f"{TOKEN}: {token}"))
        answer = reader.answer()
        assert (answer.status, answer.body) == (200, b"minted")
    with connect(_port(server)) as sock:
        sock.sendall(request("GET", "/latest/meta-data/hostname", f"{TOKEN}: {token}"))
        assert Reader(sock).answer().status == 401
