"""Tools for the fault suites: a PostgreSQL server a test may stop, restart and freeze, and load threads.

``FaultyPostgres`` is the session helper's server (``postgres_server._Server``) owned by one
test: ``halt`` is a fast shutdown that keeps the data directory, ``restart`` starts it again
on the same port, ``freeze``/``thaw`` send SIGSTOP/SIGCONT to the postmaster and every one
of its children (found through ``/proc``), all by PID. ``Load`` runs readers and writers
in threads against a real ``imds serve`` and records every answer with its duration.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from postgres_server import PostgresServer, _execute, _postmaster_pid, _Server


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (read from /proc), deepest last."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


class FaultyPostgres:
    """One test's own PostgreSQL server, with an outage switch."""

    def __init__(self) -> None:
        self._server = _Server()
        self.info: PostgresServer = self._server.start()
        self._frozen: list[int] = []

    def database(self) -> str:
        """A fresh database on this server; its URL."""
        name = f"imds_fault_{uuid.uuid4().hex[:12]}"
        _execute(self.info, f'CREATE DATABASE "{name}"')
        return self.info.url(name)

    def postmaster(self) -> int:
        found = _postmaster_pid(self._server.data)
        assert found is not None, "postgres is not running"
        return found[0]

    def halt(self) -> None:
        """Stop the server (fast shutdown by PID), keeping its data."""
        self._server.stop(keep=True)

    def restart(self) -> None:
        """Start the server again on the same port and data; fail the test if it does not come back."""
        if self._server._run_postgres(self.info.port) is None:
            pytest.fail("postgres could not take its port back")

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every backend: connections stay open and nothing answers."""
        pid = self.postmaster()
        self._frozen = [pid, *_children(pid)]
        for each in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT every process ``freeze`` stopped, and runuser (which stops itself when its child stops)."""
        process = self._server.process
        launcher = [process.pid] if self._frozen and process is not None else []
        for each in [*launcher, *self._frozen]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGCONT)
        self._frozen = []

    def stop(self) -> None:
        """Thaw if frozen, then stop by PID and remove the data."""
        self.thaw()
        self._server.stop()


@contextmanager
def faulty_postgres() -> Iterator[FaultyPostgres]:
    """A FaultyPostgres, always thawed and stopped by PID afterwards."""
    server = FaultyPostgres()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Answer:
    """One request's outcome: when it started (monotonic), how long it took, its status and body."""

    started: float
    seconds: float
    status: int  # 0: no answer (transport error)
    body: str


@dataclass
class Load:
    """Threads that repeat one request until stopped, recording every answer."""

    answers: dict[str, list[Answer]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def run(self, name: str, request: Callable[[httpx.Client], httpx.Response], *, timeout: float = 30.0) -> None:
        """Start a thread that sends ``request`` in a loop (client timeout ``timeout``) under ``name``."""
        log = self.answers.setdefault(name, [])

        def loop() -> None:
            with httpx.Client(timeout=timeout, trust_env=False) as client:
                while not self._stop.is_set():
                    started = time.monotonic()
                    try:
                        answer = request(client)
                        status, body = answer.status_code, answer.text
                    except httpx.TransportError as exc:
                        status, body = 0, repr(exc)
                    log.append(Answer(started, time.monotonic() - started, status, body))

        thread = threading.Thread(target=loop, name=f"load-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def since(self, name: str, moment: float) -> list[Answer]:
        """The answers to ``name`` that started at or after ``moment``."""
        return [a for a in self.answers[name] if a.started >= moment]

    def stop(self) -> None:
        """Stop every thread and wait for it (bounded by the client timeout)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

