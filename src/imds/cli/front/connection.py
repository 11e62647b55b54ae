"""One client connection of imds's own front: httptools parses; instance reads are answered in place.

The shape is uvicorn's ``HttpToolsProtocol`` (``uvicorn/protocols/http/httptools_impl.py``):
callbacks collect a request, one request is answered at a time, pipelined ones wait in
order (reading paused; ``imds.cli.front.turns``), ``FlowControl`` pauses the writer, and a request for the ASGI app
runs as uvicorn's own ``RequestResponseCycle`` task, its body streamed as it arrives. But:

- **Instance reads skip ASGI.** A GET or HEAD that ``InstanceFront.route`` gives an
  instance handler and the request limits pass untouched (``Bounded.untouched``: no body)
  runs ``InstanceFront.serve`` eagerly in the parser callback (so does an instance
  listener's IMDSv2 token PUT, ``InstanceFront.mints``, when it has no body: its limits
  and guards are ``serve``'s, as for a read), an ``Exchange`` as send and
  receive: a read that never waits is written before the callback returns; one that waits
  (a watch, a lookup, a stream) goes on in a task, later requests waiting their turn.
  A read the memo has (``InstanceFront.remembered``) is answered from it at once, and the
  same bytes asked again alone on the connection are answered without parsing (``_again``).
- **Limits uvicorn lacks.** The head is bounded by ``--max-header-bytes`` as it arrives
  (431: an endless header is cut off, never buffered); it must be complete within
  ``--header-timeout`` of the accept or of the previous answer, and an idle connection is
  closed after ``--keepalive-timeout`` (the server's tick checks deadlines: ``expired``).
- **HTTP/1.0 keep-alive** is honoured on the fast path; the ASGI path closes HTTP/1.0
  connections after each answer, as uvicorn does.

A malformed request gets a JSON 400 (status from ``imds.web.errors``) and the connection
closes after the answers before it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from imds.cli.front.exchange import Exchange
from imds.cli.front.held import Held
from imds.cli.front.request import asgi_cycle, scope_of
from imds.cli.front.shared import Shared
from imds.cli.front.turns import Hot, Item, Turns
from imds.cli.front.wire import recalled, refusal
from imds.cli.tally import Tally
from imds.errors import HeadTooLarge, ImdsError, InvalidInput
from imds.web.memo import Remembered

READS = {b"GET": "GET", b"HEAD": "HEAD"}  # the methods of the reads answered without ASGI
MINT = b"PUT"  # the method of the IMDSv2 token request, answered without ASGI too when it has no body
_DETACHED = httptools.HttpRequestParser(object())  # what a closed connection holds instead of its parser


class _Stop(Exception):
    """Raised in a parser callback to stop parsing: the connection was refused and is closing."""


class Connection(Turns, asyncio.Protocol):
    """One HTTP/1.1 connection (see the module docstring)."""

    __slots__ = ("_release", "client", "closing", "head_bytes", "head_size", "headers", "in_head", "messages",
                 "parser", "parsing", "recalled", "recalls", "repeat", "says_connection", "server", "shared", "tally",
                 "transport", "url")

    def __init__(self, shared: Shared, release: Callable[[], None], client: tuple[str, int],
                 server: tuple[str, int]) -> None:
        self.shared = shared
        self._release: Callable[[], None] | None = release  # gives the listener's connection slot back, once
        self.tally: Tally | None = None  # where the listener counted it (per source), if it does
        self.client = client
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        # As uvicorn: answer the requests before a "Connection: close" one, ignore what follows it.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl | None = None
        self.exchange: Exchange | None = None
        # the request being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0  # request line and header lines parsed so far, in bytes
        self.head_bytes = 0  # bytes received since the head began (bounds one never finished)
        self.says_connection = False  # the request has a Connection header
        self.in_head = False
        self.parsing: Item | None = None  # what the body and the message end go to
        # the requests being answered
        self.active: Hot | RequestResponseCycle | None = None
        self.queue: deque[Item] = deque()
        self.closing = False  # refused or stopping: read nothing more
        self.deadline = 0.0  # loop time the head (or the idle wait) must end by; 0: an answer is under way
        self.idle_since = 0.0
        self.recalls = shared.instance_listener(server)  # may answer from the read memo
        self.messages = 0  # requests completed in the chunk being parsed
        self.recalled: tuple[Remembered, str, bool] | None = None  # the last request answered from the memo
        self.repeat: tuple[bytes, Remembered, str, bool] | None = None  # its bytes, when they came alone

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast("asyncio.Transport", transport)  # a TCP transport (uvloop's is no asyncio.Transport subclass)
        held = self.transport
        if isinstance(held, Held):  # made on a Held transport first (imds.cli.front.held): the loop's takes over
            self.transport = transport
            flow = self._flowing()  # the loop's transport pauses and resumes the writer from now on
            if self.exchange is not None:
                self.exchange.retarget(transport, flow)
            held.attach(transport)
            return
        self.transport = transport
        self.idle_since = self.shared.loop.time()
        self.deadline = self.idle_since + self.shared.header_timeout  # the first head, from the accept
        if isinstance(transport, Held):  # the listener says if it outlives its accept (``outlives_accept``)
            return
        self._flowing()
        self.shared.connections.add(self)

    def outlives_accept(self) -> None:
        """What the listener read at the accept did not end the connection: it goes to the loop, counted here.

        Until then (one call of the listener's) it was in no list: nothing else could see it.
        """
        self.shared.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002 - the reason changes nothing
        self.closing = True
        self.queue.clear()
        active = self.active
        if isinstance(active, RequestResponseCycle):
            if not active.response_complete:
                active.disconnected = True
            active.message_event.set()
        if self.exchange is not None:
            self.exchange.gone()
        if self.flow is not None:
            self.flow.resume_writing()  # a writer waiting on drain sees the loss
        self.shared.closed(self)
        if self._freed() and self.tally is not None:
            self.tally.closed(self.client[0])

    def closed_at_accept(self) -> None:
        """The listener sent the whole answer and closed the socket at the accept (``answered_early``).

        Nothing waits on the connection then: it was in no list, no tally, no loop.
        """
        self.closing = True
        self._freed()

    def _freed(self) -> bool:
        """The parser let go of (it holds our callbacks: a cycle); the listener's slot given back, if not yet."""
        self.parser = _DETACHED  # without this cycle, refcounting frees us as soon as we are closed
        release, self._release = self._release, None
        if release is None:
            return False
        release()
        return True

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        repeat = self.repeat
        if repeat is not None and data == repeat[0] and self._again(repeat):
            return
        if self.parsing is None:  # between requests or in a head: this counts against the head limit
            self.head_bytes += len(data)
        self.messages = 0
        self.recalled = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):
                self.shared.logger.exception("front.callback_error")
                self._refuse(InvalidInput.one("request", "not a request imds can answer"))
            return
        except httptools.HttpParserUpgrade:  # an Upgrade request was answered (no upgrade): nothing follows
            self.closing = True
            return
        except httptools.HttpParserError as exc:
            self._refuse(InvalidInput.one("request", f"not a valid HTTP request ({str(exc)[:100]})"))
            return
        if self.in_head and self.head_bytes > self.shared.max_header_bytes:
            self._refuse(HeadTooLarge(self.shared.max_header_bytes))
        elif self.recalled is not None and self.messages == 1 and not self.in_head:
            self.repeat = (data, *self.recalled)  # one whole request, answered from the memo: see _again

    def eof_received(self) -> None:  # the transport closes once what is written has gone
        return

    def pause_writing(self) -> None:
        if self.flow is not None:
            self.flow.pause_writing()

    def resume_writing(self) -> None:
        if self.flow is not None:
            self.flow.resume_writing()

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.head_size = 0
        self.says_connection = False
        self.in_head = True
        if self.active is None:  # no longer idle: the head has the header timeout from the idle start
            self.deadline = self.idle_since + self.shared.header_timeout

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        name = name.lower()
        if name == b"connection":
            self.says_connection = True  # only then can an HTTP/1.0 request keep its connection
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_bytes = 0
        self.deadline = 0.0
        shared = self.shared
        if self.head_size + len(self.url) > shared.max_header_bytes:
            self._refuse(HeadTooLarge(shared.max_header_bytes))
            raise _Stop
        parser = self.parser
        method = parser.get_method()
        keep_alive = parser.should_keep_alive() and not shared.stopping
        fast = shared.fast
        # An instance read, or (on an instance listener) a bodiless PUT: answered in place if a token mint.
        direct = fast is not None and (method in READS or (method == MINT and self.recalls)) \
            and not parser.should_upgrade() and fast.untouched(self.headers)
        url = self.url  # a plain path (no query, no escapes, ASCII) is decoded once, for the memo and the scope
        path = url.decode("ascii") if url[:1] == b"/" and b"?" not in url and b"%" not in url and url.isascii() \
            else None
        # Remembered only when it is this request's turn now: behind others (pipelined), what it answers
        # may change before then (a write among them), so it waits as a read and ``serve`` recalls it.
        if direct and path is not None and self.recalls and self.active is None and not self.queue \
                and method in READS and self._recalled(method, path, keep_alive=keep_alive):
            return
        try:
            scope = scope_of(method, url, parser.get_http_version(), self.headers, client=self.client,
                             server=self.server, path=path)
        except InvalidInput as exc:
            self._refuse(exc)
            raise _Stop from None
        if direct:
            assert fast is not None  # noqa: S101 - direct says so
            handler = fast.route(scope)
            if handler is not None and (method != MINT or fast.mints(scope["path"])):
                self.parsing = (scope, handler, keep_alive)
                return
        assert self.transport is not None  # noqa: S101 - connected
        self.parsing = cycle = asgi_cycle(scope, self.transport, self._flowing(), shared.logger, shared.default_headers,
                                          keep_alive=keep_alive and not parser.should_upgrade(),
                                          on_response=self._cycle_answered)
        self._enqueue(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self.parsing
        if isinstance(cycle, RequestResponseCycle) and not cycle.response_complete:
            cycle.body += body
            if len(cycle.body) > HIGH_WATER_LIMIT and self.flow is not None:
                self.flow.pause_reading()
            cycle.message_event.set()

    def on_message_complete(self) -> None:
        self.messages += 1
        parsing, self.parsing = self.parsing, None
        if isinstance(parsing, (tuple, bytes)):
            self._enqueue(parsing)
        elif parsing is not None and not parsing.response_complete:
            parsing.more_body = False
            parsing.message_event.set()

    # -- answers from the memo (the rest of the answering: imds.cli.front.turns) ----------------------

    def _recalled(self, method: bytes, path: str, *, keep_alive: bool) -> bool:
        """Answer a repeated read of a plain ``path`` from the memo (``InstanceFront.remembered``): whether it did."""
        fast = self.shared.fast
        if fast is None:
            return False
        found = fast.remembered(self.client, path, READS[method], self.headers)
        if found is None:
            return False
        # HTTP/1.0 keeps a connection only when asked to (Connection: keep-alive): the version matters then only.
        http10 = keep_alive and self.says_connection and self.parser.get_http_version() == "1.0"
        head_only = method == b"HEAD"
        self.parsing = recalled(found, self.shared.date.line, head_only=head_only, keep_alive=keep_alive,
                                http10=http10)
        if keep_alive and not http10:
            self.recalled = (found, path, head_only)
        return True

    def _again(self, repeat: tuple[bytes, Remembered, str, bool]) -> bool:
        """The same bytes as a request answered from the memo, alone in their chunk: answer them so again.

        A poller (an agent asking every second, a load generator) sends the same request
        on its connection each time. If nothing is under way, the server is not stopping and
        the memo still gives the same answer for this caller and path (``InstanceFront.again``,
        which does the bookkeeping), the answer is written without parsing: the parser is
        between requests before and after a whole request, so skipping one changes nothing.
        """
        fast = self.shared.fast
        if self.active is not None or self.queue or self.in_head or self.shared.stopping or fast is None:
            return False
        _, found, path, head_only = repeat
        if not fast.again(self.client, path, found):
            self.repeat = None
            return False
        transport = self.transport
        if transport is not None:  # nothing is ahead of it: written at once, as _enqueue would
            transport.write(recalled(found, self.shared.date.line, head_only=head_only, keep_alive=True, http10=False))
            self._idle()
        return True

    def answered_early(self) -> bool:
        """On a Held transport: whether the connection has answered all it was sent and is closing."""
        held = self.transport
        return isinstance(held, Held) and held.closed and not held.aborted and self.active is None and not self.queue

    # -- refusals, timeouts, stopping ----------------------------------------------------------------

    def _refuse(self, exc: ImdsError) -> None:
        """Answer ``exc`` (JSON, status from ``imds.web.errors``) after the answers before it, then close."""
        self.closing = True
        self._enqueue(refusal(exc, self.shared.date.line))

    def expired(self, now: float) -> bool:
        """Close the connection if its head (or idle wait) is past its deadline; whether it did."""
        if self.deadline and now >= self.deadline and self.transport is not None:
            self.transport.close()
            return True
        return False

    def shutdown(self) -> None:
        """Stop: close now when idle, else after the answer under way (``connection: close`` if not yet sent).

        A request under way may still be receiving its body: reading goes on until it is answered.
        """
        active = self.active
        if active is None:
            if self.transport is not None:
                self.transport.close()
        elif isinstance(active, RequestResponseCycle):
            active.keep_alive = False
        elif self.exchange is not None:
            self.exchange.keep_alive = False
