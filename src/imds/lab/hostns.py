"""The run's host: a network namespace of its own for the switch, the agent, haproxy and the guest's taps.

Every userspace ``ovs-vswitchd`` opens one tap named ``ovs-netdev`` for its netdev datapath, in
its network namespace, so two switches in one namespace collide: a lab boot beside an OVS test
(or another lab run) waited for the other to finish. In a namespace made for the run, the lab's
switch has its own ``ovs-netdev`` and waits for nobody, and nothing of the run's network (taps,
veths, internal ports) shows up in the host's namespace.

What runs where:

- ``ovsdb-server`` and ``ovs-vswitchd`` start through ``ip netns exec`` (it execs: the PID the
  lab holds is the daemon's; its ``/sys`` is the namespace's);
- ``imds agent`` and QEMU start through ``nsenter --net`` (it execs too, and keeps the lab's
  mount namespace, so the ``--meta-netns`` the agent adds under ``/run/netns`` is the lab's to
  remove); the agent's haproxy is the agent's child, QEMU opens the taps the lab made in here;
- taps and the host ends of the DHCP port's and the router's veths are made with ``ip -n``;
- ``imds serve`` (the lab's own, or ``--url``'s) stays in the lab's namespace: ``Relay`` carries
  the agent's connections to it (below), so serve still sees them come from 127.0.0.1.

Removing the namespace at the end removes whatever was left in it.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from contextlib import suppress
from dataclasses import dataclass, field

from imds.errors import LabError
from imds.lab.run import Cleanup, sh

CLONE_NEWNET = 0x40000000
MAX_CONNECTIONS = 64  # the agent's haproxy opens a few; more is a fault, refused rather than queued
CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class HostNs:
    """A network namespace the lab made for one run (``imdslab-host-TAG``)."""

    name: str

    @property
    def path(self) -> str:
        """Its bind mount (what ``nsenter --net`` and ``setns`` open)."""
        return f"/run/netns/{self.name}"

    def ip(self, *args: str) -> tuple[str, ...]:
        """An ``ip`` command run in the namespace."""
        return ("ip", "-n", self.name, *args)

    @property
    def enter(self) -> tuple[str, ...]:
        """The prefix that starts a program in the namespace, in the lab's mount namespace (the agent, QEMU)."""
        return ("nsenter", f"--net={self.path}")

    @property
    def exec(self) -> tuple[str, ...]:
        """The prefix that starts a program in the namespace with its own ``/sys`` (the OVS daemons)."""
        return ("ip", "netns", "exec", self.name)

    def create(self, cleanup: Cleanup) -> None:
        """Add it with its loopback up; removed at cleanup (after everything added later was undone)."""
        cleanup.command("ip", "netns", "del", self.name)
        sh("ip", "netns", "add", self.name)
        sh(*self.ip("link", "set", "lo", "up"))


def _setns(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` refers to."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def listen_in(namespace: HostNs) -> socket.socket:
    """A TCP listener on 127.0.0.1 (a free port) inside ``namespace``.

    A thread of its own enters the namespace, makes the socket and leaves (a socket stays in the
    namespace it was made in); the thread then ends, so no other thread is ever moved.
    """
    made: list[socket.socket | OSError] = []

    def inside() -> None:
        try:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            try:
                there = os.open(namespace.path, os.O_RDONLY)
                try:
                    _setns(there)
                finally:
                    os.close(there)
                try:
                    made.append(socket.create_server(("127.0.0.1", 0)))
                finally:
                    _setns(own)
            finally:
                os.close(own)
        except OSError as exc:
            made.append(exc)

    thread = threading.Thread(target=inside, name=f"listen in {namespace.name}")
    thread.start()
    thread.join(timeout=30.0)
    found = made[0] if made else OSError("the thread making the listener did not finish")
    if isinstance(found, OSError):
        for extra in made[1:]:
            if isinstance(extra, socket.socket):
                extra.close()
        raise LabError(f"cannot listen inside network namespace {namespace.name}: {found}")
    return found


@dataclass
class Relay:
    """TCP from 127.0.0.1:``port`` inside the run's namespace to ``target`` in the lab's (imds serve).

    Each accepted connection gets a connection to ``target`` made here and the bytes copied both
    ways (a half-close passed on), in two threads; at most ``MAX_CONNECTIONS`` at once.
    """

    listener: socket.socket
    target: tuple[str, int]
    _open: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _accepting: threading.Thread | None = None
    port: int = field(init=False, default=0)  # on the namespace's 127.0.0.1

    def start(self) -> Relay:
        """Accept in a thread of its own until ``close``."""
        self.port = int(self.listener.getsockname()[1])
        self.listener.settimeout(0.5)
        self._accepting = threading.Thread(target=self._accept, name="relay", daemon=True)
        self._accepting.start()
        return self

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                inner, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            with self._lock:
                full = len(self._open) >= 2 * MAX_CONNECTIONS  # two sockets a connection
                if not full:
                    self._open.add(inner)
            if full:
                inner.close()
                continue
            threading.Thread(target=self._pipe, args=(inner,), name="relay connection", daemon=True).start()

    def _pipe(self, inner: socket.socket) -> None:
        inner.settimeout(None)
        try:
            outer = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT)
        except OSError:
            self._drop(inner)
            return
        outer.settimeout(None)
        with self._lock:
            self._open.add(outer)
        back = threading.Thread(target=_copy, args=(outer, inner), name="relay back", daemon=True)
        back.start()
        _copy(inner, outer)
        back.join()
        self._drop(inner)
        self._drop(outer)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        sock.close()

    def close(self) -> None:
        """Stop accepting and cut every open connection."""
        self._stopped.set()
        self.listener.close()
        with self._lock:
            for sock in list(self._open):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        if self._accepting is not None:
            self._accepting.join(timeout=5.0)


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from ``source`` to ``sink`` until ``source`` ends (then half-close ``sink``) or either fails."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (source, sink):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def relay(cleanup: Cleanup, namespace: HostNs, target: tuple[str, int]) -> Relay:
    """A started ``Relay`` into ``namespace``, closed at cleanup."""
    started = Relay(listen_in(namespace), target).start()
    cleanup.add(f"close the relay to {target[0]}:{target[1]}", started.close)
    return started
