"""Processes and devices the lab makes, and how each is undone on every exit.

``Cleanup`` is a stack of undo actions: a child process is stopped by its PID (SIGTERM, then
SIGKILL), a device or namespace is deleted by the name the lab chose for it. ``Cleanup.close``
runs them in reverse order with SIGINT ignored, so a second Ctrl-C cannot leave half of them.
Children run in their own session (a Ctrl-C in the terminal reaches only the lab, which then
stops them in order) and get SIGTERM from the kernel if the lab itself dies.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

from imds.errors import LabError

STOP_TIMEOUT = 10.0
PR_SET_PDEATHSIG = 1


def sbin_path() -> str:
    """``PATH`` with the sbin directories (ip, mke2fs, ovs-vswitchd live there)."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    extra = [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if d not in path.split(":")]
    return ":".join([path, *extra])


def tool_env(**extra: str) -> dict[str, str]:
    """The environment children get: ours, with sbin on PATH, plus ``extra``."""
    env = dict(os.environ)
    env["PATH"] = sbin_path()
    env.update(extra)
    return env


def sh(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0, check: bool = True) -> str:
    """Run a command to completion (bounded); its stdout, or LabError with its stderr."""
    try:
        done = subprocess.run(  # noqa: S603 - host tools with arguments the lab built
            list(args), env=env or tool_env(), capture_output=True, text=True, timeout=timeout, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{' '.join(args)}: {exc}") from exc
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def write_private(path: Path, data: bytes) -> None:
    """Write a secret (key, token) readable by its owner only, from the first byte on."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as sink:
        sink.write(data)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def ensure_system_user(name: str, comment: str) -> None:
    """A system user and group ``name`` (no home, no login), made when missing, as sysusers.d would."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        sh("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/", "--shell",
           "/usr/sbin/nologin", "--comment", comment, name)


def spawn(args: Sequence[str], log: Path, env: dict[str, str] | None = None,
          stderr: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a child in its own session, output appended to ``log`` (stderr to ``stderr`` if given)."""
    with log.open("ab") as out, (stderr or log).open("ab") as err:
        try:
            return subprocess.Popen(  # noqa: S603 - host tools with arguments the lab built
                list(args), env=env or tool_env(), stdin=subprocess.DEVNULL, stdout=out,
                stderr=err if stderr else subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only; the lab spawns from one thread
            )
        except OSError as exc:
            raise LabError(f"cannot start {args[0]}: {exc}") from exc


def stop(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> int:
    """SIGTERM by PID, bounded; SIGKILL when it does not exit. Its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout=timeout)


def wait_until(what: str, predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> None:
    """Poll ``predicate`` until it holds; LabError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")


class Cleanup:
    """Undo actions, run newest first by ``close`` (each one bounded, none skipped by another's failure)."""

    def __init__(self) -> None:
        """An empty stack."""
        self._undo: list[tuple[str, Callable[[], object]]] = []
        self.failures: list[str] = []

    def add(self, what: str, action: Callable[[], object]) -> None:
        """Run ``action`` at close; ``what`` names it in ``failures`` if it raises."""
        self._undo.append((what, action))

    def process(self, name: str, process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        """Stop ``process`` by its PID at close."""
        self.add(f"stop {name} (pid {process.pid})", lambda: stop(process))
        return process

    def command(self, *args: str) -> None:
        """Run ``args`` at close (e.g. ``ip link del NAME``); a failure is recorded, not raised."""
        self.add(" ".join(args), lambda: sh(*args, timeout=30.0))

    def close(self) -> None:
        """Undo everything, newest first, with SIGINT ignored until done."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            while self._undo:
                what, action = self._undo.pop()
                try:
                    action()
                except Exception as exc:  # noqa: BLE001 - every undo runs; failures are reported together
                    self.failures.append(f"{what}: {exc}")
        finally:
            signal.signal(signal.SIGINT, previous)


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def cleaned_up() -> Iterator[Cleanup]:
    """A ``Cleanup`` closed on success, failure, Ctrl-C and SIGTERM (turned into SystemExit)."""
    cleanup = Cleanup()
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield cleanup
    finally:
        cleanup.close()
        signal.signal(signal.SIGTERM, previous)
