"""Listening sockets made by ``imds serve``."""

from __future__ import annotations

import socket

import click
import pytest

from imds.cli.serve import bind


def test_listening_socket_disables_nagle():
    """Sockets are TCP_NODELAY: split header/body writes must not wait for delayed ACKs (bench/results.md)."""
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        accepted_peer = socket.create_connection(sock.getsockname()[:2])
        conn, _ = sock.accept()
        with accepted_peer, conn:
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()


def test_ipv6_socket_is_v6_only():
    """An IPv6 listener leaves the IPv4 wildcard free for a second --listen."""
    sock = bind("::1", 0)
    try:
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
    finally:
        sock.close()


def test_port_in_use_is_a_one_line_error():
    """Binding a taken port raises a ClickException naming the address."""
    first = bind("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        with pytest.raises(click.ClickException, match=f"cannot listen on 127.0.0.1:{port}"):
            bind("127.0.0.1", port)
    finally:
        first.close()


@pytest.mark.parametrize(("host", "level", "option"), [
    ("127.0.0.1", socket.IPPROTO_IP, socket.IP_TTL),
    ("::1", socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS),
])
def test_hop_limit_reaches_accepted_connections(host, level, option):
    """--token-hop-limit N sets the TTL/hop limit of the connections the listener accepts."""
    sock = bind(host, 0, hop_limit=2)
    try:
        peer = socket.create_connection(sock.getsockname()[:2])
        conn, _ = sock.accept()
        with peer, conn:
            assert conn.getsockopt(level, option) == 2
    finally:
        sock.close()


def test_no_hop_limit_keeps_the_system_default():
    """Without --token-hop-limit the TTL is the kernel's default (64 here), not 0."""
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TTL) > 2
    finally:
        sock.close()
