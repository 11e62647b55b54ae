"""A fake upstream source of truth on a real socket: hollow's lookup contract, an OIDC token endpoint.

``running_upstream()`` serves a ``FakeUpstream`` from an ``http.server`` in a background
thread on a free port of 127.0.0.1 and stops it on exit (every handler thread joined).

- Records: ``put_metadata`` / ``put_userdata`` answer ``GET /device-{kind}/{id}`` and
  ``GET /device-{kind}?ip_address={ip}`` for every listed address (hollow's 200 bodies);
  anything else is 404.
- Programmable answers: ``answer(target, status, body)`` for one request target (a path,
  or a path with its decoded query, e.g. ``/device-metadata?ip_address=fd00::1``), and
  ``fail_all(status)`` / ``hang_all()`` / ``recover()`` for every lookup route.
- ``HANG``: the request never gets an answer; the handler waits until teardown (bounded),
  then drops the connection, so no thread outlives the fake.
- ``hold()`` / ``release()``: requests wait at a gate, then answer normally (for counting
  what is in flight: ``in_flight``, ``max_in_flight``).
- OAuth2: ``enable_oauth()`` publishes ``/oauth/.well-known/openid-configuration`` and a
  client-credentials token endpoint; ``require_bearer()`` makes the lookup routes answer
  401 without a valid token; ``revoke_tokens()`` makes the issued ones invalid.
- ``calls`` logs every request (method, decoded path and query, raw target, headers, body).
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

HANG: Final = "hang"
HANG_LIMIT = 30.0  # a hanging handler gives up after this long even without teardown
OAUTH_ISSUER_PATH = "/oauth"
DISCOVERY_PATH = OAUTH_ISSUER_PATH + "/.well-known/openid-configuration"
TOKEN_PATH = OAUTH_ISSUER_PATH + "/token"
KINDS = ("metadata", "userdata")


@dataclass(frozen=True)
class Answer:
    """One programmed response."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"


@dataclass(frozen=True)
class Call:
    """One request the fake received."""

    method: str
    path: str
    query: dict[str, str]
    raw_target: str
    headers: dict[str, str]
    body: bytes

    @property
    def target(self) -> str:
        """The path with its decoded query, as ``answer`` keys it."""
        return _target(self.path, self.query)

    def form(self) -> dict[str, str]:
        """The body as an ``application/x-www-form-urlencoded`` form."""
        return dict(urllib.parse.parse_qsl(self.body.decode()))

    def basic_auth(self) -> tuple[str, str] | None:
        """The (user, password) of an HTTP basic ``Authorization`` header."""
        value = self.headers.get("authorization", "")
        if not value.startswith("Basic "):
            return None
        user, _, password = base64.b64decode(value[6:]).decode().partition(":")
        return urllib.parse.unquote(user), urllib.parse.unquote(password)


@dataclass
class OAuth:
    """The token endpoint's client and what it grants."""

    client_id: str
    client_secret: str
    expires_in: int | None
    issued: list[str] = field(default_factory=list)
    valid: set[str] = field(default_factory=set)


def _target(path: str, query: dict[str, str]) -> str:
    if not query:
        return path
    return path + "?" + "&".join(f"{k}={v}" for k, v in sorted(query.items()))


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


