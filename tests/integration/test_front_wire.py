"""imds's own front (``--server front``) on the wire: pipelining, split heads, HTTP/1.0, limits, timeouts.

Raw sockets against a real ``imds serve --server front`` process: the instance reads it
answers itself (first as the whole way, then from the read memo) and the requests it hands
to the ASGI app must come back in order, framed right, with every limit holding. Bodies
are checked, not only statuses. Timeouts are short (2 s) on the command line; every wait
is bounded by the socket timeout (``http_wire.TIMEOUT``), never by a sleep.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from factories import metadata_body, new_id
from helpers import wait_for
from http_wire import Answer, Reader, connect, drip, request, send_quietly
from serve_process import ADMIN_TOKEN, Server, client_at, metric, serving

DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"
DEMO_USERDATA = b"#!/bin/sh\necho 'hello from imds'\n"
FRONT = ("--server", "front", "--demo", "--db", "memory://", "--header-timeout", "2", "--keepalive-timeout", "2")
AUTH = f"Authorization: Bearer {ADMIN_TOKEN}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One front with short head and keep-alive timeouts; the demo instance answers 127.0.0.1."""
    with serving(tmp_path_factory.mktemp("front"), *FRONT) as running:
        yield running


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _is_demo_metadata(answer: Answer) -> bool:
    return answer.status == 200 and json.loads(answer.body)["id"] == DEMO_ID


def _reads() -> bytes:
    """Three instance reads of three flavors, pipelined."""
    return (request("GET", "/metadata") + request("GET", "/latest/meta-data/instance-id")
            + request("GET", "/openstack/latest/meta_data.json"))


def _check_reads(reader: Reader) -> None:
    assert _is_demo_metadata(reader.answer())
    leaf = reader.answer()
    assert (leaf.status, leaf.body) == (200, DEMO_ID.encode())
    document = reader.answer()
    assert document.status == 200
    assert json.loads(document.body)["uuid"] == DEMO_ID
    assert document.header("content-type") == "application/json"


def test_pipelined_reads_are_answered_in_order(server):
    """Three reads sent in one segment, twice (the whole way, then remembered): six answers, in order."""
    with connect(_port(server)) as sock:
        sock.sendall(_reads() + _reads())
        reader = Reader(sock)
        _check_reads(reader)
        _check_reads(reader)


def test_a_pipelined_mix_keeps_its_order_and_its_causality(server):
    """Read, ASGI probe, read, admin write, read: in order, and the last read sees the write before it."""
    instance_id, guest = new_id(), "127.0.0.41"
    body = json.dumps(metadata_body(instance_id, ips=[guest], hostname="before")).encode()
    changed = json.dumps(metadata_body(instance_id, ips=[guest], hostname="after")).encode()
    with connect(_port(server)) as admin:
        admin.sendall(request("POST", "/device-metadata", AUTH, "Content-Type: application/json", body=body))
        assert Reader(admin).answer().status == 200
    with connect(_port(server), source=guest) as sock:
        sock.sendall(request("GET", "/metadata") + request("GET", "/readyz") + request("GET", "/metadata")
                     + request("POST", "/device-metadata", AUTH, "Content-Type: application/json", body=changed)
                     + request("GET", "/latest/meta-data/hostname") + request("GET", "/metadata"))
        reader = Reader(sock)
        assert json.loads(reader.answer().body)["hostname"] == "before"
        ready = reader.answer()
        assert (ready.status, json.loads(ready.body)["status"]) == (200, "ready")
        assert json.loads(reader.answer().body)["hostname"] == "before"
        written = reader.answer()
        assert (written.status, json.loads(written.body)["applied"]) == (200, True)
        assert reader.answer().body == b"after"
        assert json.loads(reader.answer().body)["hostname"] == "after"


def test_a_head_arriving_byte_by_byte_is_answered(server):
    """A request head sent one byte per send is parsed whole and answered (twice: full, remembered)."""
    with connect(_port(server)) as sock:
        reader = Reader(sock)
        for _ in range(2):
            drip(sock, request("GET", "/metadata", "User-Agent: drip"))
            assert _is_demo_metadata(reader.answer())


