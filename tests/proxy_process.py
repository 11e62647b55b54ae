"""A real ``imds proxy`` process on a free loopback port, always stopped by its PID."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from helpers import wait_for
from serve_process import IMDS, START_TIMEOUT, clean_env, client_at, free_port, stop_process


class Proxy:
    """One ``imds proxy`` process: its URL and log."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.process = process
        self.url = url
        self.log = log

    def output(self) -> str:
        """Everything the process wrote so far."""
        return self.log.read_text(errors="replace")

    def wait_listening(self, source: str | None) -> None:
        """Block (bounded) until the proxy answers any HTTP status; fail with the log otherwise."""

        def answers() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"imds proxy exited with {self.process.returncode}:\n{self.output()}")
            with client_at(source) as client:
                client.get(f"{self.url}/", timeout=1.0)
            return True

        wait_for(answers, what="imds proxy to listen", timeout=START_TIMEOUT,
                 ignoring=(httpx.TransportError,), explain=self.output)

    def reload(self) -> None:
        """SIGHUP by PID: re-read the map."""
        self.process.send_signal(signal.SIGHUP)

    def stop(self) -> int:
        """SIGTERM by PID, bounded; SIGKILL if it does not exit."""
        return stop_process(self.process)


@contextmanager
def proxying(tmp_path: Path, *args: str, host: str = "127.0.0.1", probe_from: str | None = None) -> Iterator[Proxy]:
    """``imds proxy --listen host:FREE *args`` (flags only, clean environment), stopped by PID afterwards."""
    port = free_port(host)
    shown = f"[{host}]" if ":" in host else host
    log = tmp_path / f"proxy-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(IMDS), "proxy", "--listen", f"{shown}:{port}", *args],
            env=clean_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    proxy = Proxy(process, f"http://{shown}:{port}", log)
    try:
        proxy.wait_listening(probe_from)
        yield proxy
    finally:
        proxy.stop()
