"""``imds import``'s progress on stderr: a rich bar on a terminal, otherwise a plain line every few seconds.

The plain line counts the items done (written, unchanged or rejected) of the total when it is
known, how many the source has read so far when it says (``--from-hollow`` reads ahead), and
how many were written::

    imds import: 4000/20000 items (5000 read, 3990 written, 812/s)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click

from imds.services.transfer.bulk import Result


class Progress:
    """A rich bar with rate and ETA on a terminal; otherwise a plain line every ``interval`` seconds."""

    def __init__(
        self, total: int | None, *, interval: float, clock: Callable[[], float] = time.monotonic,
        read: Callable[[], int] | None = None,
    ) -> None:
        self._total, self._interval, self._clock, self._read = total, interval, clock, read
        self._done = self._written = 0
        self._started = self._last = clock()
        self._bar: Any = None
        if sys.stderr.isatty():
            from rich import progress as rich_progress  # noqa: PLC0415 - rich loads only on a terminal
            from rich.console import Console  # noqa: PLC0415

            self._bar = rich_progress.Progress(
                rich_progress.TextColumn("importing"), rich_progress.BarColumn(), rich_progress.MofNCompleteColumn(),
                rich_progress.TaskProgressColumn(), rich_progress.TextColumn("{task.fields[rate]}/s"),
                rich_progress.TimeRemainingColumn(), transient=True, console=Console(stderr=True),
            )
            self._task = self._bar.add_task("import", total=total, rate="-")
            self._bar.start()

    def advance(self, count: int, results: list[Result] | None = None, *, rejected: int = 0) -> None:
        """``count`` more items are done (``results``: their outcomes); ``rejected`` so far, done too."""
        self._done += count
        self._written += sum(r.outcome in ("created", "updated") for r in results or [])
        done = self._done + rejected
        now = self._clock()
        rate = done / max(now - self._started, 1e-9)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, rate=f"{rate:.0f}")
        elif now - self._last >= self._interval:
            self._last = now
            of = f"/{self._total}" if self._total is not None else ""
            read = f"{self._read()} read, " if self._read is not None else ""
            click.echo(f"imds import: {done}{of} items ({read}{self._written} written, {rate:.0f}/s)", err=True)

    def close(self) -> float:
        """Stop the bar; the seconds taken."""
        if self._bar is not None:
            self._bar.stop()
        return self._clock() - self._started