def test_an_imdsv2_stream_cut_in_small_segments_is_answered_in_order(server):
    """Token PUT, then reads with the token, a forged token and a write, sent 5 bytes a segment: each answered right."""
    instance_id, guest = new_id(), "127.0.0.43"
    with connect(_port(server)) as admin:
        body = json.dumps(metadata_body(instance_id, ips=[guest], hostname="cut")).encode()
        admin.sendall(request("POST", "/device-metadata", AUTH, "Content-Type: application/json", body=body))
        assert Reader(admin).answer().status == 200
    changed = json.dumps(metadata_body(instance_id, ips=[guest], hostname="cut-again")).encode()
    with connect(_port(server), source=guest) as sock:
        reader = Reader(sock)
        sock.sendall(request("PUT", "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 60"))
        token = reader.answer()
        assert token.status == 200
        with_token = f"X-aws-ec2-metadata-token: {token.body.decode()}"
        stream = (request("GET", "/latest/meta-data/hostname", with_token)
                  + request("GET", "/latest/meta-data/instance-id", "X-aws-ec2-metadata-token: forged.token")
                  + request("POST", "/device-metadata", AUTH, "Content-Type: application/json", body=changed)
                  + request("HEAD", "/latest/meta-data/hostname", with_token)
                  + request("GET", "/latest/meta-data/hostname", with_token))
        for start in range(0, len(stream), 5):
            sock.sendall(stream[start:start + 5])
        assert reader.answer().body == b"cut"
        forged = reader.answer()
        assert forged.status == 401
        assert instance_id.encode() not in forged.body
        assert json.loads(reader.answer().body)["applied"] is True
        head = reader.answer(head=True)
        assert (head.status, head.header("content-length"), head.body) == (200, str(len(b"cut-again")), b"")
        assert reader.answer().body == b"cut-again"


def test_signatures_made_off_the_loop_are_answered_in_order_and_verify(server):
    """pkcs7, rsa2048 and signature (made on the signing thread while the read waits): pipelined and one-shot."""
    identity = "/latest/dynamic/instance-identity/"
    instance_id, guest = new_id(), "127.0.0.44"
    with connect(_port(server)) as admin:
        body = json.dumps(metadata_body(instance_id, ips=[guest], hostname="signed")).encode()
        admin.sendall(request("POST", "/device-metadata", AUTH, "Content-Type: application/json", body=body)
                      + request("GET", "/identity/certificate.pem"))
        reader = Reader(admin)
        assert reader.answer().status == 200
        certificate = x509.load_pem_x509_certificate(reader.answer().body)
    with connect(_port(server), source=guest) as sock:  # the first read of the tree queues both signatures
        sock.sendall(request("PUT", "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 60"))
        reader = Reader(sock)
        with_token = f"X-aws-ec2-metadata-token: {reader.answer().body.decode()}"
        sock.sendall(b"".join(request("GET", identity + name, with_token)
                              for name in ("signature", "document", "pkcs7", "rsa2048")))
        signature, document, pkcs7, rsa2048 = (reader.answer() for _ in range(4))
    assert json.loads(document.body)["instanceId"] == instance_id
    public_key = certificate.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    public_key.verify(base64.b64decode(signature.body), document.body, padding.PKCS1v15(), hashes.SHA256())
    assert pkcs7.status == 200
    assert pkcs7.body == rsa2048.body
    held = pkcs7_der(pkcs7.body)
    assert document.body in held  # the PKCS#7 holds the document it signs
    for name, expected in (("signature", signature.body), ("pkcs7", pkcs7.body)):  # one request per connection
        with connect(_port(server), source=guest) as sock:
            sock.sendall(request("GET", identity + name, with_token, "Connection: close"))
            again = Reader(sock).answer()
        assert (again.status, again.body) == (200, expected)


