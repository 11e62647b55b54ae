"""aws-node-termination-handler's polling contract against imds, over real sockets, with ``--imdsv2 required``.

The four IMDS monitors run once per tick (NTH's 2 s period; the test moves an injected clock
2 s per tick instead of sleeping) through a schedule → cancel → spot stop sequence, a proactive
token refresh (15 s before expiry) and a token that expired under it (the 401 retry, which
carries the stale token and the new one). NTH never sees a non-2xx where it would count an
error, so it never stops. A second run drives a real ``imds serve`` process (granian) the
same way on the wall clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import ADMIN_TOKEN, FakeClock, admin_client, make_settings, push_record
from imds.app import build_app
from notice_clients import ASG, REBALANCE, SCHEDULED, SPOT, TOKEN_PATH, AppOnSocket, Nth
from serve_process import ADMIN_TOKEN as SERVE_TOKEN
from serve_process import serving

pytestmark = pytest.mark.anyio

NODE = "127.0.86.7"
T0 = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
NORMAL_404 = {SPOT, REBALANCE, ASG}


def at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_client() -> httpx.AsyncClient:
    """NTH's client: 2 s timeout, connections from the node's own address."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=NODE), timeout=2.0, trust_env=False)


def assert_never_an_error(nth: Nth) -> None:
    """No monitor error, and no status but 2xx, 404 where NTH expects one, and 401 then a retry that worked."""
    assert nth.errors == []
    unexpected = [(p, s) for p, s in nth.answers if not (200 <= s < 300 or (s == 404 and p in NORMAL_404)
                                                         or s == 401)]
    assert unexpected == []


@pytest.fixture
async def on_socket() -> AsyncIterator[tuple[AppOnSocket, FakeClock, str]]:
    clock = FakeClock(T0.timestamp())
    app = build_app(make_settings(imdsv2="required"), clock=clock)
    async with app.services.running():
        instance_id = new_id()
        await push_record(app, [NODE], {"id": instance_id, "hostname": "node-1", "project_id": "acme",
                                        "facility": "da11", "spot": {}})
        async with AppOnSocket(app).running() as served:
            yield served, clock, instance_id


async def admin_in(app: Any, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    async with admin_client(app, ADMIN_TOKEN) as admin:
        answer = await admin.request(method, path, **kwargs)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_schedule_cancel_spot_stop_and_token_refreshes(on_socket):
    """Drains on the active event, uncordons on its cancel, drains on the spot stop; tokens renew without errors."""
    served, clock, instance_id = on_socket
    app = served._server.config.app
    async with node_client() as client:
        nth = Nth(client, served.url)

        async def ticks(count: int) -> None:
            for _ in range(count):
                await nth.tick()
                clock.advance(2)

        await ticks(3)
        assert (nth.token_puts, nth.drains, nth.cancels) == (1, [], [])
        event = await admin_in(app, "POST", "/device-notices", json={
            "project_id": "acme", "kind": "reboot", "time": at(T0 + timedelta(hours=1)),
            "window_end": at(T0 + timedelta(hours=1, minutes=15))})
        await ticks(2)
        assert nth.drains == [("scheduled", f"instance-event-{event['id']}")] * 2
        await admin_in(app, "PATCH", f"/device-notices/{event['id']}", json={"state": "canceled"})
        await ticks(2)
        assert nth.cancels == [("scheduled", f"instance-event-{event['id']}")] * 2
        clock.advance(3600 - 2 * 7 - 10)  # the next answer says 10 s are left: NTH renews before its next request
        await ticks(2)
        assert nth.token_puts == 2
        clock.advance(4000)  # the token expires under NTH (it last heard of 3,598 s left): a 401, then the retry
        await ticks(1)
        assert nth.token_puts == 3
        assert (TOKEN_PATH, 200) in nth.answers
        assert [s for p, s in nth.answers if p == SCHEDULED][-2:] == [401, 200]
        stop = await admin_in(app, "POST", "/device-notices", json={
            "instance_id": instance_id, "kind": "stop", "time": at(datetime.fromtimestamp(clock.now + 120, UTC))})
        await ticks(1)
        assert nth.drains[-1] == ("spot", f"stop@{stop['time']}")
        await admin_in(app, "POST", "/device-notices", json={
            "instance_id": instance_id, "kind": "lifecycle", "state": "active", "time": stop["time"],
            "target_state": "Terminated"})
        await admin_in(app, "POST", "/device-notices", json={
            "facility": "da11", "kind": "rebalance", "state": "active", "time": stop["time"]})
        await ticks(1)
        assert {monitor for monitor, _ in nth.drains[-3:]} == {"spot", "rebalance", "asg"}
    assert_never_an_error(nth)


async def test_the_same_contract_against_imds_serve(tmp_path: Path):
    """A real imds serve (granian, --imdsv2 required): the sequence on the wall clock, no error."""
    with serving(tmp_path, "--imdsv2", "required", "--db", f"sqlite:///{tmp_path / 'imds.db'}") as server:
        instance_id = new_id()
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [NODE],
                                         "metadata": {"id": instance_id, "hostname": "node-1", "project_id": "acme"}})

        async def admin(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {SERVE_TOKEN}"}, trust_env=False) as c:
                answer = await c.request(method, server.url + path, **kwargs)
            assert answer.status_code == 200, answer.text
            body: dict[str, Any] = answer.json()
            return body

        later = datetime.now(UTC) + timedelta(hours=1)
        async with node_client() as client:
            nth = Nth(client, server.url)
            await nth.tick()
            event = await admin("POST", "/device-notices", json={"project_id": "acme", "kind": "maintenance",
                                                                 "time": at(later),
                                                                 "window_end": at(later + timedelta(hours=1))})
            await nth.tick()
            await admin("PATCH", f"/device-notices/{event['id']}", json={"state": "canceled"})
            await nth.tick()
            await admin("POST", "/device-notices", json={"instance_id": instance_id, "kind": "stop",
                                                         "time": at(later)})
            await nth.tick()
        assert nth.drains == [("scheduled", f"instance-event-{event['id']}"), ("spot", f"stop@{at(later)}")]
        assert nth.cancels == [("scheduled", f"instance-event-{event['id']}")] * 2  # until its window would end
        assert nth.token_puts == 1
        assert_never_an_error(nth)
