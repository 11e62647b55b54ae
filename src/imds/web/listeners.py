"""Which listener a request came in on, when ``--admin-listen`` gives the admin API its own.

``imds serve`` runs one app on every socket; the ASGI scope's ``server`` is the local
address the connection was accepted on. A request to an ``--admin-listen`` address is an
admin request; any other is an instance request. (granian reports the port as a string,
uvicorn as an int.) An admin address bound to a wildcard
(``0.0.0.0``, ``::``) matches by port alone.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - names the wildcard addresses, binds nothing


def _normal(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        return host


class AdminListeners:
    """The ``--admin-listen`` addresses; ``serves(scope)`` says whether a request came in on one."""

    def __init__(self, addresses: Iterable[tuple[str, int]]) -> None:
        self._exact = frozenset((_normal(host), port) for host, port in addresses if host not in _WILDCARDS)
        self._any_host = frozenset(port for host, port in addresses if host in _WILDCARDS)

    def serves(self, scope: dict[str, Any] | Any) -> bool:
        """Whether the request's local address is an admin listener's."""
        server = scope.get("server")
        if not server:
            return False
        host, port = server[0], int(server[1])  # granian gives the port as a string
        return port in self._any_host or (_normal(host), port) in self._exact
