"""The read memo (``imds.web.memo``) never answers what the whole way would not, on every server.

A repeated fixed read is answered from what the handler answered before, kept with the
caller's catalog entry. These drive real ``imds serve`` processes (front, granian, uvicorn:
the memo is the front's ``serve``, so every server has it) and check that a read after a
change answers the change: a write, an address moving to another instance, a more specific
network taking the caller, a deletion; that a guarded route's refusal never turns into a
remembered 200 (nor a GCE read kept with its Metadata-Flavor header one without it); and that
what must be fresh each time (the IMDSv2 TTL, OpenStack's random seed) is, while the counters
and the read log count every read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from factories import metadata_body, new_id
from serve_process import Server, client_at, metric, serving

SERVERS = ["front", "granian", "uvicorn"]
READS = 3  # each check reads this many times: the first goes the whole way, the rest may be remembered


@pytest.fixture(scope="module", params=SERVERS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server of each kind, memory store, instance reads logged."""
    args = ("--server", request.param, "--db", "memory://", "--log-instance-reads")
    with serving(tmp_path_factory.mktemp(f"memo-{request.param}"), *args) as running:
        yield running


def _reads(server: Server, source: str, path: str, **headers: str) -> list[httpx.Response]:
    with client_at(source) as guest:
        return [guest.get(f"{server.url}{path}", headers=headers) for _ in range(READS)]


def _hostnames(server: Server, source: str) -> set[str]:
    return {answer.json()["hostname"] for answer in _reads(server, source, "/metadata")}


def test_a_write_is_read_at_once(server):
    """Read, write a new hostname, read: every read after the write answers it (JSON, EC2, OpenStack)."""
    instance_id, guest = new_id(), "127.0.1.11"
    server.post("/device-metadata", metadata_body(instance_id, ips=[guest], hostname="one"))
    assert _hostnames(server, guest) == {"one"}
    assert {a.text for a in _reads(server, guest, "/latest/meta-data/hostname")} == {"one"}
    server.post("/device-metadata", metadata_body(instance_id, ips=[guest], hostname="two"))
    assert _hostnames(server, guest) == {"two"}
    assert {a.text for a in _reads(server, guest, "/latest/meta-data/hostname")} == {"two"}
    assert {a.json()["hostname"] for a in _reads(server, guest, "/openstack/latest/meta_data.json")} == {"two"}


def test_an_address_moving_to_another_instance_moves_its_reads(server):
    """The caller's address moves from A to B: its reads answer B's document, never A's again."""
    guest = "127.0.1.12"
    a, b = new_id(), new_id()
    server.post("/device-metadata", metadata_body(a, ips=[guest], hostname="a"))
    assert _hostnames(server, guest) == {"a"}
    server.post("/device-metadata", metadata_body(b, ips=[guest], hostname="b"))  # last write wins: it moves
    assert _hostnames(server, guest) == {"b"}
    assert {r.text for r in _reads(server, guest, "/latest/meta-data/instance-id")} == {b}


def test_a_more_specific_network_takes_the_caller(server):
    """A holds 127.0.2.0/24; B then gets 127.0.2.7/32: the caller at .7 reads B, the one at .8 still A."""
    a, b = new_id(), new_id()
    server.post("/device-metadata", metadata_body(a, ips=["127.0.2.0/24"], hostname="wide"))
    assert _hostnames(server, "127.0.2.7") == {"wide"}
    assert _hostnames(server, "127.0.2.8") == {"wide"}
    server.post("/device-metadata", metadata_body(b, ips=["127.0.2.7"], hostname="narrow"))
    assert _hostnames(server, "127.0.2.7") == {"narrow"}
    assert _hostnames(server, "127.0.2.8") == {"wide"}


def test_a_deleted_instance_is_not_found(server):
    """After the record is deleted its caller's reads are 404, however often it read before."""
    instance_id, guest = new_id(), "127.0.1.13"
    server.post("/device-metadata", metadata_body(instance_id, ips=[guest], hostname="gone"))
    assert _hostnames(server, guest) == {"gone"}
    with httpx.Client(timeout=15) as admin:
        assert admin.delete(f"{server.url}/device-metadata/{instance_id}", headers=server.admin_headers).is_success
    assert {a.status_code for a in _reads(server, guest, "/metadata")} == {404}


def test_a_gce_read_is_remembered_with_its_flavor_header_only(server):
    """GCE reads (Metadata-Flavor: Google) answer a write at once; without the header they stay GCE's 403."""
    instance_id, guest = new_id(), "127.0.1.17"
    path = "/computeMetadata/v1/instance/hostname"
    server.post("/device-metadata", metadata_body(instance_id, ips=[guest], hostname="one"))
    assert {(a.status_code, a.text) for a in _reads(server, guest, path, **{"Metadata-Flavor": "Google"})} == {
        (200, "one")}
    assert {a.status_code for a in _reads(server, guest, path)} == {403}
    server.post("/device-metadata", metadata_body(instance_id, ips=[guest], hostname="two"))
    assert {a.text for a in _reads(server, guest, path, **{"Metadata-Flavor": "Google"})} == {"two"}


def test_fresh_values_stay_fresh(server):
    """OpenStack's random_seed differs on every read; an IMDSv2 read says the token's TTL each time."""
    instance_id, guest = new_id(), "127.0.1.14"
    server.post("/device-metadata", metadata_body(instance_id, ips=[guest]))
    seeds = {a.json()["random_seed"] for a in _reads(server, guest, "/openstack/latest/meta_data.json")}
    assert len(seeds) == READS
    with client_at(guest) as vm:
        token = vm.put(f"{server.url}/latest/api/token",
                       headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}).text
    answers = _reads(server, guest, "/latest/meta-data/instance-id", **{"X-aws-ec2-metadata-token": token})
    assert {a.text for a in answers} == {instance_id}
    assert all(0 < int(a.headers["x-aws-ec2-metadata-token-ttl-seconds"]) <= 300 for a in answers)
    bad = _reads(server, guest, "/latest/meta-data/instance-id", **{"X-aws-ec2-metadata-token": token + "x"})
    assert {a.status_code for a in bad} == {401}


def test_every_read_is_counted_and_logged(server):
    """The hollow hit counter and the read log see each read, remembered or not."""
    instance_id, guest = new_id(), "127.0.1.15"
    server.post("/device-metadata", metadata_body(instance_id, ips=[guest]))
    before = metric(server, "metadata_cache_hit_total")
    assert len(_reads(server, guest, "/metadata")) == READS
    assert metric(server, "metadata_cache_hit_total") - before == READS
    logged = [line for line in server.output().splitlines()
              if '"instance.read"' in line and f'"peer": "{guest}"' in line and '"path": "/metadata"' in line]
    assert len(logged) == READS


@pytest.mark.parametrize("server_kind", SERVERS)
def test_a_guarded_route_never_remembers_an_authorised_answer_for_others(tmp_path, server_kind):
    """--instance-auth json: an authorised read (Metadata: true) does not make a plain read a 200."""
    args = ("--server", server_kind, "--db", "memory://", "--instance-auth", "json")
    with serving(tmp_path, *args) as running:
        instance_id, guest = new_id(), "127.0.1.16"
        running.post("/device-metadata", metadata_body(instance_id, ips=[guest]))
        assert {a.status_code for a in _reads(running, guest, "/metadata")} == {401}
        allowed = _reads(running, guest, "/metadata", Metadata="true")
        assert {a.json()["id"] for a in allowed} == {instance_id}
        refused = _reads(running, guest, "/metadata")
        assert {a.status_code for a in refused} == {401}
        assert all(json.loads(a.content)["message"] for a in refused)
