"""Identity signatures made ahead of their reads, on one worker thread.

A boot crawl (cloud-init's EC2 datasource) reads the instance's signed identity document last,
some 40 requests after its first read. Signing is a private-key operation per signature
(about half a millisecond; OpenSSL releases the GIL while it runs), so made on the event
loop each one stalls every request in flight, and a fleet booting together reaches its
signatures together. So when an instance's EC2 tree is rendered its signatures (``Later``
leaves) are queued here and made on one thread while the crawl goes on; a read of a
signature waits for its job (or starts it, if it was not queued). At most ``AHEAD`` jobs
wait at a time: past that a signature is made when read, so a re-render storm (evictions, a
restart under a polling fleet) cannot queue unbounded work. One thread: the signing never
takes more than one core from the loop.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future, ThreadPoolExecutor

from imds.services.render.tree import Later

AHEAD = 1024  # signing jobs queued ahead of their reads, at most


class SigningQueue:
    """Makes ``Later`` leaves (identity signatures) on one worker thread, ahead of their reads or when read."""

    def __init__(self, ahead: int = AHEAD) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="imds-sign")
        self._ahead = ahead
        self._queued: set[Future[str]] = set()

    def ahead(self, leaf: Later) -> None:
        """Queue ``leaf`` to be made before it is read (unless it is made or queued, or the queue is full)."""
        if leaf.value is None and leaf.pending is None and len(self._queued) < self._ahead:
            job = leaf.start(self._executor)
            self._queued.add(job)
            job.add_done_callback(self._queued.discard)

    async def made(self, leaf: Later) -> str:
        """The leaf's text: kept, or made by its job (started now if it was never queued), the loop free meanwhile."""
        value = leaf.value
        if value is None:
            value = await asyncio.wrap_future(leaf.start(self._executor))
        return value

    @property
    def queued(self) -> int:
        """Jobs queued or running now."""
        return len(self._queued)
