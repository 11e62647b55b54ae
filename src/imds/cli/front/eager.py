"""Start a coroutine at once, in the caller's stack; only if it has to wait does it become a task.

An instance read answered from the catalog never waits: run eagerly it costs one
``coro.send(None)`` instead of a task, a loop turn and a wake-up (Python 3.12's eager task
factory, done by hand for 3.11). A coroutine that does wait (a change watch, an upstream
lookup, a reply that streams) continues in a task from the very point it stopped: the task
is handed what the coroutine yielded and goes on sending into it, as ``await`` would have.

Until its first wait such a coroutine runs outside any task: ``asyncio.current_task()`` is
None there, so it must not use what needs one (``asyncio.timeout``, anyio, httpx) before it
first waits; ``imds.web.instance.InstanceFront.serve`` says how it keeps to that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any


def start(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` now: None when it has finished, else the task it continues in.

    An exception ``coro`` raises before its first wait is raised here.
    """
    try:
        step = coro.send(None)
    except StopIteration:
        return None
    return loop.create_task(_continued(coro, step))


async def _continued(coro: Coroutine[Any, Any, None], step: Any) -> None:
    await _Resumed(coro, step)


class _Resumed:
    """Awaitable that goes on with ``coro`` from where it yielded ``step`` (what ``yield from`` does)."""

    __slots__ = ("_coro", "_step")

    def __init__(self, coro: Coroutine[Any, Any, None], step: Any) -> None:
        self._coro = coro
        self._step = step

    def __await__(self) -> Generator[Any, Any, None]:
        coro, step = self._coro, self._step
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - a cancellation (or anything thrown in) goes to coro
                try:
                    step = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    step = coro.send(sent)
                except StopIteration:
                    return


def drive(coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop,
          failed: Callable[[BaseException], None]) -> None:
    """Run ``coro`` now and resume it from the done callbacks of the futures it awaits: no task at all.

    For short event-loop coroutines that only await futures (the loop's own
    ``connect_accepted_socket``: one per connection); ``failed`` gets what it raises.
    """
    _Driven(coro, loop, failed).step()


class _Driven:
    """``drive``'s state: the coroutine and what to call if it fails, released as soon as it ends.

    An object, not a closure that names itself to be called again: such a function sits
    in a reference cycle with its own cell, and everything it reaches (the coroutine, the
    connection, its socket, transport, parser state) would wait for the cyclic GC instead
    of being freed when the connection closes. A boot storm (a connection per request)
    made the full collections that find them last 50-200 ms each.
    """

    __slots__ = ("coro", "failed", "loop")

    def __init__(self, coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop,
                 failed: Callable[[BaseException], None]) -> None:
        self.coro: Coroutine[Any, Any, Any] | None = coro
        self.loop = loop
        self.failed: Callable[[BaseException], None] | None = failed

    def step(self, _done: object = None) -> None:
        coro, failed = self.coro, self.failed
        if coro is None or failed is None:
            return
        try:
            future = coro.send(None)
        except StopIteration:
            self.coro = self.failed = None
            return
        except BaseException as exc:  # noqa: BLE001 - handed to ``failed``, which owns the outcome
            self.coro = self.failed = None
            failed(exc)
            return
        if future is None:  # a bare yield (sleep(0)): go on after one loop turn
            self.loop.call_soon(self.step)
        else:
            future.add_done_callback(self.step)