def pkcs7_der(served: bytes) -> bytes:
    """The DER of a served PKCS#7 (base64 in 64-character lines)."""
    lines = served.split(b"\n")
    assert all(len(line) <= 64 for line in lines)
    return base64.b64decode(b"".join(lines))


@pytest.mark.parametrize("path", ["/metadata", "/healthz"], ids=["instance-read", "asgi"])
def test_http10_closes_by_default(server, path):
    """HTTP/1.0 without keep-alive: the answer says ``connection: close`` and the server closes."""
    for _ in range(2):  # the first read goes the whole way, the second is remembered
        with connect(_port(server)) as sock:
            sock.sendall(request("GET", path, version="HTTP/1.0"))
            reader = Reader(sock)
            answer = reader.answer()
            assert answer.status == 200, answer
            assert answer.header("connection") == "close"
            assert reader.closed()


def test_http10_keeps_alive_when_asked(server):
    """HTTP/1.0 with ``Connection: keep-alive``: answered ``connection: keep-alive``, and the next request too."""
    with connect(_port(server)) as sock:
        reader = Reader(sock)
        for _ in range(3):
            sock.sendall(request("GET", "/metadata", "Connection: keep-alive", version="HTTP/1.0"))
            answer = reader.answer()
            assert _is_demo_metadata(answer)
            assert answer.header("connection") == "keep-alive"


def test_connection_close_ends_the_connection_after_its_answer(server):
    """HTTP/1.1 ``Connection: close`` (read, then remembered read): answered, then closed."""
    for _ in range(2):
        with connect(_port(server)) as sock:
            sock.sendall(request("GET", "/metadata", "Connection: close") + request("GET", "/metadata"))
            reader = Reader(sock)
            answer = reader.answer()
            assert _is_demo_metadata(answer)
            assert answer.header("connection") == "close"
            assert reader.closed()  # the pipelined request after "close" is never answered


def test_head_has_the_get_length_and_no_body(server):
    """HEAD answers the GET's headers (Content-Length of the body) and no body; pipelined framing holds."""
    get = httpx.get(f"{server.url}/metadata", timeout=15)
    with connect(_port(server)) as sock:
        sock.sendall(request("HEAD", "/metadata") + request("HEAD", "/metadata") + request("GET", "/metadata"))
        reader = Reader(sock)
        for _ in range(2):
            head = reader.answer(head=True)
            assert head.status == 200
            assert head.header("content-length") == str(len(get.content))
            assert head.header("etag") == get.headers["etag"]
            assert head.body == b""
        assert _is_demo_metadata(reader.answer())  # right after the two heads: no stray body bytes between


def test_an_oversized_head_is_431_naming_the_flag_and_closed(server):
    """A head over --max-header-bytes (16 KiB) gets a JSON 431 naming the flag, then the connection closes."""
    with connect(_port(server)) as sock:
        send_quietly(sock, request("GET", "/metadata", "X-Big: " + "a" * 20000))
        reader = Reader(sock)
        answer = reader.answer()
        assert answer.status == 431
        assert "--max-header-bytes" in answer.body.decode()
        assert reader.closed()
    with client_at("127.0.0.1") as guest:
        assert guest.get(f"{server.url}/metadata").json()["id"] == DEMO_ID


def test_an_endless_header_is_cut_off_as_it_arrives(server):
    """A header that never ends is refused once it passes the limit, not buffered: 431 and a closed connection."""
    with connect(_port(server)) as sock:
        send_quietly(sock, b"GET /metadata HTTP/1.1\r\nHost: imds\r\nX-Endless: ")
        for _ in range(64):  # 4 MiB unless cut off
            send_quietly(sock, b"b" * 65536)
        reader = Reader(sock)
        assert reader.answer().status == 431
        assert reader.closed()


