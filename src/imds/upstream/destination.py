"""Where imds may connect on a record's behalf: a destination policy, checked after resolving, on the address used.

URLs that come from records (an OS record's ``os-image`` and ``package.url``) are fetched
from the server's own network position, so whoever writes a record could otherwise point
imds at itself or at anything only the server reaches: ``http://127.0.0.1:8000/…`` would
stream a loopback-bound instance's metadata to another instance. ``fetch_client`` builds
the HTTP client those fetches use: its connections go through ``GuardedBackend``, which
resolves the host once, refuses the connection when any address it resolves to is
refused, and connects to the checked address itself (no second resolution, so a DNS
answer that changes in between cannot slip through; TLS still checks the URL's host name).
Every spelling of an address (``localhost``, ``0x7f000001``, ``2130706433``,
``017700000001``, ``[::ffff:127.0.0.1]``, NAT64's ``64:ff9b::7f00:1``) ends as the address
it resolves to, and that is what is judged:

- never: the metadata addresses (169.254.169.254, fd00:ec2::254, fe80::a9fe:a9fe) and this
  server's own listeners (``--listen``, ``--admin-listen``; a catch-all listener covers every
  address of this host);
- by default only globally routable unicast addresses: loopback, link-local, private,
  shared, reserved, multicast and the unspecified address are refused unless inside a
  ``--fetch-allow`` network (an operator whose package server is on a private range).

Redirects are never followed by these fetches; the environment's proxy settings are ignored
(a proxy would be the address checked, not the destination).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import anyio
import httpcore
import httpx

from imds.errors import ImdsError, UpstreamError, UpstreamUnavailable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "fe80::a9fe:a9fe"))
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class DestinationRefused(UpstreamError):
    """A record's URL resolves to an address imds does not connect to; ``why`` names the address and its kind."""

    def __init__(self, host: str, address: Address, why: str) -> None:
        plain = _plain(address)
        shown = str(address) if plain == address else f"{address} (IPv4 {plain})"
        super().__init__(f"host {host[:100]!r} resolves to {shown}, {why}")
        self.host = host
        self.address = address
        self.why = why


def _plain(address: Address) -> Address:
    """The IPv4 address inside an IPv4-mapped or NAT64 IPv6 address; otherwise the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _kind(address: Address) -> str:
    kinds = (("is_unspecified", "the unspecified address"), ("is_loopback", "a loopback address"),
             ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address"),
             ("is_private", "a private address"), ("is_reserved", "a reserved address"))
    return next((kind for attribute, kind in kinds if getattr(address, attribute)), "not a public address")


def _local(address: Address) -> bool:
    """Whether ``address`` is one of this host's (it can be bound)."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class DestinationPolicy:
    """``allow``: networks allowed although not public; ``listeners``: this server's own (host, port)s."""

    allow: tuple[Network, ...] = ()
    listeners: tuple[tuple[str, int], ...] = ()

    def refusal(self, address: Address, port: int) -> str | None:
        """Why imds does not connect to ``address:port``, or None."""
        plain = _plain(address)
        if address in METADATA or plain in METADATA:
            return "a metadata service address"
        if self._own(plain, port):
            return "this server's own listener"
        if any(plain.version == network.version and plain in network for network in self.allow):
            return None
        if plain.is_global and not plain.is_multicast:
            return None
        return f"{_kind(plain)} (not fetched; --fetch-allow allows a network)"

    def _own(self, address: Address, port: int) -> bool:
        for host, listening in self.listeners:
            if listening != port:
                continue
            try:
                bound = _plain(ipaddress.ip_address(host))
            except ValueError:  # a name (localhost): the loopback addresses
                if address.is_loopback:
                    return True
                continue
            if bound == address or (bound.is_unspecified and (address.is_loopback or _local(address))):
                return True
        return False


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the policy between resolving and connecting."""

    def __init__(self, policy: DestinationPolicy, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._policy = policy
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Resolve ``host`` once, check every address, connect to the first that answers."""
        addresses = await _resolve(host, port, seconds=timeout)
        for address in addresses:
            if (why := self._policy.refusal(address, port)) is not None:
                raise DestinationRefused(host, address, why)
        failure: Exception = httpcore.ConnectError(f"{host}: no address")
        for address in addresses:
            try:
                return await self._inner.connect_tcp(str(address), port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                failure = exc
        raise failure

    async def connect_unix_socket(self, path: str, timeout: float | None = None,  # noqa: ASYNC109 - httpcore's
                                  socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
                                  ) -> httpcore.AsyncNetworkStream:
        """Never: a record's URL names a host."""
        del timeout, socket_options
        raise httpcore.ConnectError(f"{path}: Unix sockets are not fetched")

    async def sleep(self, seconds: float) -> None:
        """As the inner backend sleeps."""
        await self._inner.sleep(seconds)


async def _resolve(host: str, port: int, *, seconds: float | None) -> list[Address]:
    """Every address ``host`` resolves to, in the resolver's order, each once (within ``seconds``)."""
    try:
        with anyio.fail_after(seconds) if seconds else contextlib.nullcontext():
            found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout(f"{host}: name resolution timed out") from exc
    except (OSError, UnicodeError) as exc:
        raise httpcore.ConnectError(f"{host}: {exc}") from exc
    addresses: list[Address] = []
    for *_, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def fetch_client(policy: DestinationPolicy, *, timeout: float = 5.0) -> httpx.AsyncClient:
    """The HTTP client for fetches made on a record's behalf: guarded connections, no proxy from the environment."""
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    # httpx takes no network backend; its pool is the one place to give one (checked by the destination tests)
    transport._pool = httpcore.AsyncConnectionPool(  # noqa: SLF001
        ssl_context=httpx.create_ssl_context(trust_env=False), network_backend=GuardedBackend(policy),
    )
    return httpx.AsyncClient(transport=transport, trust_env=False, timeout=timeout)


@contextlib.contextmanager
def fetch_errors(what: str, url: str, invalid: Callable[[str], ImdsError]) -> Iterator[None]:
    """A fetch of a URL a record names, its failures said as ImdsErrors naming the record's field.

    ``what`` (``package``, ``image``) names the fetch and ``url`` the field (``package.url``): a
    refused destination is an UpstreamError ``<what> refused: <url>'s host …``, any other
    transport failure UpstreamUnavailable ``<what> fetch failed: <kind>``; a URL that does not
    parse is ``invalid("is not a valid URL (…)")``. Errors imds raised itself pass through.
    """
    try:
        yield
    except httpx.InvalidURL as exc:
        raise invalid(f"is not a valid URL ({exc})") from exc
    except DestinationRefused as exc:
        raise UpstreamError(f"{what} refused: {url}'s {exc.message}") from exc
    except httpx.HTTPError as exc:
        msg = f"{what} fetch failed: {type(exc).__name__}"
        raise UpstreamUnavailable(msg) from exc
