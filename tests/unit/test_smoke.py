import pytest

from factories import metadata_body
from helpers import admin_client, client_from, running_app


@pytest.mark.anyio
async def test_pushed_metadata_is_served_to_its_address():
    """An instance reads back the document pushed for its address."""
    async with running_app() as app:
        body = metadata_body(ips=["10.200.0.1"], plan="c3.small")
        async with admin_client(app) as admin:
            assert (await admin.post("/device-metadata", json=body)).status_code == 200
        async with client_from(app, "10.200.0.1") as guest:
            got = await guest.get("/metadata")
        assert got.json() == body["metadata"]
