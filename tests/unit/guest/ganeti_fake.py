"""A fake metadata service for ``ganeti install`` unit tests: ``/ganeti/latest`` as the contract says.

GET routes serve fixed bytes (optionally without Content-Length, or cut short: the
declared length is larger than what is sent before the connection closes); ``POST
/ganeti/latest/write`` records each event body, answering 429 (``Retry-After: 0``) to the
first ``throttle`` posts and 500 to the states in ``refused``. Served on 127.0.0.1 from a
thread while the ``with`` block runs.
"""

from __future__ import annotations

import gzip
import io
import json
import shlex
import tarfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

PREFIX = "/ganeti/latest/"


@dataclass
class Route:
    """One GET answer: status and body; ``length`` overrides Content-Length (None: no header, close)."""

    status: int
    body: bytes
    length: int | bool | None = True  # True: the body's length


def environment_text(variables: dict[str, str]) -> bytes:
    """``os/environment`` as the contract serves it: sorted ``KEY=<shlex.quote(value)>`` lines."""
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(variables.items())).encode()


def tar_gz(*members: tuple[str, str, str | bytes, int]) -> bytes:
    """A tar.gz of (kind, name, data-or-linkname, mode) members; kind is file, dir, sym, hard or fifo."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for kind, name, extra, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "file":
                data = extra.encode() if isinstance(extra, str) else extra
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = str(extra)
            tar.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0)


class FakeService:
    """The fake service; ``events`` are the posted bodies, ``requests`` the GET paths."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.events: list[dict[str, Any]] = []
        self.requests: list[str] = []
        self.throttle = 0
        self.throttled = 0
        self.refused: set[str] = set()  # states answered with a 500
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def serve(self, leaf: str, body: bytes, status: int = 200, length: int | bool | None = True) -> None:
        """Answer ``GET /ganeti/latest/<leaf>``."""
        self.routes[PREFIX + leaf] = Route(status, body, length)

    def install(self, parameters: dict[str, str], environment: dict[str, str]) -> None:
        """parameters.json (all public) and os/environment."""
        document = {name: [value, "public"] for name, value in parameters.items()}
        self.serve("os/parameters.json", json.dumps(document).encode())
        self.serve("os/environment", environment_text(environment))

    def states(self) -> list[str]:
        return [event["state"] for event in self.events]

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def posted(self, event: dict[str, Any]) -> tuple[int, bytes, str | None]:
        """The answer to one event: 500 for a refused state, 429 while throttling, else stored."""
        if event.get("state") in self.refused:
            return 500, b'{"message": "store down"}', None
        if self.throttled < self.throttle:
            self.throttled += 1
            return 429, b'{"message": "slow down"}', "0"
        self.events.append(event)
        return 200, json.dumps({"cursor": len(self.events)}).encode(), None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake.requests.append(self.path)
                route = fake.routes.get(self.path, Route(404, b"404 - Not Found"))
                self.send_response(route.status)
                if route.length is True:
                    self.send_header("Content-Length", str(len(route.body)))
                elif route.length is not None and route.length is not False:
                    self.send_header("Content-Length", str(route.length))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(route.body)
                self.close_connection = True

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != PREFIX + "write":
                    self._answer(404, b"404 - Not Found")
                else:
                    self._answer(*fake.posted(json.loads(body)))

            def _answer(self, status: int, body: bytes, retry_after: str | None = None) -> None:
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
                """Silent: tests read ``events`` and ``requests``."""

        return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that left early is expected here."""
