"""Pull mode in a real ``imds serve`` process: an unknown caller's data fetched from the fake upstream, real sockets."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from factories import new_id
from fake_upstream import running_upstream
from imds import __version__
from serve_process import serving

CALLER = "127.0.0.9"
STRANGER = "127.0.0.10"


def client_at(local_address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=local_address), timeout=5.0, trust_env=False)


def test_an_unknown_caller_is_served_from_the_upstream_by_a_real_server(tmp_path: Path):
    """A caller imds never heard of reads its metadata, userdata and EC2 id; repeats make no upstream call.

    ``--lookup-url`` points at the fake upstream; an address the upstream does not know is a 404.
    """
    instance_id = new_id()
    document = {"id": instance_id, "hostname": "pulled-1", "plan": "c3.small"}
    with running_upstream() as upstream:
        upstream.put_metadata(instance_id, [CALLER], document, as_string=True)
        upstream.put_userdata(instance_id, [CALLER], b"#cloud-config\nhostname: pulled-1\n")
        with serving(tmp_path, "--data-dir", str(tmp_path / "data"), "--lookup-url", upstream.base + "/",
                     "--lookup-timeout", "5", "--lookup-token", "serve-pull-token") as server:
            with client_at(CALLER) as caller:
                for _ in range(2):
                    metadata = caller.get(f"{server.url}/metadata")
                    assert (metadata.status_code, metadata.json()) == (200, document)
                    userdata = caller.get(f"{server.url}/userdata")
                    assert (userdata.status_code, userdata.content) == (200, b"#cloud-config\nhostname: pulled-1\n")
                    ec2 = caller.get(f"{server.url}/latest/meta-data/instance-id")
                    assert (ec2.status_code, ec2.text) == (200, instance_id)
            with client_at(STRANGER) as stranger:
                unknown = stranger.get(f"{server.url}/metadata")
                assert unknown.status_code == 404
                assert unknown.json() == {"message": f"no instance is associated with {STRANGER}"}
                text = stranger.get(f"{server.url}/metrics", headers=server.admin_headers).text
            with client_at("127.0.0.1") as admin:
                stored = admin.get(f"{server.url}/device-metadata/{instance_id}", headers=server.admin_headers)
                assert stored.json() == document
    assert [c.target for c in upstream.log()] == [
        f"/device-metadata?ip_address={CALLER}",
        f"/device-userdata/{instance_id}",  # known by then: the missing record type is fetched by id
        f"/device-metadata?ip_address={STRANGER}",
    ]
    assert {(c.headers["user-agent"], c.headers["authorization"]) for c in upstream.log()} == {
        (f"imds/{__version__}", "Bearer serve-pull-token")
    }
    metrics = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    assert (metrics["metadata_lookup_request_total"], metrics["metadata_userdata_lookup_request_total"]) == (2, 1)
    assert "serve-pull-token" not in server.output()
