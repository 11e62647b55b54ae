"""The IMDSv2 token-PUT rule's cases, shared by the tests of its three doors.

``imds serve`` (``integration/test_ec2_http.py``), ``imds proxy`` (``integration/test_proxy.py``)
and the agent's haproxy (``integration/test_agent_haproxy.py``) must all refuse a token PUT
that carries a forwarding header, on every path serve takes for the token path, and answer
the other spellings as serve does (404 or 405), never with a token. Also here: a raw HTTP/1.1
request (the target sent as given, from a chosen source address) and an upstream that
records every header it received, in order, duplicates included.
"""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
# The headers the rule names (the spec; tests/unit/services/test_token_rule.py holds the constant to it).
FORWARDING_NAMES = (
    "X-Forwarded-For", "Forwarded", "X-Real-IP", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port",
    "X-Client-IP", "True-Client-IP", "CF-Connecting-IP", "Client-IP",
)
# (name as a client spells it, value): each named header, a case variant, an empty value, any X-Forwarded-*.
FORWARDING = [
    *((name, "10.9.9.9") for name in FORWARDING_NAMES),
    ("x-FORWARDED-for", "10.9.9.9"),
    ("X-Forwarded-For", ""),
    ("X-Forwarded-Server", "relay.example"),
]
# Paths serve takes for the token path (it matches the decoded path; the query is not the path).
TOKEN_PATHS = [
    "/latest/api/token", "/latest/api/token/", "/latest//api/token", "/latest/api/token//",
    "/latest/api/%74oken", "/latest/api%2Ftoken", "/latest/api/token?x=1",
]
# On a real server a request may also name the token path in absolute form.
WIRE_TOKEN_PATHS = [*TOKEN_PATHS, "http://169.254.169.254/latest/api/token/"]
# Spellings that are not the token path: serve answers 404 or 405, with a forwarding header or without.
OTHER_PATHS = [
    "//latest/api/token", "/LATEST/api/token", "/latest/API/TOKEN", "/Latest/Api/Token", "/latest/api/token%0A",
]
REFUSED = (403, "text/plain; charset=utf-8", b"403 - Forbidden")

Answer = tuple[int, str, bytes]


def put(host: str, port: int, target: str, headers: dict[str, str], source: str) -> Answer:
    """``PUT target`` (sent exactly as given) from ``source``: (status, content type, body)."""
    connection = http.client.HTTPConnection(host, port, timeout=10.0, source_address=(source, 0))
    try:
        connection.putrequest("PUT", target, skip_accept_encoding=True)
        for name, value in {"Content-Length": "0", **headers}.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.getheader("content-type") or "", response.read()
    finally:
        connection.close()


def assert_answers_as_serve(port: int, server_port: int, forwarding: tuple[str, str], path: str, source: str) -> None:
    """A token PUT with a forwarding header through the front on ``port`` answers as serve on ``server_port`` does.

    That is serve's 403 on every spelling of the token path, and serve's own 404/405 elsewhere.
    """
    headers = {TTL: "60", forwarding[0]: forwarding[1]}
    through = put("127.0.0.1", port, path, headers, source)
    direct = put("127.0.0.1", server_port, path, headers, source)
    assert through == direct
    if path in WIRE_TOKEN_PATHS:
        assert through == REFUSED
    else:
        assert through[0] in {404, 405}


@dataclass
class Recorder:
    """What the recording upstream received: one list of (lower-case name, value) per request."""

    url: str
    requests: list[list[tuple[str, str]]] = field(default_factory=list)

    def last(self, name: str) -> list[str]:
        """Every value of header ``name`` in the last request, in order."""
        return [value for key, value in self.requests[-1] if key == name.lower()]


@contextmanager
def recording_upstream() -> Iterator[Recorder]:
    """An HTTP server on a free port of 127.0.0.1 that answers ``200 ok`` and records each request's headers."""
    recorder = Recorder("")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            recorder.requests.append([(name.lower(), value) for name, value in self.headers.items()])
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        do_GET = do_PUT = do_POST = _answer  # noqa: N815 - http.server's naming

        def log_message(self, *_args: object) -> None:
            """Quiet: the tests read ``requests``."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10.0)
