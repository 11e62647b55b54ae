"""``imds proxy --timeout`` is one deadline for the whole proxied request, not a bound per read.

An upstream that trickles its answer one byte a second never lets a per-read timeout fire;
under a total deadline the VM has its answer (504 when no header was out yet, a cut
connection once they were) within ``--timeout`` plus a small margin. Each test ends in a
few seconds.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from proxy_process import proxying
from serve_process import client_at, run_imds

VM = "127.0.0.2"
INSTANCE = "9a2f0c1e-1b1d-4d8e-9f00-0000000000a1"
TIMEOUT = 2.0
MARGIN = 1.5
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 40\r\n\r\n" + b"x" * 40


@contextmanager
def trickling_upstream(head: bytes) -> Iterator[str]:
    """An upstream that sends ``head`` at once, then the rest of ANSWER one byte a second (bounded: 40 s at most)."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                rest = ANSWER.removeprefix(head)
                try:
                    conn.sendall(head)
                    for byte in rest:
                        if stop.wait(1.0):
                            return
                        conn.sendall(bytes([byte]))
                except OSError:
                    continue  # the proxy gave up on us: next connection

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "secret").write_bytes(b"deadline-test-secret")
    (tmp_path / "map.txt").write_text(f"{VM} {INSTANCE}\n")
    return tmp_path


def _proxy_args(files: Path, upstream: str) -> tuple[str, ...]:
    return ("--upstream", upstream, "--shared-secret-file", str(files / "secret"), "--map", str(files / "map.txt"),
            "--timeout", str(TIMEOUT))


def test_an_upstream_trickling_its_headers_gets_the_vm_a_504_within_the_timeout(files: Path) -> None:
    """One byte a second of status line and headers: 504 with a JSON body after ~--timeout, not minutes later."""
    with trickling_upstream(b"") as upstream, proxying(files, *_proxy_args(files, upstream)) as proxy:
        started = time.monotonic()
        with client_at(VM) as client:
            answer = client.get(f"{proxy.url}/metadata", timeout=30.0)
        elapsed = time.monotonic() - started
    assert answer.status_code == 504, answer.text
    assert "did not answer within 2 s" in answer.json()["message"]
    assert TIMEOUT - 0.1 <= elapsed < TIMEOUT + MARGIN, elapsed


def test_an_upstream_trickling_its_body_is_cut_within_the_timeout(files: Path) -> None:
    """Headers at once, then one byte a second of body: the VM's connection ends after ~--timeout, short."""
    head = ANSWER[: ANSWER.index(b"\r\n\r\n") + 4]
    with trickling_upstream(head) as upstream, proxying(files, *_proxy_args(files, upstream)) as proxy:
        started = time.monotonic()
        with client_at(VM) as client, pytest.raises(httpx.RemoteProtocolError):
            client.get(f"{proxy.url}/metadata", timeout=30.0)
        elapsed = time.monotonic() - started
        assert "proxy.upstream_timeout" in proxy.output()
    assert TIMEOUT - 0.1 <= elapsed < TIMEOUT + MARGIN, elapsed


def test_the_help_says_the_timeout_bounds_the_whole_request(tmp_path: Path) -> None:
    """``imds proxy --help`` tells the operator what --timeout bounds, and that a watch gets its wait on top."""
    shown = run_imds(tmp_path, "proxy", "--help")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "whole proxied request" in text
    assert "timeout_sec on top" in text
