"""The change watch and the ETag through both doors in front of serve: ``imds proxy`` and the agent's haproxy.

Real processes on loopback: one ``imds serve`` (trusting 127.0.0.1 and sharing the secret),
one ``imds proxy`` and one haproxy with the agent's config, each in front of it. Both are
given a short ordinary bound (``--timeout 1`` / ``timeout server 1s``) and serve a short
``--watch-max-timeout``, so a wait longer than that bound shows the door holds a legitimate
long poll open (and the tests end in seconds).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from helpers import wait_for
from imds.agent.haproxy import Backend, Frontend, Upstream, render
from imds.agent.haproxyctl import Haproxy
from proxy_process import proxying
from serve_process import Server, client_at, free_port, in_background, metric, serving
from token_put_cases import recording_upstream

ALPHA = "8a2f0c1e-1b1d-4d8e-9f00-0000000000a1"
VM = "127.0.0.2"
SECRET = b"harden-watch-test-secret"
WATCH_MAX = 6
BOUND = 15.0  # seconds any one step may take before the test fails

Door = Callable[[], str]  # the URL the VM reaches serve through


def _push(server: Server, hostname: str) -> None:
    server.post("/device-metadata", {"id": ALPHA, "ipAddresses": ["10.83.0.1"],
                                      "metadata": {"id": ALPHA, "hostname": hostname}})


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("harden-watch")
    (path / "secret").write_bytes(SECRET)
    (path / "map.txt").write_text(f"{VM} {ALPHA}\n")
    return path


@pytest.fixture(scope="module")
def server(base: Path) -> Iterator[Server]:
    args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file",
            str(base / "secret"), "--watch-max-timeout", str(WATCH_MAX))
    with serving(base, *args) as running:
        _push(running, "first")
        yield running


@pytest.fixture(scope="module")
def proxy_url(base: Path, server: Server) -> Iterator[str]:
    args = ("--upstream", server.url, "--shared-secret-file", str(base / "secret"), "--map", str(base / "map.txt"),
            "--timeout", "1", "--watch-max-timeout", str(WATCH_MAX))
    with proxying(base, *args) as running:
        yield running.url


@contextmanager
def _haproxy(state: Path, upstream: str) -> Iterator[str]:
    """A haproxy with the agent's config (ordinary bound 1 s, watches up to WATCH_MAX more) before ``upstream``."""
    binary = shutil.which("haproxy", path="/usr/sbin:/usr/bin:/sbin")
    if binary is None:
        pytest.fail("haproxy is not installed: scripts/test installs it")
    state.mkdir()
    port = free_port()
    frontend = Frontend(("127.0.0.1",), port=port, watch_max_timeout=WATCH_MAX, server_timeout=1)
    haproxy = Haproxy(binary, state, SECRET)
    haproxy.apply(render(frontend, [Backend("tap-a", (VM,), ALPHA)], Upstream.parse(upstream)))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        haproxy.stop()


@pytest.fixture(scope="module")
def haproxy_url(base: Path, server: Server) -> Iterator[str]:
    with _haproxy(base / "haproxy-state", server.url) as url:
        yield url


@pytest.fixture(params=["proxy", "haproxy"])
def door(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


def _get(url: str, **params: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    with client_at(VM) as client:
        answer = client.get(f"{url}/metadata", params=params, timeout=BOUND)
    return answer, time.monotonic() - started


def test_a_write_wakes_a_guest_waiting_through_the_door(door: str, server: Server) -> None:
    """The read carries an ETag; a held read answers the new document and a new ETag as soon as it is written."""
    first, _ = _get(door)
    assert first.status_code == 200, first.text
    etag = first.headers.get("etag")
    assert etag, dict(first.headers)
    held = in_background(lambda: _get(door, wait_for_change="true", last_etag=etag, timeout_sec=str(WATCH_MAX)))
    wait_for(lambda: metric(server, "imds_watch_waiting") == 1, what="the read is held by serve", timeout=BOUND)
    hostname = f"after-{time.monotonic_ns()}"
    _push(server, hostname)
    result = held.get(timeout=BOUND)
    assert not isinstance(result, Exception), result
    answer, elapsed = result
    assert answer.status_code == 200, answer.text
    assert answer.json()["hostname"] == hostname
    assert answer.headers.get("etag") not in (etag, None)
    assert elapsed < WATCH_MAX - 1  # woken by the write, not by its timeout


def test_without_a_write_the_guest_waits_its_timeout_not_the_doors(door: str) -> None:
    """timeout_sec=3 through a door whose ordinary bound is 1 s: held ~3 s, then the current document (200)."""
    etag = _get(door)[0].headers["etag"]
    answer, elapsed = _get(door, wait_for_change="true", last_etag=etag, timeout_sec="3")
    assert answer.status_code == 200, answer.text
    assert answer.headers["etag"] == etag
    assert 2.9 <= elapsed < 3 + 2.0, elapsed


def test_an_outdated_etag_is_answered_at_once_through_the_door(door: str) -> None:
    """The watch is serve's: an outdated last_etag is answered at once, the door adds no wait of its own."""
    answer, elapsed = _get(door, wait_for_change="true", last_etag='"outdated"', timeout_sec="5")
    assert answer.status_code == 200, answer.text
    assert elapsed < 1.0


def test_if_none_match_and_etag_pass_both_doors(base: Path) -> None:
    """The VM's If-None-Match reaches the upstream as sent, through the proxy and through haproxy."""
    with recording_upstream() as recorder:
        args = ("--upstream", recorder.url, "--shared-secret-file", str(base / "secret"), "--map",
                str(base / "map.txt"))
        with proxying(base, *args) as proxy, _haproxy(base / "recorder-state", recorder.url) as haproxy:
            for url in (proxy.url, haproxy):
                with client_at(VM) as client:
                    answer = client.get(f"{url}/metadata", headers={"If-None-Match": '"v1"'})
                assert (answer.status_code, answer.text) == (200, "ok")
                assert recorder.last("if-none-match") == ['"v1"']
