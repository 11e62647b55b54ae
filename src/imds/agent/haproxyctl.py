"""The haproxy process the agent runs: check a config, swap it in atomically, start, reload and stop.

What the config says is ``imds.agent.haproxy``'s (pure rendering); this module only runs the binary.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from imds.agent.haproxy import READY_TIMEOUT, SIGNING_KEY_ENV, STOP_TIMEOUT
from imds.errors import HaproxyFailed


class Haproxy:
    """One haproxy master (``-W -S master.sock``) run as a child of the agent, config under ``state_dir``.

    ``log_fd``: the agent's end of the request-log socket haproxy inherits (``Process.log_fd``).
    """

    def __init__(self, binary: str, state_dir: Path, secret: bytes, *, log_fd: int | None = None) -> None:
        self.binary = binary
        self._pass_fds = () if log_fd is None else (log_fd,)
        # haproxy's environment: ours plus the signing key (never logged, never on disk).
        self._env = {**os.environ, SIGNING_KEY_ENV: base64.b64encode(secret).decode()}
        self.state_dir = state_dir.resolve()
        self.config = self.state_dir / "haproxy.cfg"
        self.socket = self.state_dir / "haproxy-master.sock"
        self.log = self.state_dir / "haproxy.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.current: str | None = None

    def check(self, text: str) -> None:
        """``haproxy -c`` on ``text``; HaproxyFailed with haproxy's own words when it refuses."""
        candidate = self.state_dir / "haproxy.cfg.new"
        _write_private(candidate, text)
        try:
            result = subprocess.run(  # noqa: S603 - the configured haproxy binary on our own file
                [self.binary, "-c", "-q", "-f", str(candidate)],
                capture_output=True, text=True, timeout=30, check=False, env=self._env, pass_fds=self._pass_fds,
            )
        except OSError as exc:
            raise HaproxyFailed(f"cannot run {self.binary}: {exc.strerror}") from exc
        if result.returncode != 0:
            candidate.unlink(missing_ok=True)
            raise HaproxyFailed(f"haproxy refused the rendered config: {(result.stderr or result.stdout).strip()}")

    def apply(self, text: str) -> bool:
        """Validate, swap in atomically and start or reload; False when ``text`` is what runs already."""
        if text == self.current and self.running:
            return False
        self.check(text)
        (self.state_dir / "haproxy.cfg.new").replace(self.config)
        if self.running:
            self.reload()
        else:
            self.start()
        self.current = text
        return True

    @property
    def running(self) -> bool:
        """Whether the master process is alive."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the master and wait until it reports a worker; HaproxyFailed with its log otherwise."""
        self._stop_leftover()
        self.socket.unlink(missing_ok=True)
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(  # noqa: S603 - the configured haproxy binary
                [self.binary, "-W", "-S", f"{self.socket},mode,600", "-f", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=self._env,
                pass_fds=self._pass_fds,
            )
        self._wait_worker(exclude=set())

    def _stop_leftover(self) -> None:
        """Stop a master a killed agent left behind (it still answers on our socket), by its PID."""
        if not self.socket.exists():
            return
        try:
            text = self.command("show proc")
        except OSError:
            return  # a stale socket file: nobody is listening
        for line in text.splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[1] == "master" and fields[0].isdigit():
                pid = int(fields[0])
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + STOP_TIMEOUT
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)

    def workers(self) -> set[int]:
        """PIDs of the current (not old) workers, from the master CLI's ``show proc``."""
        text = self.command("show proc")
        current: set[int] = set()
        section = "master"
        for line in text.splitlines():
            if line.startswith("#"):  # "# workers", "# old workers", "# programs"
                section = line.lstrip("#").strip()
                continue
            fields = line.split()
            if section == "workers" and len(fields) >= 2 and fields[1] == "worker" and fields[0].isdigit():
                current.add(int(fields[0]))
        return current

    def command(self, line: str) -> str:
        """One command on the master CLI socket; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(str(self.socket))
            sock.sendall(line.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)  # the master CLI answers and closes once the input ends
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def reload(self) -> None:
        """Master-worker reload: a new worker takes the listeners, the old one finishes its requests."""
        before = self.workers()
        try:
            self.command("reload")
        except OSError as exc:
            raise HaproxyFailed(f"haproxy master socket {self.socket}: {exc.strerror}") from exc
        self._wait_worker(exclude=before)

    def _wait_worker(self, exclude: set[int]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                raise HaproxyFailed(f"haproxy exited: {self._tail()}")
            try:
                if self.workers() - exclude:
                    return
            except OSError:
                pass  # the master socket is not there yet, or is being re-created by the reload
            time.sleep(0.05)
        raise HaproxyFailed(f"haproxy started no new worker within {READY_TIMEOUT}s: {self._tail()}")

    def tail(self) -> str:
        """The end of haproxy's own log."""
        return self._tail()

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:].strip() if self.log.exists() else ""

    def stop(self) -> None:
        """Stop the master (and its workers) by PID."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT)
        self.process = None
        self.current = None


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs; an exited process waiting to be reaped by init counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the start (it names every VM on the host)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
