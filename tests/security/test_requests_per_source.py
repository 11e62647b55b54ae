"""``--max-requests-per-source``: one address cannot hold more than N instance requests open.

Against a real ``imds serve`` (granian): a guest holds two change-watch reads open; its
third request is answered 429 with ``Retry-After`` and a JSON body naming the flag, while
another guest is served; once the held reads end, the first guest is served again.
"""

from __future__ import annotations

import httpx

from factories import new_id
from helpers import wait_for
from integration.test_channel_serve import BOUND, result
from serve_process import Server, client_at, in_background, metric, serving

GUESTS = ("127.0.0.2", "127.0.0.3")


def _add(server: Server, address: str) -> str:
    instance_id = new_id()
    server.post("/device-metadata", {"id": instance_id, "ipAddresses": [address], "metadata": {"hostname": address}})
    return instance_id


def _held_read(server: Server, etag: str) -> httpx.Response:
    with client_at(GUESTS[0]) as guest:
        return guest.get(f"{server.url}/metadata", params={"wait_for_change": "true", "last_etag": etag,
                                                            "timeout_sec": "60"}, timeout=BOUND * 4)


def test_one_address_cannot_hold_more_than_its_share(tmp_path):
    """Two held reads fill guest A's share: its third gets 429 naming the flag; guest B is served meanwhile."""
    with serving(tmp_path, "--max-requests-per-source", "2") as server:
        first, _ = (_add(server, address) for address in GUESTS)
        with client_at(GUESTS[0]) as guest:
            etag = guest.get(f"{server.url}/metadata").headers["etag"]
        held = [in_background(lambda: _held_read(server, etag)) for _ in range(2)]
        wait_for(lambda: metric(server, "imds_watch_waiting") == 2.0, what="two reads held", timeout=BOUND)

        with client_at(GUESTS[0]) as guest:
            refused = guest.get(f"{server.url}/metadata")
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "--max-requests-per-source 2" in refused.json()["message"]
        with client_at(GUESTS[1]) as other:
            assert other.get(f"{server.url}/metadata").json()["hostname"] == GUESTS[1]

        server.post("/device-metadata", {"id": first, "ipAddresses": [GUESTS[0]], "metadata": {"hostname": "moved"}})
        for answer in map(result, held):
            assert answer.json()["hostname"] == "moved"
        with client_at(GUESTS[0]) as guest:
            assert guest.get(f"{server.url}/metadata").json()["hostname"] == "moved"


def test_zero_turns_the_cap_off(tmp_path):
    """With ``--max-requests-per-source 0`` a third held read from one address is held like the others."""
    with serving(tmp_path, "--max-requests-per-source", "0") as server:
        instance_id = _add(server, GUESTS[0])
        with client_at(GUESTS[0]) as guest:
            etag = guest.get(f"{server.url}/metadata").headers["etag"]
        held = [in_background(lambda: _held_read(server, etag)) for _ in range(3)]
        wait_for(lambda: metric(server, "imds_watch_waiting") == 3.0, what="three reads held", timeout=BOUND)
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUESTS[0]], "metadata": {"hostname": "x"}})
        assert [answer.json()["hostname"] for answer in map(result, held)] == ["x"] * 3
