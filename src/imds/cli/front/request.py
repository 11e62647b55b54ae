"""A parsed request as the app sees it: its ASGI scope, and uvicorn's request cycle for the ASGI path."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from imds.errors import InvalidInput
from imds.web.routing import Scope

ASGI = {"version": "3.0", "spec_version": "2.3"}


def scope_of(  # noqa: PLR0913 - the parts of a request head, as the parser left them
    method: bytes, url: bytes, version: str, headers: list[tuple[bytes, bytes]], *,
    client: tuple[str, int], server: tuple[str, int], path: str | None = None,
) -> Scope:
    """The request's ASGI ``http`` scope (what uvicorn's parser makes of it); InvalidInput for a bad target.

    ``path``: ``url`` decoded, when the caller found it a plain path (ASCII, no query, no escapes).
    """
    if path is not None:
        raw, query = url, b""
    else:
        raw, query, path = _target(url)
    return {"type": "http", "http_version": version, "scheme": "http", "method": method.decode("ascii"),
            "path": path, "raw_path": raw, "query_string": query, "root_path": "", "headers": headers,
            "client": client, "server": server}


def _target(url: bytes) -> tuple[bytes, bytes, str]:
    """The raw path, query string and decoded path of a request target; InvalidInput when it is not one."""
    if url[:1] == b"/" and b"?" not in url and b"%" not in url:
        raw, query = url, b""
    else:
        try:
            parsed = httptools.parse_url(url)
        except httptools.HttpParserInvalidURLError:
            raise InvalidInput.one("request", "the request target is not a valid URL") from None
        raw, query = parsed.path, parsed.query or b""
    try:
        path = raw.decode("ascii")
    except UnicodeDecodeError:
        raise InvalidInput.one("request", "the request target must be ASCII (percent-encode the rest)") from None
    if "%" in path:
        path = urllib.parse.unquote(path)
    return raw, query, path


def asgi_cycle(  # noqa: PLR0913 - uvicorn's cycle takes each of these
    scope: Scope, transport: asyncio.Transport, flow: FlowControl, logger: Any,
    default_headers: list[tuple[bytes, bytes]], *, keep_alive: bool, on_response: Callable[[], None],
) -> RequestResponseCycle:
    """Uvicorn's ``RequestResponseCycle`` for a request the ASGI app answers, as uvicorn's protocol makes it.

    HTTP/1.0 connections close after it, as under uvicorn; ``Expect: 100-continue`` is honoured.
    """
    scope["asgi"] = ASGI
    scope["state"] = {}
    expect = any(name == b"expect" and value.lower() == b"100-continue" for name, value in scope["headers"])
    return RequestResponseCycle(
        scope=scope,  # type: ignore[arg-type] # uvicorn's TypedDict: the same keys
        transport=transport, flow=flow, logger=logger, access_logger=logger, access_log=False,
        default_headers=default_headers, message_event=asyncio.Event(), expect_100_continue=expect,
        keep_alive=keep_alive and scope["http_version"] != "1.0", on_response=on_response,
    )
