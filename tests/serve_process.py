"""A real ``imds serve`` process on a free loopback port, for tests that drive real clients.

The same approach as ``integration/test_serve_socket.py``: the process gets a clean
environment (no inherited ``IMDS_*``, HOME and XDG dirs in the test's tmp dir), its output
goes to a log file, the wait for health is bounded, and it is always stopped by its PID.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import wait_for
from imds.lab.run import stop

IMDS = Path(sys.executable).parent / "imds"
ADMIN_TOKEN = "serve-process-token"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test's environment minus any IMDS_* setting and proxies, with HOME and XDG_DATA_HOME in tmp.

    The Ganeti OS search path is empty (no definitions from this machine's /srv/ganeti/os…)
    unless ``extra`` says otherwise.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMDS_") and "proxy" not in k.lower()}
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "xdg"), IMDS_GANETI_OS_SEARCH_PATH="")
    env.update(extra)
    return env


def stop_process(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM by PID, bounded; SIGKILL if it does not exit. Returns the exit status."""
    return stop(process, STOP_TIMEOUT)


class Server:
    """One ``imds serve`` process: its URLs (IPv4, optional IPv6), admin token and log."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path, v6: str | None = None) -> None:
        self.process = process
        self.url = url
        self.v6 = v6
        self.log = log
        self.data_dir: Path | None = None
        self.admin_headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def output(self) -> str:
        """Everything the process wrote so far."""
        return self.log.read_text(errors="replace")

    def wait_healthy(self, *, loaded: bool = True, timeout: float = START_TIMEOUT) -> None:
        """Block (bounded) until ``/healthz`` answers 200 (and the catalog is loaded); fail with the log otherwise."""

        def healthy() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"imds serve exited with {self.process.returncode}:\n{self.output()}")
            with client_at() as client:
                up = client.get(f"{self.url}/healthz", timeout=1.0).status_code == 200
                return up and (not loaded or self.loaded(client))

        wait_for(healthy, what="imds serve to be healthy", timeout=timeout,
                 ignoring=(httpx.TransportError,), explain=self.output)

    def loaded(self, client: httpx.Client) -> bool:
        """Whether ``/readyz`` says the instance catalog is in memory (the store may still be down)."""
        loading = client.get(f"{self.url}/readyz", timeout=5.0).json().get("loading", {"phase": "loaded"})
        return bool(loading["phase"] == "loaded")

    def terminate(self) -> tuple[int, float]:
        """SIGTERM by PID; (exit status, seconds it took)."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=STOP_TIMEOUT)
        return code, time.monotonic() - started

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """An admin write from 127.0.0.1; fails the test unless it was applied."""
        with httpx.Client(timeout=5.0) as admin:
            answer = admin.post(f"{self.url}{path}", json=body, headers=self.admin_headers)
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        assert result["applied"] is True, result
        return result

    def stop(self) -> int:
        """SIGTERM by PID, bounded; SIGKILL if it does not exit. Returns the exit status."""
        return stop_process(self.process)


@contextmanager
def serving(
    tmp_path: Path, *args: str, host: str = "127.0.0.1", v6: bool = False, loaded: bool = True,
    source: Path | None = None, environment: dict[str, str | None] | None = None, wrap: tuple[str, ...] = (),
    start_timeout: float = START_TIMEOUT,
) -> Iterator[Server]:
    """``imds serve *args`` on a free port of ``host`` (and of ``[::1]`` with ``v6``), stopped by PID afterwards.

    Yields once the server is healthy and (unless ``loaded`` is False) its catalog is loaded.
    ``source``: a ``src`` directory to import imds from instead of this checkout (benchmarks' baselines).
    ``environment``: variables set over ``clean_env``'s (None: removed); ``wrap``: a command the process
    runs under, which must ``exec`` it (so the PID stopped is imds's).
    ``start_timeout``: the bound on that wait (suites that start several servers on a loaded machine).
    """
    port = free_port(host)
    listen = ["--listen", f"{host}:{port}"]
    v6_url = None
    if v6:
        port6 = free_port("::1")
        listen += ["--listen", f"[::1]:{port6}"]
        v6_url = f"http://[::1]:{port6}"
    if "--rate-limit" not in args:
        # Test loops read as fast as they can from one address; the per-caller limit has its own
        # tests (security/test_http_abuse.py), which pass --rate-limit explicitly.
        args = (*args, "--rate-limit", "0")
    log = tmp_path / f"serve-{port}.log"
    program, env = [str(IMDS)], clean_env(tmp_path, IMDS_ADMIN_TOKEN=ADMIN_TOKEN)
    for name, value in (environment or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    if source is not None:
        program, env["PYTHONPATH"] = [sys.executable, "-m", "imds"], str(source)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*wrap, *program, "serve", *listen, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    server = Server(process, f"http://{host}:{port}", log, v6_url)
    try:
        server.wait_healthy(loaded=loaded, timeout=start_timeout)
        yield server
    finally:
        server.stop()


def client_at(local_address: str | None = None) -> httpx.Client:
    """A client whose connections leave from ``local_address`` (a real source address on loopback)."""
    transport = httpx.HTTPTransport(local_address=local_address) if local_address else httpx.HTTPTransport()
    return httpx.Client(transport=transport, timeout=5.0, trust_env=False)


def in_background(action: Callable[[], Any]) -> queue.Queue[Any]:
    """Run ``action`` in a daemon thread; its result (or exception) lands in the returned queue."""
    results: queue.Queue[Any] = queue.Queue()

    def run() -> None:
        try:
            results.put(action())
        except Exception as exc:  # noqa: BLE001 - handed to the test thread, which re-raises it
            results.put(exc)

    threading.Thread(target=run, daemon=True).start()
    return results


def metric(server: Server, name: str) -> float:
    """The value of the unlabelled metric ``name`` on the server's /metrics."""
    with client_at() as client:
        text = client.get(f"{server.url}/metrics", headers=server.admin_headers).text
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} "))


def run_imds(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the ``imds`` executable to completion (bounded) with a clean environment."""
    return subprocess.run(
        [str(IMDS), *args], env=clean_env(tmp_path, **env), capture_output=True, text=True, timeout=30, check=False
    )
