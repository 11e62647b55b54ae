"""``imds serve`` on each server and with several workers, as real processes on real sockets."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from factories import metadata_body
from helpers import wait_for
from serve_process import ADMIN_TOKEN, client_at, free_port, serving

DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"
POLL = 15.0


@pytest.mark.parametrize("server", ["front", "granian", "uvicorn"])
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


@pytest.mark.parametrize("server", ["front", "granian", "uvicorn"])
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
            wait_for(lambda: any(word in running.output() for word in ('"stopping"', "Shutting down")),
                     what="the server to start shutting down", timeout=POLL)
            sock.sendall(body[10:])
            answer = b""
            while chunk := sock.recv(65536):  # head and body may come in separate segments; the server closes
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b'"applied":true' in answer.replace(b" ", b"")
        assert running.process.wait(timeout=POLL) == 0, running.output()


@pytest.mark.parametrize("server", ["front", "granian", "uvicorn"])
def test_token_hop_limit_reaches_the_connections_serve_accepts(tmp_path, server):
    """``imds serve --token-hop-limit 3``: the sockets the server process accepted (IPv4 and IPv6) have TTL 3.

    Read from the server's own accepted socket (a duplicate taken with pidfd_getfd), so
    the option must travel from the command line through the settings to the listeners
    the server really accepts on. The admin listener keeps the system default.
    """
    admin_port = free_port()
    args = ("--server", server, "--demo", "--db", "memory://", "--token-hop-limit", "3",
            "--admin-listen", f"127.0.0.1:{admin_port}")
    with serving(tmp_path, *args, v6=True) as running:
        assert running.v6 is not None
        v4 = _accepted_socket_option(running.process.pid, running.url, socket.IPPROTO_IP, socket.IP_TTL)
        v6 = _accepted_socket_option(running.process.pid, running.v6, socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS)
        admin = _accepted_socket_option(
            running.process.pid, f"http://127.0.0.1:{admin_port}", socket.IPPROTO_IP, socket.IP_TTL
        )
    assert (v4, v6) == (3, 3)
    assert admin > 3  # the kernel default (64): an operator may be several hops away


def _accepted_socket_option(pid: int, url: str, level: int, option: int) -> int:
    """``getsockopt(level, option)`` on the socket the server process ``pid`` (or a worker) accepted from us."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(POLL)
        client.connect((host, int(port)))
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: imds\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")  # accepted and answered; the connection stays open
        inode = _server_side_inode(family, int(port), client.getsockname()[1])
        for holder in _process_tree(pid):
            for fd in Path(f"/proc/{holder}/fd").iterdir():
                if _target(fd) == f"socket:[{inode}]":
                    with _borrowed(holder, int(fd.name)) as accepted:
                        return int(accepted.getsockopt(level, option))
    pytest.fail(f"no process of imds serve {pid} holds the accepted socket {inode}")


def _target(fd: Path) -> str:
    """What an open file descriptor points at ("" if it was closed meanwhile)."""
    try:
        return str(fd.readlink())
    except OSError:
        return ""


def _server_side_inode(family: int, server_port: int, client_port: int) -> int:
    """The inode of the server's end of our connection, from /proc/net/tcp(6)."""
    table = Path("/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp")
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(fields[n].rsplit(":", 1)[1], 16) for n in (1, 2))
        if (local, remote) == (server_port, client_port):
            return int(fields[9])
    pytest.fail(f"no server-side socket for :{server_port} <- :{client_port} in {table}")


def _process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (workers, if the server forks any)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").iterdir():
            pending += [int(child) for child in (task / "children").read_text().split()]
    return found


_PIDFD_GETFD = 438  # the syscall number on every Linux architecture (new syscalls share one table)


@contextmanager
def _borrowed(pid: int, fd: int) -> Iterator[socket.socket]:
    """A duplicate of another process's file descriptor (pidfd_getfd), as a socket, closed on exit."""
    pidfd = os.pidfd_open(pid)
    try:
        copy = ctypes.CDLL(None, use_errno=True).syscall(_PIDFD_GETFD, pidfd, fd, 0)
    finally:
        os.close(pidfd)
    if copy < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
    with socket.socket(fileno=copy) as sock:
        yield sock


def _wait_until_read(client_port: int) -> None:
    """Until the server side of our connection has an empty receive queue (it read what we sent)."""

    def consumed() -> bool:
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == client_port:  # rem_address: the server's side of our socket
                return int(fields[4].split(":")[1], 16) == 0  # rx_queue
        return False

    wait_for(consumed, what="the server to read what we sent", timeout=POLL)


def test_two_workers_share_the_listener_and_both_serve_a_write(tmp_path):
    """--workers 2 on SQLite: two processes accept; a write through one is served by every connection."""
    with serving(tmp_path, "--workers", "2", "--data-dir", str(tmp_path / "data")) as running:
        children = Path(f"/proc/{running.process.pid}/task/{running.process.pid}/children").read_text().split()
        assert len(children) == 2
        body = metadata_body(ips=["127.0.0.6"], generation=1)
        running.post("/device-metadata", body)
        streak = 0

        def twenty_in_a_row() -> bool:  # fresh connections land on either worker
            nonlocal streak
            with client_at("127.0.0.6") as guest:
                answer = guest.get(f"{running.url}/metadata")
            streak = streak + 1 if answer.status_code == 200 and answer.json() == body["metadata"] else 0
            return streak >= 20

        wait_for(twenty_in_a_row, what="every worker to serve the write", timeout=POLL)
        code, _ = running.terminate()
        assert code == 0, running.output()
        for child in children:
            assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
