"""``--max-connections-per-source`` on a real ``imds serve`` (the front, the default server; granian; uvicorn).

One source's slow connections over its budget are shut, the others are served meanwhile,
and a trusted proxy's address is not limited.
"""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Iterator

import pytest

from helpers import wait_for
from serve_process import ADMIN_TOKEN, Server, client_at, serving

BUDGET = 8
SLOW = 100
ATTACKER, READER, PROXY = "127.0.0.2", "127.0.0.3", "127.0.0.4"
READER_ID = "5e1f0c1e-1b1d-4d8e-9f00-0000000b0d9e"
ARGS = ("--max-connections-per-source", str(BUDGET), "--header-timeout", "60", "--trusted-proxy", f"{PROXY}/32",
        "--rate-limit", "0")
SERVERS = {
    "front": ("--db", "memory://"),
    "granian": ("--db", "memory://", "--server", "granian"),
    "uvicorn": ("--db", "memory://", "--server", "uvicorn", "--keepalive-timeout", "60"),
    # Two workers, each holding some of the connections: the budget is for the server as a whole.
    "front-2-workers": ("--workers", "2"),
    "granian-2-workers": ("--workers", "2", "--server", "granian"),
}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server per kind with a budget of 8 and a record for the reader's address."""
    tmp = tmp_path_factory.mktemp("budget")
    args = list(SERVERS[request.param])
    if "--db" not in args:
        args += ["--db", f"sqlite:///{tmp}/imds.db"]
    with serving(tmp, *ARGS, *args) as running, client_at() as admin:
        body = {"id": READER_ID, "ipAddresses": [READER], "metadata": {"id": READER_ID, "hostname": "reader"}}
        answer = admin.post(f"{running.url}/device-metadata", json=body,
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert answer.status_code in {200, 201}, answer.text
        streak = 0

        def twenty_in_a_row() -> bool:  # fresh connections land on either worker, each with its own catalog
            nonlocal streak
            with client_at(READER) as reader:
                streak = streak + 1 if reader.get(f"{running.url}/metadata").status_code == 200 else 0
            return streak >= 20

        wait_for(twenty_in_a_row, what="every worker to serve the reader's record", timeout=20)
        yield running


@contextlib.contextmanager
def _slow(server: Server, source: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections from ``source``, each with an unfinished request head; all closed afterwards."""
    port = int(server.url.rsplit(":", 1)[1])
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
            socks.append(sock)
            sock.sendall(b"GET /metadata HTTP/1.1\r\nHost: imds\r\nX-Slow: ")
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _closed(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets the server has closed (EOF or reset readable now)."""
    readable, _, _ = select.select(socks, [], [], 0)
    closed = []
    for sock in readable:
        try:
            if sock.recv(4096) == b"":
                closed.append(sock)
        except ConnectionResetError:
            closed.append(sock)
    return closed


def _read(server: Server) -> None:
    with client_at(READER) as reader:
        answer = reader.get(f"{server.url}/metadata")
    assert answer.status_code == 200
    assert answer.json()["id"] == READER_ID


def _shut_count(server: Server) -> float:
    with client_at() as admin:
        text = admin.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).text
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("imds_connections_shut_total "))


def test_the_excess_of_one_source_is_shut_while_others_are_served(server):
    before = _shut_count(server)
    with _slow(server, ATTACKER, SLOW) as socks:
        closed: set[socket.socket] = set()

        def excess_shut() -> bool:
            _read(server)  # every poll: another instance is answered, with its own body
            closed.update(_closed([sock for sock in socks if sock not in closed]))
            return len(closed) >= SLOW - BUDGET

        wait_for(excess_shut, what=f"{SLOW - BUDGET} connections from {ATTACKER} to be shut", timeout=20)
        assert len(closed) == SLOW - BUDGET  # the budget's worth stay open (the header timeout is 60 s)
        assert _closed([sock for sock in socks if sock not in closed]) == []
    if "--workers" in server.process.args:  # a scrape is one worker's registry, counting what that worker shut
        wait_for(lambda: _shut_count(server) > 0, what="a worker to count its shutdowns", timeout=20)
    else:
        assert _shut_count(server) - before >= SLOW - BUDGET
    assert "connections.over_budget" in server.output()


def test_a_trusted_proxy_is_not_limited(server):
    with _slow(server, PROXY, 4 * BUDGET) as proxied, _slow(server, ATTACKER, 4 * BUDGET) as attacker:
        closed: set[socket.socket] = set()

        def attacker_cut() -> bool:
            closed.update(_closed([sock for sock in attacker if sock not in closed]))
            return len(closed) >= 3 * BUDGET

        # The scans that cut the attacker (opened second) saw the proxy's connections too.
        wait_for(attacker_cut, what=f"the excess from {ATTACKER} to be shut", timeout=20)
        assert _closed(proxied) == []
    _read(server)