class FakeUpstream:
    """The fake's state; handler threads read and write it under ``lock``."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.issuer = self.base + OAUTH_ISSUER_PATH
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.errors: list[BaseException] = []
        self._records: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        self._answers: dict[str, Answer | str] = {}
        self._mode: Answer | str | None = None
        self._bearer: str | None = None
        self._oauth: OAuth | None = None
        self._released = threading.Event()  # set at teardown: hanging handlers give up
        self._gate = threading.Event()
        self._gate.set()

    # -- programming --------------------------------------------------------------------

    def put_metadata(
        self, instance_id: str, ips: list[str], document: dict[str, Any], *, as_string: bool = False
    ) -> dict[str, Any]:
        """Serve this metadata (as an object, or JSON-encoded in a string as hollow stores it)."""
        body = {"id": instance_id, "ipAddresses": ips, "metadata": json.dumps(document) if as_string else document}
        with self.lock:
            self._records["metadata"][instance_id] = body
        return body

    def put_userdata(self, instance_id: str, ips: list[str], userdata: bytes | str) -> dict[str, Any]:
        """Serve this userdata: bytes go out base64-encoded (hollow's wire format), text as is."""
        value = base64.b64encode(userdata).decode() if isinstance(userdata, bytes) else userdata
        body = {"id": instance_id, "ipAddresses": ips, "userdata": value}
        with self.lock:
            self._records["userdata"][instance_id] = body
        return body

    def remove(self, kind: str, instance_id: str) -> None:
        """Stop serving a record (404 from now on)."""
        with self.lock:
            self._records[kind].pop(instance_id, None)

    def answer(
        self, target: str, status: int | str, body: Any = None, *, content_type: str = "application/json"
    ) -> None:
        """Answer ``target`` with ``status`` (or ``HANG``) from now on; a non-bytes body is sent as JSON."""
        with self.lock:
            self._answers[target] = status if isinstance(status, str) else Answer(status, _body(body), content_type)

    def forget(self, target: str) -> None:
        """Drop the programmed answer for ``target``."""
        with self.lock:
            self._answers.pop(target, None)

    def fail_all(self, status: int = 500, body: Any = None) -> None:
        """Every lookup route answers ``status`` (the upstream is down)."""
        with self.lock:
            self._mode = Answer(status, _body(body if body is not None else {"error": "upstream is down"}))

    def hang_all(self) -> None:
        """Every lookup route hangs (until teardown)."""
        with self.lock:
            self._mode = HANG

    def recover(self) -> None:
        """Back to normal: records and programmed answers."""
        with self.lock:
            self._mode = None

    def hold(self) -> None:
        """Requests wait at a gate until ``release``."""
        self._gate.clear()

    def release(self) -> None:
        """Open the gate: held requests answer now."""
        self._gate.set()

    def require_static_bearer(self, token: str) -> None:
        """Lookup routes answer 401 unless ``Authorization: Bearer token``."""
        with self.lock:
            self._bearer = token

    def enable_oauth(self, client_id: str, client_secret: str, *, expires_in: int | None = 3600) -> None:
        """Publish the OIDC discovery document and a client-credentials token endpoint."""
        with self.lock:
            self._oauth = OAuth(client_id, client_secret, expires_in)

    def require_bearer(self) -> None:
        """Lookup routes answer 401 unless they carry a token the token endpoint issued (and not revoked)."""
        with self.lock:
            self._bearer = ""

    def revoke_tokens(self) -> None:
        """Every token issued so far stops working (the upstream will answer 401)."""
        with self.lock:
            assert self._oauth is not None
            self._oauth.valid.clear()

    # -- observing ------------------------------------------------------------------------

    def log(self, path_prefix: str = "/device-") -> list[Call]:
        """The calls so far whose path starts with ``path_prefix`` (the lookup routes by default)."""
        with self.lock:
            return [call for call in self.calls if call.path.startswith(path_prefix)]

    def count(self, path_prefix: str = "/device-") -> int:
        """How many calls so far (the lookup routes by default)."""
        return len(self.log(path_prefix))

    def tokens_issued(self) -> list[str]:
        """The access tokens the token endpoint gave out, in order."""
        with self.lock:
            return list(self._oauth.issued) if self._oauth else []

    # -- serving (handler threads) --------------------------------------------------------

    def _enter(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def _decide(self, call: Call) -> Answer | str:
        with self.lock:
            programmed = self._answers.get(call.target) or self._answers.get(call.path)
        if programmed is not None:
            return programmed
        if call.path in {DISCOVERY_PATH, TOKEN_PATH}:
            return self._oauth_answer(call)
        with self.lock:
            if self._mode is not None:
                return self._mode
            if not self._authorized(call):
                return Answer(401, _json({"error": "unauthorized"}))
            return self._record(call)

    def _authorized(self, call: Call) -> bool:
        if self._bearer is None:
            return True
        presented = call.headers.get("authorization", "")
        if self._bearer:
            return presented == f"Bearer {self._bearer}"
        return self._oauth is not None and presented.removeprefix("Bearer ") in self._oauth.valid

    def _record(self, call: Call) -> Answer:
        parts = call.path.strip("/").split("/")
        while parts and not parts[0].startswith("device-"):  # the base URL may carry a path prefix
            parts.pop(0)
        kind = parts[0].removeprefix("device-") if parts else ""
        if call.method != "GET" or kind not in KINDS or len(parts) > 2:
            return Answer(404, _json({"error": "not found"}))
        records = self._records[kind]
        if len(parts) == 2:
            found = records.get(parts[1])
        else:
            ip = call.query.get("ip_address")
            found = next((body for body in records.values() if ip in body["ipAddresses"]), None)
        return Answer(200, _json(found)) if found is not None else Answer(404, _json({"error": "not found"}))

    def _oauth_answer(self, call: Call) -> Answer:
        with self.lock:
            oauth = self._oauth
            if oauth is None:
                return Answer(404, _json({"error": "not found"}))
            if call.path == DISCOVERY_PATH:
                return Answer(200, _json({"issuer": self.issuer, "token_endpoint": self.base + TOKEN_PATH}))
            if call.method != "POST" or call.form().get("grant_type") != "client_credentials":
                return Answer(400, _json({"error": "unsupported_grant_type"}))
            if call.basic_auth() != (oauth.client_id, oauth.client_secret):
                return Answer(401, _json({"error": "invalid_client"}))
            token = f"access-{len(oauth.issued) + 1}"
            oauth.issued.append(token)
            oauth.valid.add(token)
            grant: dict[str, Any] = {"access_token": token, "token_type": "Bearer"}
            if oauth.expires_in is not None:
                grant["expires_in"] = oauth.expires_in
            return Answer(200, _json(grant))


def _body(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    return _json(body)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # a connection that never sends a request does not pin a thread

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        fake = self.server.fake
        split = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        call = Call(
            method=self.command,
            path=urllib.parse.unquote(split.path),
            query=dict(urllib.parse.parse_qsl(split.query)),
            raw_target=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=self.rfile.read(length) if length else b"",
        )
        fake._enter(call)
        try:
            fake._gate.wait(HANG_LIMIT)
            answer = fake._decide(call)
            if answer == HANG:
                fake._released.wait(HANG_LIMIT)
                self.close_connection = True
                return
            assert isinstance(answer, Answer)
            with contextlib.suppress(OSError):  # the client may have given up already
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
        finally:
            fake._leave()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: the tests read ``calls`` instead."""


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close joins every handler thread
    block_on_close = True
    fake: FakeUpstream

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ARG002 - the base class's signature
        """A client that went away is not an error of the fake; anything else fails the test at teardown."""
        error = sys.exc_info()[1]
        if error is not None and not isinstance(error, OSError):
            self.fake.errors.append(error)


@contextlib.contextmanager
def running_upstream() -> Iterator[FakeUpstream]:
    """Serve a FakeUpstream on a free port of 127.0.0.1 until the block exits."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.fake = FakeUpstream(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, name="fake-upstream")
    thread.start()
    try:
        yield server.fake
    finally:
        server.fake._released.set()
        server.fake.release()
        server.shutdown()
        server.server_close()
        thread.join(timeout=HANG_LIMIT)
    if server.fake.errors:
        raise server.fake.errors[0]
