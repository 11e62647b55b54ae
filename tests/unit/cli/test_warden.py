"""The per-source connection budget (``imds.cli.warden``): the decision, the table parsing, the shutdown."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from helpers import FakeClock
from imds.cli.warden import Listeners, Warden, excess, shut, to_shut


def _nobody(_source: str) -> bool:
    return False


# -- the decision: (source, inode) pairs + our fds -> which to shut --------------------


def test_a_source_within_budget_keeps_every_connection():
    conns = [("10.0.0.1", inode) for inode in range(1, 9)]
    assert excess(conns, 8, _nobody) == {}


def test_the_connections_over_budget_are_the_highest_inodes_of_that_source():
    conns = [("10.0.0.1", inode) for inode in (50, 10, 40, 20, 30)] + [("10.0.0.2", 5), ("10.0.0.2", 6)]
    assert excess(conns, 3, _nobody) == {40: "10.0.0.1", 50: "10.0.0.1"}


def test_budget_zero_is_off():
    conns = [("10.0.0.1", inode) for inode in range(1000)]
    assert excess(conns, 0, _nobody) == {}


def test_an_exempt_source_is_never_over_budget():
    conns = [("10.0.0.1", inode) for inode in range(100)] + [("10.0.0.9", inode) for inode in range(100, 110)]
    over = excess(conns, 4, lambda source: source == "10.0.0.1")
    assert set(over.values()) == {"10.0.0.9"}
    assert sorted(over) == list(range(104, 110))


def test_only_the_excess_this_process_holds_is_shut():
    """Another worker's connections count towards the budget but are its own to shut."""
    over = {40: "10.0.0.1", 50: "10.0.0.1", 60: "10.0.0.2"}
    assert to_shut(over, {50: 7, 60: 9, 70: 11}) == [(7, 50, "10.0.0.1"), (9, 60, "10.0.0.2")]


# -- reading the kernel's table ------------------------------------------------------------


