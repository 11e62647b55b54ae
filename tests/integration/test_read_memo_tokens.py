"""IMDSv2 reads from the read memo, through real ``imds serve`` processes (front, granian, uvicorn), on the wire.

Every GET of an IMDSv2 crawl carries ``X-aws-ec2-metadata-token``; once a path is remembered
for the caller, such a read is answered from the memo when the token is valid for that
instance now (``imds.web.memo``, the EC2 flavor's ``TokenGate``). Here the answers are raw
bytes off the socket: a token read repeated on one connection (the front answers the
repeat without parsing), on new connections, and one that always goes the whole way (an
``If-None-Match`` naming no ETag: the same 200, never recalled) must be the same bytes but
for ``date`` and the TTL's seconds. Tokens are minted by the test too, with the server's key
(``--imdsv2-key-file``) and an earlier clock, so an expired token and a TTL's count are
exact. The in-process tests (``tests/unit/web/test_read_memo_tokens.py``) show the reads are
recalled (the flavor's read does not run) with a fake clock.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from factories import metadata_body, new_id
from http_wire import connect, request
from imds.services.identity.tokens import TokenIssuer
from serve_process import Server, client_at, metric, serving

SERVERS = ["front", "granian", "uvicorn"]
KEY = b"read-memo-tokens-test-key-32-byt"
TOKEN, TTL = "X-aws-ec2-metadata-token", "X-aws-ec2-metadata-token-ttl-seconds"
GUEST, OTHER = "127.0.4.11", "127.0.4.12"
PATHS = ["/latest/meta-data/hostname", "/2021-03-23/meta-data/", "/latest/user-data",
         "/2021-03-23/dynamic/instance-identity/document"]
_DATE = re.compile(rb"\r\ndate: [^\r]*", re.IGNORECASE)
_TTL = re.compile(rb"\r\nx-aws-ec2-metadata-token-ttl-seconds: (\d+)", re.IGNORECASE)


@contextmanager
def _serve(tmp_path: Path, kind: str, *extra: str) -> Iterator[tuple[Server, dict[str, str]]]:
    key = tmp_path / "imdsv2.key"
    key.write_bytes(KEY)
    args = ("--server", kind, "--db", "memory://", "--imdsv2-key-file", str(key), "--log-instance-reads", *extra)
    with serving(tmp_path, *args) as running:
        ids = {GUEST: new_id(), OTHER: new_id()}
        for address, instance_id in ids.items():
            running.post("/device-metadata", metadata_body(instance_id, ips=[address], hostname=f"h-{address}"))
            running.post("/device-userdata", {"id": instance_id, "ipAddresses": [address], "userdata": "#!/bin/sh\n"})
        yield running, ids


@pytest.fixture(scope="module", params=SERVERS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, dict[str, str]]]:
    """One server of each kind with two instances (GUEST, OTHER), tokens optional, reads logged."""
    with _serve(tmp_path_factory.mktemp(f"memo-tokens-{request.param}"), request.param) as running:
        yield running


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _raw(sock: socket.socket) -> bytes:
    """One whole response off ``sock``, as it came (head and ``content-length`` body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a whole head: {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"\r\ncontent-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the whole body"
        body += chunk
    assert len(body) == length, "more than one answer came back"
    return head + b"\r\n\r\n" + body


def _ask(server: Server, path: str, *headers: str, times: int = 1, source: str = GUEST) -> list[bytes]:
    """``times`` answers to the same GET on one connection, each sent after the previous answer."""
    with connect(_port(server), source=source) as sock:
        answers = []
        for _ in range(times):
            sock.sendall(request("GET", path, *headers))
            answers.append(_raw(sock))
        return answers


def _token(server: Server, source: str = GUEST, ttl: int = 21600) -> str:
    with client_at(source) as vm:
        answer = vm.put(f"{server.url}/latest/api/token", headers={TTL: str(ttl)})
    assert answer.status_code == 200, answer.text
    return answer.text


def _minted(instance_id: str, ttl: int, *, ago: int) -> str:
    """A token with the server's key, minted ``ago`` seconds back for ``ttl`` seconds."""
    return TokenIssuer(KEY, clock=lambda: time.time() - ago).issue(instance_id, ttl)


def _masked(answer: bytes, ttl: int) -> bytes:
    """``answer`` with its date and its TTL's seconds masked; the TTL must be there, within a few seconds of ``ttl``."""
    found = _TTL.search(answer)
    assert found is not None, answer[:300]
    assert ttl - 10 <= int(found.group(1)) <= ttl, answer[:300]
    return _TTL.sub(b"\r\nx-aws-ec2-metadata-token-ttl-seconds: N", _DATE.sub(b"\r\ndate: D", answer), count=1)


@pytest.mark.parametrize("path", PATHS)
def test_a_token_read_is_the_same_bytes_remembered_or_not(served, path):
    """Whole way, first read, repeats on one connection and on new ones: the same bytes but date and TTL."""
    server, ids = served
    token = _token(server)
    bearer = f"{TOKEN}: {token}"
    whole = _ask(server, path, bearer, 'If-None-Match: "not-it"')[0]
    assert whole.startswith(b"HTTP/1.1 200 OK\r\n"), whole[:300]
    assert b"etag: " in whole.lower()
    if path.endswith("hostname"):
        assert whole.endswith(f"h-{GUEST}".encode())
    if path.endswith("document"):
        assert ids[GUEST].encode() in whole
    reads = [*_ask(server, path, bearer, times=4), *_ask(server, path, bearer), *_ask(server, path, bearer)]
    expected = _masked(whole, 21600)
    assert [_masked(answer, 21600) for answer in reads] == [expected] * len(reads)
    again = _ask(server, path, 'If-None-Match: "not-it"')[0]  # tokenless, whole way: no TTL header, the rest the same
    assert _DATE.sub(b"\r\ndate: D", again) == expected.replace(b"\r\nx-aws-ec2-metadata-token-ttl-seconds: N", b"")


def test_a_head_with_a_token_is_the_get_without_its_body(served):
    server, _ = served
    path = PATHS[0]
    bearer = f"{TOKEN}: {_token(server)}"
    get = _masked(_ask(server, path, bearer, times=2)[1], 21600)
    with connect(_port(server), source=GUEST) as sock:
        for _ in range(2):
            sock.sendall(request("HEAD", path, bearer))
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(65536)
                assert chunk
                head += chunk
            assert _masked(head, 21600) == get[:get.index(b"\r\n\r\n") + 4]


def test_bad_tokens_are_401_after_the_path_is_remembered(served):
    """Expired, another instance's, forged, or a key's not the server's: 401 on a remembered path; the good one 200."""
    server, ids = served
    path = PATHS[0]
    good = f"{TOKEN}: {_token(server)}"
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in _ask(server, path, good, times=3))
    expired = _minted(ids[GUEST], 60, ago=120)
    others = _token(server, source=OTHER)
    foreign = TokenIssuer(b"another-key-entirely-of-32-bytes").issue(ids[GUEST], 600)
    for bad in (expired, others, _minted(ids[OTHER], 600, ago=0), foreign, _token(server) + "x"):
        for answer in _ask(server, path, f"{TOKEN}: {bad}", times=2):
            assert answer.startswith(b"HTTP/1.1 401 "), (bad, answer[:300])
            assert answer.endswith(b"\r\n\r\n401 - Unauthorized")
            assert _TTL.search(answer) is None
    assert _ask(server, path, good)[0].endswith(f"h-{GUEST}".encode())


def test_each_token_says_its_own_ttl_on_a_remembered_path(served):
    """Tokens minted at different moments, read in turns on a remembered path: each answer says its token's time."""
    server, ids = served
    path = PATHS[0]
    _ask(server, path, f"{TOKEN}: {_token(server)}", times=2)
    tokens = {200: _minted(ids[GUEST], 300, ago=100), 50: _minted(ids[GUEST], 300, ago=250),
              3000: _minted(ids[GUEST], 3600, ago=600)}
    for _ in range(2):
        for left, token in tokens.items():
            for answer in _ask(server, path, f"{TOKEN}: {token}", times=2):
                _masked(answer, left)  # asserts the TTL is its token's, within a few seconds


def test_remembered_token_reads_are_counted_and_logged(served):
    """Hollow's hit counter, the instance tally and the read log count every token read."""
    server, _ = served
    path = "/latest/meta-data/local-hostname"
    bearer = f"{TOKEN}: {_token(server)}"
    hits, ok = metric(server, "metadata_cache_hit_total"), _instance_answers(server, "200")
    reads = [*_ask(server, path, bearer, times=5), *_ask(server, path, bearer, times=2)]
    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in reads)
    assert metric(server, "metadata_cache_hit_total") - hits == len(reads)
    assert _instance_answers(server, "200") - ok == len(reads)
    logged = [line for line in server.output().splitlines()
              if '"instance.read"' in line and f'"peer": "{GUEST}"' in line and f'"path": "{path}"' in line]
    assert len(logged) == len(reads)


def _instance_answers(server: Server, status: str) -> float:
    with client_at() as client:
        text = client.get(f"{server.url}/metrics", headers=server.admin_headers).text
    wanted = f'imds_http_requests_total{{group="instance",status="{status}"}} '
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted)), 0.0)


@pytest.mark.parametrize("kind", ["front", "granian"])
def test_required_mode_keeps_a_tokenless_read_401_after_token_reads(tmp_path, kind):
    """--imdsv2 required: token reads are answered (and remembered); a read without one stays 401."""
    with _serve(tmp_path, kind, "--imdsv2", "required") as (server, ids):
        path = PATHS[0]
        bearer = f"{TOKEN}: {_token(server)}"
        assert all(a.endswith(f"h-{GUEST}".encode()) for a in _ask(server, path, bearer, times=3))
        for answer in _ask(server, path, times=2):
            assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]
            assert answer.endswith(b"\r\n\r\n401 - Unauthorized")
        expired = f"{TOKEN}: {_minted(ids[GUEST], 60, ago=61)}"
        assert _ask(server, path, expired)[0].startswith(b"HTTP/1.1 401 ")
