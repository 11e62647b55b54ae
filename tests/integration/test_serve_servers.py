"""``imds serve`` on each server and with several workers, as real processes on real sockets."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from factories import metadata_body
from serve_process import ADMIN_TOKEN, client_at, serving

DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"
POLL = 15.0


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_each_server_sees_the_real_peer_on_ipv4_and_ipv6_and_stops_with_0(tmp_path, server):
    """Both servers: the demo instance answers 127.0.0.1 and ::1 by socket peer; SIGTERM exits 0."""
    with serving(tmp_path, "--server", server, "--demo", "--db", "memory://", v6=True) as running:
        with client_at("127.0.0.1") as guest:
            assert guest.get(f"{running.url}/metadata").json()["id"] == DEMO_ID
            forged = guest.get(f"{running.url}/metadata", headers={"X-Forwarded-For": "127.0.0.9"})
            assert forged.json()["id"] == DEMO_ID  # no proxy-header rewriting
        with client_at("127.0.0.9") as stranger:
            assert stranger.get(f"{running.url}/metadata").status_code == 404
        assert running.v6 is not None
        with client_at("::1") as guest6:
            assert guest6.get(f"{running.v6}/metadata").json()["id"] == DEMO_ID
        code, _ = running.terminate()
        assert code == 0, running.output()


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_sigterm_finishes_the_request_in_flight(tmp_path, server):
    """A write whose body is still arriving when SIGTERM comes is completed and acknowledged, then exit 0."""
    body = json.dumps(metadata_body(ips=["127.0.0.5"])).encode()
    with serving(tmp_path, "--server", server, "--data-dir", str(tmp_path / "data")) as running:
        port = int(running.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=POLL) as sock:
            sock.sendall(
                b"POST /device-metadata HTTP/1.1\r\nHost: imds\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10]
            )
            _wait_until_read(sock.getsockname()[1])
            running.process.send_signal(signal.SIGTERM)
            _poll(lambda: any(word in running.output() for word in ('"stopping"', "Shutting down")))
            sock.sendall(body[10:])
            answer = b""
            while chunk := sock.recv(65536):  # head and body may come in separate segments; the server closes
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b'"applied":true' in answer.replace(b" ", b"")
        assert running.process.wait(timeout=POLL) == 0, running.output()


def _poll(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + POLL
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _wait_until_read(client_port: int) -> None:
    """Until the server side of our connection has an empty receive queue (it read what we sent)."""

    def consumed() -> bool:
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == client_port:  # rem_address: the server's side of our socket
                return int(fields[4].split(":")[1], 16) == 0  # rx_queue
        return False

    _poll(consumed)


def test_two_workers_share_the_listener_and_both_serve_a_write(tmp_path):
    """--workers 2 on SQLite: two processes accept; a write through one is served by every connection."""
    with serving(tmp_path, "--workers", "2", "--data-dir", str(tmp_path / "data")) as running:
        children = Path(f"/proc/{running.process.pid}/task/{running.process.pid}/children").read_text().split()
        assert len(children) == 2
        body = metadata_body(ips=["127.0.0.6"], generation=1)
        running.post("/device-metadata", body)
        deadline = time.monotonic() + POLL
        streak = 0
        while streak < 20:  # fresh connections land on either worker
            assert time.monotonic() < deadline, "a worker never served the write"
            with client_at("127.0.0.6") as guest:
                answer = guest.get(f"{running.url}/metadata")
            streak = streak + 1 if answer.status_code == 200 and answer.json() == body["metadata"] else 0
        code, _ = running.terminate()
        assert code == 0, running.output()
        for child in children:
            assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
