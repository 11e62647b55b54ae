"""The instance route table: declared once, dispatch, the guard and the metric groups derived from it."""

from __future__ import annotations

import pytest

from imds.config import INSTANCE_AUTH_FLAVORS
from imds.services.render.ec2 import VERSIONS
from imds.web.routes import API_V1, OPS_PATHS, ROUTES, Groups, Route, aliased, dispatch, first_segment
from imds.web.routing import Handler, InstanceCall, Reply


class Flavor:
    """A stand-in flavor whose every handler answers its own name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, handler: str) -> Handler:
        async def answer(_call: InstanceCall) -> Reply:
            return Reply(200, f"{self.name}.{handler}".encode())

        return answer


def _flavors() -> dict[str, Flavor]:
    return {route.flavor: Flavor(route.flavor) for route in ROUTES}


def _unguarded(_flavor: str, handler: Handler) -> Handler:
    return handler


async def _body(handler: Handler) -> bytes:
    return (await handler(InstanceCall({"method": "GET", "path": "/", "headers": []}))).body


@pytest.mark.anyio
async def test_dispatch_maps_every_row_to_its_flavors_handler():
    """Exact paths (with /api/v1 aliases for the JSON reads) and first segments come from the rows."""
    exact, prefixes = dispatch(_flavors(), _unguarded)
    assert await _body(exact["/metadata/"]) == b"json.metadata"
    assert await _body(exact[f"{API_V1}/userdata"]) == b"json.userdata"
    assert await _body(exact["/"]) == b"ec2.versions"
    assert await _body(exact["/phone-home"]) == b"channel.phone_home"
    assert await _body(prefixes["nocloud"]) == b"nocloud.handle"
    assert set(prefixes) == {*VERSIONS, "openstack", "nocloud", "ganeti", "computeMetadata"}
    assert f"{API_V1}/events" not in exact  # only rows marked aliased are answered under /api/v1


@pytest.mark.anyio
async def test_the_guard_wraps_exactly_the_guarded_rows():
    """The anti-SSRF guard is a property of the row: dispatch asks for it on those rows only."""
    asked: list[str] = []

    def guard(flavor: str, handler: Handler) -> Handler:
        asked.append(flavor)

        async def refused(_call: InstanceCall) -> Reply:
            return Reply(401, b"guarded")

        return refused

    exact, prefixes = dispatch(_flavors(), guard)
    assert sorted(set(asked)) == sorted(INSTANCE_AUTH_FLAVORS)  # --instance-auth names exactly these
    assert await _body(exact["/api/v1/metadata"]) == b"guarded"
    assert await _body(prefixes["ganeti"]) == b"guarded"
    assert await _body(exact["/events"]) == b"channel.events"
    assert await _body(prefixes["latest"]) == b"ec2.handle"


def test_a_path_declared_twice_is_refused():
    """Each path is answered by one row: a second row for it fails at start, not at the first request."""
    rows = (Route("json", "metadata", exact=("/metadata",)), Route("ec2", "versions", exact=("/metadata",)))
    with pytest.raises(ValueError, match="'/metadata' is declared twice"):
        dispatch(_flavors(), _unguarded, rows)


def test_aliases_and_first_segments():
    """``aliased`` adds the /api/v1 form; ``first_segment`` is what the prefix dict is keyed by."""
    assert aliased("/device-metadata") == ("/device-metadata", "/api/v1/device-metadata")
    assert first_segment("/openstack/latest/meta_data.json") == "openstack"
    assert first_segment("/metadata") == "metadata"
    assert first_segment("/") == ""


def test_metric_groups_come_from_the_admin_routes():
    """The ops group for the operational paths, admin for any path under an admin route's first segment, else other."""
    groups = Groups(["/device-metadata", "/api/v1/device-metadata", "/device-os/{instance_id}", "/metrics",
                     "/openapi.json"])
    assert {path: groups.of(path) for path in OPS_PATHS} == dict.fromkeys(OPS_PATHS, "ops")
    assert groups.of("/device-os/abc") == "admin"
    assert groups.of("/api/v1/device-userdata") == "admin"
    assert groups.of("/openapi.json") == "admin"
    assert groups.of("/metrics/extra") == "other"  # an ops path lends its segment to nobody
    assert groups.of("/nope") == "other"
    assert groups.of("/x/device-metadata") == "other"
