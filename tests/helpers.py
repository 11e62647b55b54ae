"""Test helpers: the app in-process (caller's address as an explicit input), fixtures, bounded waits."""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

from factories import new_id
from imds.app import build_app
from imds.config import Settings
from imds.store import Store
from imds.web.instance import InstanceFront

ADMIN_TOKEN = "test-admin-token"
ADMIN_PEER = "192.0.2.250"
FIXTURES = Path(__file__).parent / "fixtures"
T = TypeVar("T")
WAIT_TIMEOUT = 30.0  # seconds: generous, CI is a loaded 2-core box
POLL_INTERVAL = 0.05  # seconds between two looks at a condition
# Fake upstreams listen on loopback, which the destination policy refuses for URLs from records by default
LOOPBACK_FETCHES = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
LOOPBACK_FETCH_ARGS = ("--fetch-allow", "127.0.0.0/8", "--fetch-allow", "::1/128")


def fixture_path(name: str) -> Path:
    """The reference file ``name`` from tests/fixtures (the design's examples, kept in the repository)."""
    path = FIXTURES / name
    assert path.is_file(), f"no test fixture {name!r} in {FIXTURES}"
    return path


def fixture_json(name: str) -> Any:
    """The JSON reference file ``name`` from tests/fixtures, parsed afresh on every call."""
    return json.loads(fixture_path(name).read_text())


def make_settings(**overrides: Any) -> Settings:
    """Settings for tests: in-memory store and a known admin token unless overridden."""
    values: dict[str, Any] = {"db": "memory://", "admin_token": ADMIN_TOKEN, "feed_poll_interval": 0.05}
    # In-process crawls send hundreds of requests from one address in well under a second;
    # the rate limit has its own tests (tests/security/test_http_abuse.py, services/test_ratelimit.py).
    values["rate_limit"] = 0.0
    # No OS definitions from this machine's Ganeti search path (tests/unit/services/test_os_search_path.py has its own)
    values["ganeti_os_search_path"] = ()
    values.update(overrides)
    return Settings.of(**values)


@asynccontextmanager
async def running_app(
    settings: Settings | None = None, *, store: Store | None = None
) -> AsyncIterator[InstanceFront]:
    """The app with its services started (the lifespan, without a server)."""
    app = build_app(settings or make_settings(), store=store)
    async with app.services.running():
        yield app


def client_from(
    app: InstanceFront, ip: str = ADMIN_PEER, *, token: str | None = None, **kwargs: Any
) -> httpx.AsyncClient:
    """An HTTP client whose requests reach ``app`` from source address ``ip``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=app, client=(ip, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://imds.test", headers=headers, **kwargs)


async def guest_get(app: InstanceFront, ip: str, path: str) -> httpx.Response:
    """One GET of ``path`` from the instance address ``ip``."""
    async with client_from(app, ip) as guest:
        return await guest.get(path)


def admin_client(app: InstanceFront, token: str = ADMIN_TOKEN) -> httpx.AsyncClient:
    """A client carrying the test admin token."""
    return client_from(app, ADMIN_PEER, token=token)


async def push_record(
    target: httpx.AsyncClient | InstanceFront,
    ips: list[str],
    document: dict[str, Any] | None = None,
    userdata: str | None = None,
    *,
    instance_id: str | None = None,
    userdata_encoding: str | None = None,
) -> str:
    """POST an instance's metadata (and ``userdata``, if given) for ``ips``; fail unless each was applied.

    ``target`` is an admin client or the app (then the test admin token is used). The id is
    ``instance_id``, else the document's ``id``, else a fresh one; the default document holds
    only ``id`` and ``hostname``. Returns the id.
    """
    if isinstance(target, InstanceFront):
        async with admin_client(target) as admin:
            return await push_record(admin, ips, document, userdata, instance_id=instance_id,
                                     userdata_encoding=userdata_encoding)
    record_id = instance_id or (document or {}).get("id") or new_id()
    if document is None:
        document = {"id": record_id, "hostname": f"host-{record_id[:8]}"}
    bodies: list[tuple[str, dict[str, Any]]] = [("/device-metadata", {"metadata": document})]
    if userdata is not None:
        encoding = {"userdata_encoding": userdata_encoding} if userdata_encoding else {}
        bodies.append(("/device-userdata", {"userdata": userdata, **encoding}))
    for path, body in bodies:
        answer = await target.post(path, json={"id": record_id, "ipAddresses": ips, **body})
        assert answer.status_code == 200, answer.text
        assert answer.json()["applied"] is True, answer.text
    return str(record_id)


class FakeClock:
    """Monotonic seconds that only the test moves: call it to read, ``advance`` (or set ``now``) to move it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.now += seconds


def _timed_out(what: str, timeout: float, explain: Callable[[], str] | None) -> AssertionError:
    message = f"timed out after {timeout:g} s waiting for {what}"
    return AssertionError(f"{message}\n{explain()}" if explain else message)


def wait_for(
    condition: Callable[[], T],
    *,
    what: str,
    timeout: float = WAIT_TIMEOUT,
    ignoring: tuple[type[Exception], ...] = (),
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    Fails the test with "timed out after <timeout> s waiting for <what>" (plus ``explain()``, e.g.
    a process log) once ``timeout`` seconds have passed. Exceptions listed in ``ignoring`` count
    as "not yet" (a server still binding, say); any other exception fails at once.
    """
    started = time.monotonic()
    while True:
        try:
            result = condition()
        except ignoring:
            pass
        else:
            if result:
                return result
        if time.monotonic() - started > timeout:
            raise _timed_out(what, timeout, explain)
        time.sleep(POLL_INTERVAL)


async def wait_for_async(
    condition: Callable[[], T | Awaitable[T]],
    *,
    what: str,
    timeout: float = WAIT_TIMEOUT,  # noqa: ASYNC109 - a polling bound with the same meaning as wait_for's
) -> T:
    """``wait_for`` inside a running event loop: polls without blocking it (``condition`` may be async)."""
    started = time.monotonic()
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]  # awaited above
        if time.monotonic() - started > timeout:
            raise _timed_out(what, timeout, None)
        await asyncio.sleep(POLL_INTERVAL / 5)


def count_signing(signer: Any) -> list[str]:
    """Record each private-key operation an identity signer makes from now on (``pkcs7`` or ``signature``)."""
    made: list[str] = []

    def counted(name: str) -> Callable[[bytes], str]:
        make = getattr(signer, name)

        def sign(data: bytes) -> str:
            made.append(name)
            return str(make(data))

        return sign

    for name in ("pkcs7", "signature"):
        setattr(signer, name, counted(name))
    return made
