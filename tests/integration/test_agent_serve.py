"""VMs behind ``imds agent`` read their own records from a real ``imds serve``: JSON, EC2, OpenStack.

The whole chain: VM namespace → br-int rewrite → br-meta → tap-meta → haproxy (signed
X-Instance-ID) → ``imds serve --trusted-proxy 127.0.0.1/32 --proxy-shared-secret-file``. The
records carry addresses no VM uses, so an answer can only come from the signed identity; two of
the VMs share one IP on different networks.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ec2_expected import seed
from helpers import wait_for
from ovs_harness import AgentProcess, Ovs, Vm, ovs_daemons, vms
from serve_process import Server, serving

SECRET = b"agent-serve-shared-secret"
SEED = seed()
UUID_A = "a1000000-0000-4000-8000-00000000000a"
UUID_B = "b1000000-0000-4000-8000-00000000000b"
UUID_C = "c1000000-0000-4000-8000-00000000000c"
BASE = "http://169.254.169.254"


def _record(uuid: str, hostname: str, project: str | None) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc.update(id=uuid, hostname=hostname)
    if project:
        doc["project_id"] = project
    return doc


@dataclass
class Stack:
    ovs: Ovs
    server: Server
    agent: AgentProcess
    a: Vm
    b: Vm
    c: Vm


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("ovs")
    secret = root / "secret"
    secret.write_bytes(SECRET)
    serve_args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file", str(secret))
    with serving(root, *serve_args) as server, ovs_daemons(root) as ovs:
        records = ((UUID_A, "vm-a", "tenant-a"), (UUID_B, "vm-b", None), (UUID_C, "vm-c", "tenant-c"))
        for n, (uuid, host, project) in enumerate(records):
            server.post("/device-metadata", {"id": uuid, "ipAddresses": [f"192.0.2.{n + 10}"],
                                             "metadata": _record(uuid, host, project)})
            server.post("/device-userdata", {"id": uuid, "ipAddresses": [f"192.0.2.{n + 10}"],
                                             "userdata": f"#cloud-config\nhostname: {host}\n"})
        t = ovs.tag
        bridge, meta_bridge, tap, netns = f"bi{t}", f"bm{t}", f"tm{t}", f"imdsmeta{t}"
        ovs.add_bridge(bridge)
        a = Vm(ovs, bridge, f"sa{t}", UUID_A, "02:00:00:00:1a:01", "10.0.0.5/24", tag=1, tenant="tenant-a")
        b = Vm(ovs, bridge, f"sb{t}", UUID_B, "02:00:00:00:1b:01", "10.0.0.5/24", tag=2)
        # Plugged with a tenant its record does not have: serve must refuse it.
        c = Vm(ovs, bridge, f"sc{t}", UUID_C, "02:00:00:00:1c:01", "10.0.0.7/24", tag=1, tenant="tenant-x")
        agent = AgentProcess(ovs, [
            "--ovsdb", f"unix:{ovs.db_sock}", "--integration-bridge", bridge, "--metadata-bridge", meta_bridge,
            "--meta-port", tap, "--meta-netns", netns, "--upstream", server.url, "--shared-secret-file", str(secret),
            "--state-dir", str(root / "state"),
        ], root / "agent.log")
        try:
            with vms(a, b, c):
                agent.start()
                for vm in (a, b):
                    wait_for(lambda vm=vm: vm.get(f"{BASE}/metadata", timeout=3.0)[0] == 200, what=f"{vm.name} served",
                             timeout=40)
                yield Stack(ovs, server, agent, a, b, c)
        finally:
            agent.stop()
            ovs.remove(meta_bridge, bridge, netns=netns)


def test_json_flavor_each_vm_its_own_record(stack):
    """Two VMs with the same IP on different networks read their own /metadata document."""
    for vm, host in ((stack.a, "vm-a"), (stack.b, "vm-b")):
        status, body = vm.get(f"{BASE}/metadata")
        assert status == 200, body
        doc = json.loads(body)
        assert (doc["id"], doc["hostname"]) == (vm.uuid, host)
        status, body = vm.get(f"{BASE}/userdata")
        assert (status, body) == (200, f"#cloud-config\nhostname: {host}\n")


def test_ec2_flavor_with_imdsv2_token(stack):
    """EC2: a token PUT, then reads with it, each VM seeing its own instance-id (IPv6 too)."""
    for vm in (stack.a, stack.b):
        status, token = vm.get(f"{BASE}/latest/api/token", "-X", "PUT",
                               "-H", "X-aws-ec2-metadata-token-ttl-seconds: 60")
        assert status == 200, token
        status, body = vm.get(f"{BASE}/latest/meta-data/instance-id", "-H", f"X-aws-ec2-metadata-token: {token}")
        assert (status, body) == (200, vm.uuid)
        status, body = vm.get("http://[fe80::a9fe:a9fe%eth0]/latest/meta-data/instance-id")
        assert (status, body) == (200, vm.uuid)


def test_openstack_flavor(stack):
    """OpenStack: meta_data.json names the VM's own uuid and hostname."""
    for vm, host in ((stack.a, "vm-a"), (stack.b, "vm-b")):
        status, body = vm.get(f"{BASE}/openstack/latest/meta_data.json")
        assert status == 200, body
        doc = json.loads(body)
        assert doc["uuid"] == vm.uuid
        assert host in doc["hostname"]


def test_tenant_mismatch_gets_nothing(stack):
    """A port whose tenant differs from its record's project_id is answered 404, not with the record."""
    status, body = stack.c.get(f"{BASE}/metadata")
    assert status == 404
    assert "vm-c" not in body  # the 404 may name the id; never the record


def test_forwarding_headers_from_a_vm_are_refused_on_token_puts_and_dropped_otherwise(stack):
    """Through the whole chain: haproxy answers a token PUT carrying a forwarding header with serve's 403.

    A read with another VM's address in X-Forwarded-For still gets the VM its own record.
    """
    cases = (("/latest/api/token", "X-Forwarded-For: 10.0.0.9"), ("/latest/api/token/", "X-Real-IP: 1.2.3.4"))
    for path, header in cases:
        status, body = stack.a.get(f"{BASE}{path}", "-X", "PUT", "-H", "X-aws-ec2-metadata-token-ttl-seconds: 60",
                                   "-H", header)
        assert (status, body) == (403, "403 - Forbidden"), path
    status, body = stack.a.get(f"{BASE}/latest/meta-data/instance-id", "-H", "X-Forwarded-For: 10.0.0.5")
    assert (status, body) == (200, stack.a.uuid)
