"""One key per host, through HTTP: real ``imds proxy`` processes and the agent's haproxy on two hosts.

``imds serve`` holds the fleet secret (``--proxy-fleet-secret-file``); each "host" gets its own key
from ``imds host-key``. The records say where each instance runs (their metadata's ``host``): a
host reads the instances on it, and a signature from another host is refused (403), so a
captured key signs for that host's instances alone. The one shared secret still works beside it
(the migration path), and serve says at startup that it is the weaker mode.
"""

from __future__ import annotations

import json
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from imds.agent.haproxy import Backend, Frontend, Upstream, render
from imds.agent.haproxyctl import Haproxy
from imds.signing import SigningKey, host_key, sign_stamped
from proxy_process import proxying
from serve_process import Server, client_at, free_port, run_imds, serving

ALPHA = "8a2f0c1e-1b1d-4d8e-9f00-0000000000a1"  # on host-a
BETA = "8a2f0c1e-1b1d-4d8e-9f00-0000000000b2"  # on host-b
GAMMA = "8a2f0c1e-1b1d-4d8e-9f00-0000000000c3"  # no host in its record
VM_1, VM_2, VM_3 = "127.0.0.2", "127.0.0.3", "127.0.0.4"
FLEET = b"the-fleet-secret-only-serve-holds"
OLD_FLEET = b"last-years-fleet-secret"
SHARED = b"the-one-secret-every-host-had"


@dataclass
class Stack:
    base: Path
    server: Server
    fleet: Path
    keys: dict[str, Path]  # host → its key file, from `imds host-key`
    shared: Path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("hostkeys")
    fleet, shared = _write(base / "fleet", FLEET + b"\n"), _write(base / "shared", SHARED)
    keys = {}
    for host in ("host-a", "host-b"):
        keys[host] = base / f"{host}.key"
        done = run_imds(base, "host-key", "--fleet-secret-file", str(fleet), host, "-o", str(keys[host]))
        assert done.returncode == 0, done.stderr
    args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-fleet-secret-file", str(fleet),
            "--proxy-shared-secret-file", str(shared))
    with serving(base, *args) as server:
        for instance_id, host in ((ALPHA, "host-a"), (BETA, "host-b"), (GAMMA, None)):
            metadata = {"id": instance_id, "hostname": f"vm-{instance_id[-2:]}", **({"host": host} if host else {})}
            server.post("/device-metadata", {"id": instance_id, "ipAddresses": [f"10.84.0.{len(keys) + 1}"],
                                             "metadata": metadata})
        yield Stack(base, server, fleet, keys, shared)


def _map(stack: Stack, name: str, lines: dict[str, str]) -> Path:
    path = stack.base / f"map-{name}"
    path.write_text("".join(f"{vm} {instance}\n" for vm, instance in lines.items()))
    return path


def _read(url: str, vm: str, path: str = "/latest/meta-data/instance-id") -> tuple[int, str]:
    with client_at(vm) as client:
        answer = client.get(f"{url}{path}", timeout=10.0)
    return answer.status_code, answer.text


def test_imds_host_key_prints_the_derived_key_into_a_private_file(stack):
    """`imds host-key` writes HKDF(fleet secret, host) in hex, mode 0600, and will not overwrite a file."""
    key = stack.keys["host-a"]
    assert key.read_bytes() == host_key(FLEET, "host-a") + b"\n"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    again = run_imds(stack.base, "host-key", "--fleet-secret-file", str(stack.fleet), "host-a", "-o", str(key))
    assert again.returncode != 0
    assert "--output" in again.stderr
    printed = run_imds(stack.base, "host-key", "--fleet-secret-file", str(stack.fleet), "host-b")
    assert printed.stdout == stack.keys["host-b"].read_text()
    refused = run_imds(stack.base, "host-key", "--fleet-secret-file", str(stack.fleet), "host a")
    assert refused.returncode != 0


