"""A big write must not stall instance reads: its parse and checks run off the event loop.

A 60,000-address write used to hold the event loop for the whole parse (0.6 s), so every
instance read on the replica waited. The test counts, without timing anything, how many
instance reads complete between the moment the write is sent and the moment it is
answered: with the parse on the loop that count is zero (nothing else runs in between on
the memory store); off the loop, reads keep being answered throughout.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from factories import metadata_body, new_id, next_ipv4
from helpers import admin_client, client_from, make_settings, running_app

pytestmark = [pytest.mark.anyio, pytest.mark.stores("memory", "sqlite")]

ADDRESSES = 60_000

GIL_BREATH = 1e-3  # seconds: the smallest real sleep, so the loop blocks in select (see the loop below)


def big_body() -> bytes:
    ips = [f"10.{200 + (n >> 16)}.{(n >> 8) & 255}.{n & 255}" for n in range(ADDRESSES)]
    return json.dumps({"id": new_id(), "ipAddresses": ips, "metadata": {"hostname": "big"}}).encode()


async def test_instance_reads_are_answered_while_a_big_write_is_processed(db_url):
    """At least 10 correct instance reads complete while a 60,000-address write is in flight, and the write lands."""
    settings = make_settings(db=db_url, max_addresses=ADDRESSES, max_body_bytes=4 << 20)
    async with running_app(settings) as app, admin_client(app) as admin, \
            client_from(app, reader_ip := next_ipv4()) as reader:
        neighbour = metadata_body(ips=[reader_ip], plan="small")
        assert (await admin.post("/device-metadata", json=neighbour)).status_code == 200
        body = big_body()
        write = asyncio.create_task(admin.post("/device-metadata", content=body))
        during = 0
        while not write.done():
            # An in-process read never suspends by itself. A real (if tiny) sleep lets the loop block
            # in select, releasing the GIL: spinning on sleep(0) starved the parse thread on a quiet
            # machine and the test hung. With the parse on the loop, no read runs in between anyway.
            await asyncio.sleep(GIL_BREATH)
            answer = await reader.get("/metadata")
            assert (answer.status_code, answer.json()) == (200, neighbour["metadata"])
            if not write.done():
                during += 1
        written = await write
        assert written.status_code == 200, written.text[:300]
        assert len(written.json()["ipAddresses"]) == ADDRESSES
        assert during >= 10, f"only {during} instance reads were answered while the write was processed"
        async with client_from(app, "10.200.1.2") as big:
            assert (await big.get("/metadata")).json() == {"hostname": "big"}
