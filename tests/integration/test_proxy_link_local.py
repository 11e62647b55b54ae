"""``imds proxy`` on a zoned link-local listen address, ``[fe80::a9fe:a9fe%IFACE]:80``, in a test netns.

Everything runs inside a network namespace this test creates (unique name, removed at the
end): ``imds serve`` on its 127.0.0.1, the proxy on fe80::a9fe:a9fe of a veth there, and
curl as the "VM" asking ``http://[fe80::a9fe:a9fe%v0]/``. Processes are stopped by PID.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import wait_for
from imds.signing import sign
from serve_process import ADMIN_TOKEN, IMDS, START_TIMEOUT, STOP_TIMEOUT, clean_env

INSTANCE = "6a2f0c1e-1b1d-4d8e-9f00-0000000000c3"
LINK_LOCAL = "fe80::a9fe:a9fe"
SECRET = b"link-local-test-secret"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[str]:
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.fail("this test needs iproute2 and root (network namespaces)")
    name = f"imdspx{os.getpid()}{time.monotonic_ns() % 100000}"
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        for dev in ("v0", "v1"):
            ip("-n", name, "link", "set", dev, "addrgenmode", "none")  # fe80::a9fe:a9fe is v0's only address
            ip("-n", name, "link", "set", dev, "up")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "addr", "add", f"{LINK_LOCAL}/64", "dev", "v0", "nodad")
        yield name
    finally:
        ip("netns", "del", name)


def curl(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "curl", "-sS", "-g", "--max-time", "5", *args],
        capture_output=True, text=True, timeout=30, check=False,
    )


def start(ns: str, tmp_path: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    with (tmp_path / f"{name}.log").open("wb") as sink:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, str(IMDS), *args],
            env=clean_env(tmp_path, IMDS_ADMIN_TOKEN=ADMIN_TOKEN), stdin=subprocess.DEVNULL, stdout=sink,
            stderr=subprocess.STDOUT,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT)


def wait_until(check: Callable[[], object], what: str, tmp_path: Path) -> None:
    """``wait_for`` that shows the processes' logs when ``check`` never holds."""
    wait_for(check, what=what, timeout=START_TIMEOUT,
             explain=lambda: "\n".join(p.read_text(errors="replace") for p in tmp_path.glob("*.log")))


def test_proxy_on_a_zoned_link_local_address(netns: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    mapping = tmp_path / "map.json"
    mapping.write_text(f'{{"{LINK_LOCAL}": "{INSTANCE}"}}')
    serve = start(netns, tmp_path, "serve", "serve", "--db", "memory://", "--listen", "127.0.0.1:8000",
                  "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file", str(secret))
    proxy = None
    try:
        wait_until(lambda: curl(netns, "http://127.0.0.1:8000/healthz").returncode == 0, "imds serve", tmp_path)
        record = (f'{{"id": "{INSTANCE}", "ipAddresses": ["10.82.0.1"], '
                  f'"metadata": {{"id": "{INSTANCE}", "hostname": "ll"}}}}')
        pushed = curl(netns, "-H", f"Authorization: Bearer {ADMIN_TOKEN}", "-d", record,
                      "http://127.0.0.1:8000/device-metadata")
        assert '"applied":true' in pushed.stdout, pushed
        proxy = start(netns, tmp_path, "proxy", "proxy", "--listen", f"[{LINK_LOCAL}%v0]:80",
                      "--upstream", "http://127.0.0.1:8000", "--shared-secret-file", str(secret),
                      "--map", str(mapping))
        url = f"http://[{LINK_LOCAL}%25v0]:80/latest/meta-data/instance-id"
        wait_until(lambda: curl(netns, url).returncode == 0, "imds proxy", tmp_path)
        answer = curl(netns, "-H", "X-Instance-ID: someone-else", "-H",
                      f"X-Instance-ID-Signature: {sign(SECRET, 'someone-else')}", url)
        assert answer.stdout == INSTANCE, answer
    finally:
        if proxy is not None:
            stop(proxy)
        stop(serve)