def test_each_host_reads_the_instances_on_it_and_no_other(stack):
    """Host A's proxy reads ALPHA (on host-a) and GAMMA (no host); claiming BETA (on host-b) it gets 403."""
    mapping = _map(stack, "a", {VM_1: ALPHA, VM_2: BETA, VM_3: GAMMA})
    args = ("--upstream", stack.server.url, "--host-key-file", str(stack.keys["host-a"]), "--host-name", "host-a",
            "--map", str(mapping))
    with proxying(stack.base, *args) as proxy:
        assert _read(proxy.url, VM_1) == (200, ALPHA)
        assert _read(proxy.url, VM_3) == (200, GAMMA)
        assert _read(proxy.url, VM_2) == (403, "403 - Forbidden")  # serve's answer, nothing of BETA's record
        assert "proxy.shared_secret" not in proxy.output()
    refusals = [json.loads(line) for line in stack.server.output().splitlines() if "proxy.foreign_host" in line]
    assert refusals[-1]["instance_id"] == BETA
    assert (refusals[-1]["host"], refusals[-1]["record_host"]) == ("host-a", "host-b")
    mapping_b = _map(stack, "b", {VM_1: BETA})
    args_b = ("--upstream", stack.server.url, "--host-key-file", str(stack.keys["host-b"]), "--host-name", "host-b",
              "--map", str(mapping_b))
    with proxying(stack.base, *args_b) as proxy_b:
        assert _read(proxy_b.url, VM_1) == (200, BETA)


def test_a_host_named_beside_the_document_binds_the_instance_as_well(stack):
    """A write naming ``host`` at its top level (as Nova's instance.host): host-a is refused, host-b reads.

    A host the check could not use (a number, a bad name) is a 400 naming the field, and nothing is written.
    """
    delta = "8a2f0c1e-1b1d-4d8e-9f00-0000000000d4"
    stack.server.post("/device-metadata", {"id": delta, "ipAddresses": ["10.84.0.44"], "host": "host-b",
                                           "metadata": {"id": delta, "hostname": "vm-d4"}})
    for host, expected in (("host-a", (403, "403 - Forbidden")), ("host-b", (200, delta))):
        mapping = _map(stack, f"top-{host}", {VM_1: delta})
        args = ("--upstream", stack.server.url, "--host-key-file", str(stack.keys[host]), "--host-name", host,
                "--map", str(mapping))
        with proxying(stack.base, *args) as proxy:
            assert _read(proxy.url, VM_1) == expected
    with client_at() as admin:
        stored = admin.get(f"{stack.server.url}/device-metadata/{delta}", headers=stack.server.admin_headers).json()
        assert stored["host"] == "host-b"
        epsilon = "8a2f0c1e-1b1d-4d8e-9f00-0000000000e5"
        for body, field in (({"host": 7}, "host"), ({"host": "host a"}, "host"),
                            ({"metadata": {"id": epsilon, "host": ["host-a"]}}, "metadata.host")):
            write = {"id": epsilon, "ipAddresses": ["10.84.0.45"], "metadata": {"id": epsilon}, **body}
            answer = admin.post(f"{stack.server.url}/device-metadata", json=write, headers=stack.server.admin_headers)
            assert answer.status_code == 400, answer.text
            assert field in [problem["field"] for problem in answer.json()["errors"]]
        missing = admin.get(f"{stack.server.url}/device-metadata/{epsilon}", headers=stack.server.admin_headers)
        assert missing.status_code == 404


def test_a_host_key_cannot_be_passed_off_as_another_hosts(stack):
    """Host A's key with X-Instance-Host: host-b (sent straight from the trusted address): 403, BETA not served."""
    now = int(time.time())
    signature = SigningKey(host_key(FLEET, "host-a"), "host-a").sign(BETA, now, None)
    headers = {"X-Instance-ID": BETA, "X-Instance-ID-Timestamp": str(now), "X-Instance-ID-Signature": signature,
               "X-Instance-Host": "host-b"}
    with client_at("127.0.0.1") as client:
        answer = client.get(f"{stack.server.url}/latest/meta-data/instance-id", headers=headers)
    assert (answer.status_code, answer.text) == (403, "403 - Forbidden")
    refused = [json.loads(line) for line in stack.server.output().splitlines() if "proxy.bad_signature" in line]
    assert (refused[-1]["instance_id"], refused[-1]["host"]) == (BETA, "host-b")