def test_a_slow_head_is_closed_after_the_header_timeout_while_others_are_served(server):
    """A head still unfinished after --header-timeout (2 s) is closed; a normal read meanwhile is answered."""
    with connect(_port(server)) as slow:
        slow.sendall(b"GET /metadata HTTP/1.1\r\nHost: imds\r\n")
        with client_at("127.0.0.1") as guest:
            assert guest.get(f"{server.url}/metadata").json()["id"] == DEMO_ID
        slow.sendall(b"X-Still-Here: 1\r\n")  # a byte now and then does not extend the deadline
        assert Reader(slow).closed()  # bounded by the socket timeout: a held connection fails the test


def test_an_idle_keep_alive_connection_is_closed(server):
    """After an answer, a connection that sends nothing more is closed (--keepalive-timeout 2)."""
    with connect(_port(server)) as sock:
        sock.sendall(request("GET", "/metadata"))
        reader = Reader(sock)
        assert _is_demo_metadata(reader.answer())
        assert reader.closed()


def test_a_malformed_request_is_a_json_400_and_closed(server):
    """A request line the parser refuses gets a JSON 400 naming the request, then the connection closes."""
    with connect(_port(server)) as sock:
        sock.sendall(b"GET /metadata HTTP/1.1\r\nHost imds\r\n\r\n")
        reader = Reader(sock)
        answer = reader.answer()
        assert answer.status == 400
        assert json.loads(answer.body)["errors"][0]["field"] == "request"
        assert reader.closed()


def test_if_none_match_with_the_current_etag_is_304_without_a_body(server):
    """A read naming the current ETag gets 304 (ETag, no body); another ETag gets the 200 document."""
    with client_at("127.0.0.1") as guest:
        etag = guest.get(f"{server.url}/latest/meta-data/instance-id").headers["etag"]
        same = guest.get(f"{server.url}/latest/meta-data/instance-id", headers={"If-None-Match": etag})
        other = guest.get(f"{server.url}/latest/meta-data/instance-id", headers={"If-None-Match": '"other"'})
    assert (same.status_code, same.content, same.headers["etag"]) == (304, b"", etag)
    assert (other.status_code, other.content) == (200, DEMO_ID.encode())


def test_a_client_closing_mid_reply_leaves_the_server_serving(tmp_path):
    """Clients that reset the connection while a 6 MB answer is being written: no error, others served.

    The reads go the whole way once, then are remembered: both paths see the reset.
    """
    big = "#!/bin/sh\n" + "x" * (6 << 20)
    args = ("--server", "front", "--db", "memory://", "--max-body-bytes", str(16 << 20))
    with serving(tmp_path, *args) as running:
        instance_id = new_id()
        running.post("/device-metadata", metadata_body(instance_id, ips=["127.0.0.42"]))
        running.post("/device-userdata", {"id": instance_id, "ipAddresses": ["127.0.0.42"], "userdata": big})
        for _ in range(4):
            with connect(_port(running), source="127.0.0.42") as sock:
                sock.sendall(request("GET", "/userdata"))
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        with client_at("127.0.0.42") as guest:
            whole = guest.get(f"{running.url}/userdata", timeout=30)
        assert (whole.status_code, len(whole.content)) == (200, len(big))
        output = running.output()
    assert "Traceback" not in output
    assert '"level": "error"' not in output


def test_sigterm_ends_a_held_watch_within_the_grace_and_exits_0(tmp_path):
    """SIGTERM while a read waits for a change: accepting stops, the server exits 0 within the grace."""
    with serving(tmp_path, "--server", "front", "--demo", "--db", "memory://", "--shutdown-timeout", "2") as running:
        held: list[bytes] = []
        sock = connect(_port(running))
        sock.sendall(request("GET", "/metadata?wait_for_change=true&timeout_sec=60"))
        reader = threading.Thread(target=lambda: held.append(_drain(sock)), daemon=True)
        reader.start()
        wait_for(lambda: metric(running, "imds_watch_waiting") == 1, what="the read to be held")
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=30) == 0, running.output()
        reader.join(timeout=30)
        sock.close()
        assert '"stopping"' in running.output()
    assert held, "the held connection was never released"


def _drain(sock: socket.socket) -> bytes:
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except OSError:
        pass
    return received
