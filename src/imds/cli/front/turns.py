"""The answering half of a front connection: one request answered at a time, the rest waiting their turn.

A connection (``imds.cli.front.connection``) parses requests as they arrive and hands each
to ``_enqueue`` as what answers it: an instance read to run in place (``Hot``: its scope,
handler and keep-alive), uvicorn's ``RequestResponseCycle`` for the ASGI app (run in a
task), or a whole answer ready to write (bytes; ``Last``: the connection closes after
it). The first starts at once; the others wait in order, reading paused meanwhile
(``FlowControl``), until the one under way (``active``) is answered. An instance read runs
``InstanceFront.serve`` eagerly (``imds.cli.front.eager``) with the connection's
``Exchange`` as its send and receive: written before the parser callback returns unless it
has to wait, then it goes on in a task and the next request waits for it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from imds.cli.front import eager
from imds.cli.front.exchange import Exchange
from imds.cli.front.wire import Last
from imds.web.routing import Handler, Scope

if TYPE_CHECKING:
    from imds.cli.front.shared import Shared

Hot = tuple[Scope, Handler, bool]  # an instance request answered in place: its scope, its handler, keep-alive
# What waits its turn: an instance read to run, an ASGI request, or a whole answer ready to write
# (bytes: a remembered read; Last: the same, or a refusal, then the connection closes).
Item = Hot | RequestResponseCycle | bytes


class Turns:
    """Answers a connection's requests in order (see the module docstring); ``Connection`` is the rest."""

    __slots__ = ("active", "deadline", "exchange", "flow", "idle_since", "queue")
    # The connection's, set by it: what it shares with the process, its transport, whether a head is under way.
    shared: Shared
    transport: asyncio.Transport | None
    in_head: bool
    # Set by the connection first, then kept here.
    flow: FlowControl | None
    exchange: Exchange | None
    active: Hot | RequestResponseCycle | None  # the request whose answer is under way
    queue: deque[Item]  # the requests waiting their turn
    idle_since: float
    deadline: float  # loop time the head (or the idle wait) must end by; 0: an answer is under way

    def _flowing(self) -> FlowControl:
        """The connection's ``FlowControl``, made when first needed (an answer that ends at the accept needs none)."""
        flow = self.flow
        if flow is None:
            assert self.transport is not None  # noqa: S101 - connected
            flow = self.flow = FlowControl(self.transport)
        return flow

    def _enqueue(self, item: Item) -> None:
        """Start ``item`` now if nothing is ahead of it, else queue it (reading paused meanwhile)."""
        if self.active is None and not self.queue:
            self._start(item)
            if self.active is None:  # answered already (an instance read, a remembered one)
                self._idle()
        else:
            self.queue.append(item)
            if self.transport is not None:
                self._flowing().pause_reading()

    def _start(self, item: Item) -> None:
        """Begin answering ``item``; ``active`` is it while its answer is under way (not for whole answers)."""
        if isinstance(item, tuple):
            self._answer(item)
        elif isinstance(item, RequestResponseCycle):
            self.active = item
            self.shared.keep(self.shared.loop.create_task(item.run_asgi(self.shared.app)))
        elif self.transport is not None:  # a whole answer, in its turn
            self.transport.write(item)
            if isinstance(item, Last):
                self.transport.close()

    def _answer(self, hot: Hot) -> None:
        """Run the instance front on a read, in place; if it waits, it goes on in a task."""
        scope, handler, keep_alive = hot
        exchange = self.exchange
        fast = self.shared.fast
        if exchange is None:  # the connection's first read answered in place
            transport = self.transport
            assert transport is not None  # noqa: S101 - connected
            exchange = self.exchange = Exchange(transport, self.flow, self.shared.date, transport.close)
        assert fast is not None  # noqa: S101 - only the front's reads come here
        self.active = hot
        exchange.begin(keep_alive=keep_alive, http10=scope["http_version"] == "1.0",
                       head_only=scope["method"] == "HEAD")
        try:
            task = eager.start(self.shared.loop, fast.serve(scope, exchange.send, handler, exchange.receive))
        except Exception:  # a bug in the answer's writing (the front answers its own errors): never hang
            self.shared.logger.exception("front.answer_failed")
            self._abort()
            return
        if task is None:
            self._answered()
            return
        self.shared.keep(task)
        task.add_done_callback(self._waited)

    def _waited(self, task: asyncio.Task[None]) -> None:
        """A read that went on in a task has ended (a failure: the reply was cut, the connection goes)."""
        if task.cancelled() or task.exception() is not None:
            self._abort()
            return
        self._answered()
        self._next()

    def _answered(self) -> None:
        """The front's coroutine for the active read has returned."""
        exchange = self.exchange
        self.active = None
        if exchange is not None and not exchange.complete and not exchange.lost:
            self._abort()  # the front returned without a whole answer (a bug): never leave the client waiting

    def _cycle_answered(self) -> None:
        """The cycle wrote its whole answer: the next request's turn (after this loop turn)."""
        self.active = None
        if self.transport is not None and not self.transport.is_closing():
            self.shared.loop.call_soon(self._next)

    def _next(self) -> None:
        """Start the waiting requests in order until one is under way; idle when none is left."""
        while self.active is None and self.queue and not self.closing_transport():
            self._start(self.queue.popleft())
        if self.active is None:
            self._idle()

    def _idle(self) -> None:
        """Nothing under way: read again, and the idle (or unfinished head's) deadline runs from now."""
        flow = self.flow
        if flow is not None and flow.read_paused and not self.closing_transport():
            flow.resume_reading()
        self.idle_since = now = self.shared.now  # the tick's clock: deadlines are checked on ticks anyway
        self.deadline = now + (self.shared.header_timeout if self.in_head else self.shared.idle_timeout)

    def closing_transport(self) -> bool:
        """Whether the connection is closed or closing."""
        return self.transport is None or self.transport.is_closing()

    def _abort(self) -> None:
        self.active = None
        if self.transport is not None:
            self.transport.close()