def test_the_shared_secret_still_signs_and_serve_calls_it_weaker(stack):
    """A proxy on the old shared secret reads BETA (no host check: the migration path), and both sides warn."""
    mapping = _map(stack, "shared", {VM_1: BETA})
    args = ("--upstream", stack.server.url, "--shared-secret-file", str(stack.shared), "--map", str(mapping))
    with proxying(stack.base, *args) as proxy:
        assert _read(proxy.url, VM_1) == (200, BETA)
        assert "proxy.shared_secret" in proxy.output()
    assert "serve.proxy_shared_secret" in stack.server.output()


def test_the_record_host_is_never_served_to_the_instance(stack):
    """The JSON flavor leaves ``host`` out of the instance's document; the admin API shows it."""
    mapping = _map(stack, "json", {VM_1: ALPHA})
    args = ("--upstream", stack.server.url, "--host-key-file", str(stack.keys["host-a"]), "--host-name", "host-a",
            "--map", str(mapping))
    with proxying(stack.base, *args) as proxy:
        status, body = _read(proxy.url, VM_1, "/metadata")
    assert status == 200
    assert json.loads(body)["id"] == ALPHA
    assert "host" not in json.loads(body)
    with client_at() as admin:
        stored = admin.get(f"{stack.server.url}/device-metadata/{ALPHA}", headers=stack.server.admin_headers).json()
    assert stored["host"] == "host-a"


def test_a_fleet_secret_rotation_keeps_old_host_keys_until_the_previous_secret_goes(stack):
    """New fleet secret with the old as previous: a host still on its old key reads; without the previous: 403."""
    new = _write(stack.base / "fleet-new", b"this-years-fleet-secret")
    old = _write(stack.base / "fleet-old", OLD_FLEET)
    now = int(time.time())
    old_key = host_key(OLD_FLEET, "host-a")
    headers = {"X-Instance-ID": GAMMA, "X-Instance-ID-Timestamp": str(now), "X-Instance-Host": "host-a",
               "X-Instance-ID-Signature": sign_stamped(old_key, GAMMA, now, host="host-a")}
    record = {"id": GAMMA, "ipAddresses": ["10.84.0.9"], "metadata": {"id": GAMMA}}
    for extra, expected in ((("--proxy-previous-fleet-secret-file", str(old)), 200), ((), 403)):
        args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-fleet-secret-file", str(new), *extra)
        with serving(stack.base, *args) as server:
            server.post("/device-metadata", record)
            with client_at("127.0.0.1") as client:
                answer = client.get(f"{server.url}/latest/meta-data/instance-id", headers=headers)
            assert answer.status_code == expected, answer.text


def test_the_agents_haproxy_signs_with_its_host_key(stack):
    """The agent's haproxy on host-a: its VM reads ALPHA; a VM whose port names BETA is refused by serve (403)."""
    binary = shutil.which("haproxy", path="/usr/sbin:/usr/bin:/sbin")
    if binary is None:
        pytest.fail("haproxy is not installed: scripts/test installs it")
    state = stack.base / "haproxy"
    state.mkdir()
    port = free_port()
    key = SigningKey(stack.keys["host-a"].read_bytes().strip(), "host-a")
    haproxy = Haproxy(binary, state, key.secret)
    backends = [Backend("tap-1", (VM_1,), ALPHA), Backend("tap-2", (VM_2,), BETA)]
    haproxy.apply(render(Frontend(("127.0.0.1",), port=port, host="host-a"), backends,
                         Upstream.parse(stack.server.url)))
    try:
        url = f"http://127.0.0.1:{port}"
        assert _read(url, VM_1) == (200, ALPHA)
        assert _read(url, VM_2) == (403, "403 - Forbidden")
    finally:
        haproxy.stop()
    refusals = [json.loads(line) for line in stack.server.output().splitlines() if "proxy.foreign_host" in line]
    assert (refusals[-1]["instance_id"], refusals[-1]["host"]) == (BETA, "host-a")
