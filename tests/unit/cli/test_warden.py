"""The per-source connection budget (``imds.cli.warden``): the decision, the table parsing, the shutdown."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from helpers import FakeClock, wait_for
from imds.cli import servers
from imds.cli import warden as warden_module
from imds.cli.servers import connection_budget
from imds.cli.warden import (
    NLMSG_DONE,
    NLMSG_ERROR,
    Warden,
    dump,
    excess,
    listeners,
    ours_only,
    parse_dump,
    shut,
    to_shut,
)
from imds.config import load


def _nobody(_source: str) -> bool:
    return False


# -- the decision: (source, inode) pairs + our fds -> which to shut --------------------


def test_a_source_within_budget_keeps_every_connection():
    conns = [("10.0.0.1", inode) for inode in range(1, 9)]
    assert excess(conns, 8, _nobody) == {}


@pytest.mark.parametrize("budget", [1, 4, 8])
def test_exactly_the_budget_is_kept_and_one_more_is_shut(budget):
    """At the budget nothing is over; at budget + 1 exactly the newest (highest inode) is."""
    conns = [("10.0.0.1", inode) for inode in range(100, 100 + budget)]
    assert excess(conns, budget, _nobody) == {}
    assert excess([*conns, ("10.0.0.1", 100 + budget)], budget, _nobody) == {100 + budget: "10.0.0.1"}
    assert excess([*conns, ("10.0.0.2", 1)], budget, _nobody) == {}  # another source's connection counts for it


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


# -- reading the kernel's table (netlink sock_diag) ------------------------------------------


def _listening(host: str, family: int = socket.AF_INET) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(64)
    return sock


def test_the_dump_lists_accepted_connections_on_our_port_with_their_source_and_inode():
    """Accepted connections (server side, inode of our socket); a queued one has inode 0 and is not ours.

    A half-closed one counts: its client sent FIN (our side is in CLOSE_WAIT) but the server
    still holds the slot until it closes. One our side shut down (FIN_WAIT) no longer does.
    """
    with _listening("127.0.0.1") as listener, _listening("127.0.0.1") as other:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) for _ in range(5)]
        accepted = [listener.accept()[0] for _ in range(4)]  # the fifth waits in the backlog
        half_closed, shut_by_us = accepted[2], accepted[3]
        clients[2].shutdown(socket.SHUT_WR)
        half_closed.settimeout(5)
        assert half_closed.recv(1) == b""  # the client's FIN arrived: our side is in CLOSE_WAIT
        shut_by_us.shutdown(socket.SHUT_RDWR)  # our FIN sent: FIN_WAIT, the server let go
        elsewhere = socket.create_connection(other.getsockname())
        try:
            rows = dump(port, socket.AF_INET)
            kept = list(ours_only(rows, listeners([listener])[socket.AF_INET, port]))
            inodes = {os.fstat(sock.fileno()).st_ino for sock in accepted[:3]}
        finally:
            for sock in [*clients, *accepted, elsewhere]:
                sock.close()
    assert len(rows) == 4
    assert {row[3] for row in kept} == inodes
    assert {(row[1], row[2]) for row in kept} == {(bytes([127, 0, 0, 1]), bytes([127, 0, 0, 2]))}


def test_ipv6_connections_are_listed_and_named():
    with _listening("::1", socket.AF_INET6) as listener:
        port = listener.getsockname()[1]
        client = socket.create_connection(("::1", port))
        server, _ = listener.accept()
        try:
            rows = list(ours_only(dump(port, socket.AF_INET6), None))
            warden = Warden([listener], 8)
            assert warden.connections() == [("::1", os.fstat(server.fileno()).st_ino)]
        finally:
            client.close()
            server.close()
    assert [row[2] for row in rows] == [ipaddress.ip_address("::1").packed]


def test_a_wildcard_listener_takes_any_local_address_and_a_bound_one_only_its_own():
    with _listening("0.0.0.0") as wildcard, _listening("127.0.0.1") as bound:  # noqa: S104 - never connected to
        found = listeners([wildcard, bound])
        ports = wildcard.getsockname()[1], bound.getsockname()[1]
    assert found[socket.AF_INET, ports[0]] is None
    assert found[socket.AF_INET, ports[1]] == {bytes([127, 0, 0, 1])}
    rows = [(socket.AF_INET, bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 5),
            (socket.AF_INET, bytes([127, 0, 0, 1]), bytes([10, 0, 0, 2]), 6),
            (socket.AF_INET, bytes([127, 0, 0, 1]), bytes([10, 0, 0, 2]), 0)]
    assert [row[3] for row in ours_only(rows, None)] == [5, 6]
    assert [row[3] for row in ours_only(rows, {bytes([127, 0, 0, 1])})] == [6]


def test_a_netlink_error_is_raised_and_the_end_of_the_dump_seen():
    header = struct.Struct("=IHHII")
    error = header.pack(36, NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -errno.EINVAL) + bytes(16)
    with pytest.raises(OSError, match="sock_diag") as raised:
        parse_dump(error)
    assert raised.value.errno == errno.EINVAL
    assert parse_dump(header.pack(20, NLMSG_DONE, 0, 1, 0) + bytes(4)) == ([], True)


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


def test_the_instance_listeners_are_watched_and_an_admin_only_one_is_not():
    with _listening("127.0.0.1") as instances, _listening("127.0.0.1") as admin:
        ports = instances.getsockname()[1], admin.getsockname()[1]
        settings = load({"admin_listen": (f"127.0.0.1:{ports[1]}",), "max_connections_per_source": 5},
                        environ={"XDG_DATA_HOME": "/nonexistent-imds-test"})
        with connection_budget(None, [instances, admin], settings) as warden:
            assert set(warden.listeners) == {(socket.AF_INET, ports[0])}
            assert warden.budget == 5


def test_a_failing_scan_is_logged_once_and_the_warden_keeps_trying(monkeypatch):
    """No netlink (a sandbox without AF_NETLINK): one error line, the server keeps serving, no crash."""
    calls: list[int] = []

    def no_netlink(_port: int, _family: int) -> list[tuple[int, bytes, bytes, int]]:
        calls.append(1)
        raise PermissionError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

    monkeypatch.setattr(warden_module, "dump", no_netlink)
    with _listening("127.0.0.1") as listener, capture_logs() as logs:
        warden = Warden([listener], 4, period=0.01)
        warden.start()
        try:
            wait_for(lambda: len(calls) >= 5, what="five failed scans", timeout=10)
        finally:
            warden.stop()
    assert [entry["event"] for entry in logs] == ["connections.budget_unavailable"]


def test_an_fd_limit_under_the_connection_limits_is_warned_about(monkeypatch):
    """The default two listeners x 4096 connections need ~8,448 files: a limit of 1,024 is said at start."""
    monkeypatch.setattr(servers.resource, "getrlimit", lambda _which: (1024, 1024))
    with capture_logs() as logs:
        assert servers.raise_fd_limit(2 * 4096) == 1024
        assert servers.raise_fd_limit(512) == 1024
    assert [(entry["event"], entry["needed"]) for entry in logs] == [("fd_limit.low", 2 * 4096 + servers.FD_RESERVE)]