def _row(local: str, remote: str, state: str, inode: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0 100 0 0"


HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"


def _listening(host: str, family: int = socket.AF_INET) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(64)
    return sock


def test_the_table_rows_of_our_listeners_are_read_with_their_source():
    """Rows on our address and port, ESTABLISHED or CLOSE_WAIT, accepted (inode != 0); the rest are not ours."""
    with _listening("127.0.0.1") as listener:
        port = listener.getsockname()[1]
        ours = f"0100007F:{port:04X}"
        table = "\n".join([
            HEADER,
            _row(ours, "0200007F:9C40", "01", 1001),  # 127.0.0.2, established: counted
            _row(ours, "0200007F:9C41", "08", 1002),  # close-wait: still holds a slot
            _row(ours, "0200007F:9C42", "01", 0),  # not accepted yet: no slot
            _row(ours, "0200007F:9C43", "0A", 1003),  # listening
            _row(ours, "0200007F:9C44", "06", 1004),  # time-wait
            _row(f"0100007F:{(port + 1) % 65536:04X}", "0200007F:9C45", "01", 1005),  # another port
            _row(f"0300007F:{port:04X}", "0200007F:9C46", "01", 1006),  # another local address
            _row("0A000001:0050", ours, "01", 1007),  # a client of ours, not our server side
        ]).encode()
        warden = Warden([listener], 8)
        rows = list(warden.listeners.rows(socket.AF_INET, table))
    assert [inode for _remote, inode in rows] == [1001, 1002]
    assert {warden._name(socket.AF_INET, remote) for remote, _inode in rows} == {"127.0.0.2"}


def test_a_wildcard_listener_matches_its_port_on_any_address():
    with _listening("0.0.0.0") as listener:  # noqa: S104 - bound for the test, never connected to
        port = listener.getsockname()[1]
        listeners = Listeners.of([listener])
        table = f"{HEADER}\n{_row(f'0A000001:{port:04X}', '0B000001:1234', '01', 77)}".encode()
        assert [inode for _r, inode in listeners.rows(socket.AF_INET, table)] == [77]


def test_ipv6_addresses_are_decoded():
    with _listening("::1", socket.AF_INET6) as listener:
        port = listener.getsockname()[1]
        warden = Warden([listener], 8)
        local = f"00000000000000000000000001000000:{port:04X}"  # ::1, words in host (little-endian) order
        remote = "B80D0120000000000000000001000000"  # 2001:db8::1
        table = f"{HEADER}\n{_row(local, remote + ':D431', '01', 99)}".encode()
        rows = list(warden.listeners.rows(socket.AF_INET6, table))
    assert rows == [(remote.encode(), 99)]
    assert warden._name(socket.AF_INET6, remote.encode()) == "2001:db8::1"


def test_trusted_proxy_networks_are_exempt():
    with _listening("127.0.0.1") as listener:
        warden = Warden([listener], 8, [ipaddress.ip_network("10.1.0.0/16")])
    assert warden.exempt("10.1.2.3")
    assert not warden.exempt("10.2.0.1")


# -- the shutdown, on real sockets held by this process -------------------------------------


@contextlib.contextmanager
def _accepted(count: int, source: str) -> Iterator[tuple[socket.socket, list[socket.socket], list[socket.socket]]]:
    """A listener on 127.0.0.1, ``count`` clients from ``source`` and their accepted sides, all closed after."""
    with _listening("127.0.0.1") as listener:
        clients, servers = [], []
        try:
            for _ in range(count):
                client = socket.create_connection(listener.getsockname(), timeout=5, source_address=(source, 0))
                clients.append(client)
                servers.append(listener.accept()[0])
            yield listener, clients, servers
        finally:
            for sock in clients + servers:
                sock.close()


def _closed(client: socket.socket) -> bool:
    """True if the server side shut the connection (EOF now), False if it is still open."""
    client.setblocking(False)  # noqa: FBT003 - the socket API
    try:
        return client.recv(1) == b""
    except BlockingIOError:
        return False
    finally:
        client.setblocking(True)  # noqa: FBT003 - the socket API


def test_a_scan_shuts_the_excess_and_the_clients_see_it_closed():
    with _accepted(10, "127.0.0.2") as (listener, clients, _servers):
        warden = Warden([listener], 4)
        assert warden.scan() == 6
        for client in clients:  # the FIN is delivered before the shutdown returns on loopback; poll anyway
            client.settimeout(5)
        assert [client.recv(1) for client in clients[4:]] == [b""] * 6  # EOF, not a timeout
        assert not any(_closed(client) for client in clients[:4])
        assert warden.scan() == 0  # shut connections are no longer ESTABLISHED: not shut twice


def test_a_trusted_source_is_not_limited():
    with _accepted(10, "127.0.0.2") as (listener, clients, _servers):
        warden = Warden([listener], 4, [ipaddress.ip_network("127.0.0.2/32")])
        assert warden.scan() == 0
        assert not any(_closed(client) for client in clients)


def test_a_reused_fd_is_never_shut():
    """The fd is checked against the inode the table named: another socket on that fd is left alone."""
    with _accepted(1, "127.0.0.2") as (_listener, clients, servers):
        inode = os.fstat(servers[0].fileno()).st_ino
        assert not shut(servers[0].fileno(), inode + 1)
        assert not _closed(clients[0])
        assert shut(servers[0].fileno(), inode)
        clients[0].settimeout(5)
        assert clients[0].recv(1) == b""


def test_shutdowns_are_counted_and_logged_once_per_source_per_interval():
    clock = FakeClock(0.0)
    counted: list[int] = []
    with _listening("127.0.0.1") as listener:
        warden = Warden([listener], 4, on_shut=counted.append, clock=clock)
    with capture_logs() as logs:
        for _ in range(5):
            warden._note({"127.0.0.2": 3})
        clock.advance(10.0)
        warden._note({"127.0.0.2": 1})
    lines = [entry for entry in logs if entry["event"] == "connections.over_budget"]
    assert [line["shut"] for line in lines] == [3, 13]
    with _accepted(6, "127.0.0.2") as (listener, _clients, _servers):
        warden = Warden([listener], 4, on_shut=counted.append, clock=clock)
        warden.scan()
    assert counted == [2]


@pytest.mark.parametrize("budget", [0, -1])
def test_no_thread_runs_when_the_budget_is_off(budget):
    with _listening("127.0.0.1") as listener:
        warden = Warden([listener], budget)
        warden.start()
        assert warden._thread is None
        warden.stop()
