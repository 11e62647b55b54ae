r"""Names end where they end, and text is text: trailing newlines, control characters and lone surrogates.

``re.match`` with ``^…$`` lets ``"name\n"`` through (``$`` matches before a final newline), and
JSON's ``"\udc80"`` decodes to a string UTF-8 cannot encode. Each case here was accepted (or
answered 500 / "internal error") before; now it is a 4xx, or a Luxi refusal, naming the field.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from factories import new_id, next_ipv4
from helpers import admin_client, client_from, make_settings, push_record, running_app
from imds.agent.haproxy import safe_token
from imds.guest.errors import ServiceError
from imds.guest.ganeti_files import parse_environment
from imds.metad.luxi import serving
from imds.services.ganeti.environment import environment, render
from imds.services.records.devices import check_devices
from imds.web.instance import InstanceFront
from luxi_client import call, instance, update

pytestmark = pytest.mark.anyio
# A trailing newline, and the other control characters a name could end (or hide) with.
ENDINGS = ("\n", "\r", "\r\n", "\t", "\x00", "\x0b", "\x85")
SURROGATE = b'"\\udc80"'  # JSON text for a lone surrogate


@pytest.fixture
async def app(sqlite_url: str) -> AsyncIterator[InstanceFront]:
    """The app on SQLite (which cannot store a lone surrogate: the memory store would hide a 500)."""
    async with running_app(make_settings(db=sqlite_url)) as running:
        yield running


async def _installing(app: InstanceFront) -> tuple[str, str]:
    """An instance with an OS record under way (the Ganeti channel is open); its (id, address)."""
    ip = next_ipv4()
    instance_id = await push_record(app, [ip])
    async with admin_client(app) as admin:
        body = {"id": instance_id, "os_type": "debootstrap", "mode": "run", "communication": True}
        assert (await admin.post("/device-os", json=body)).status_code == 200
    return instance_id, ip


def _fields(answer: Any) -> list[str]:
    return [problem["field"] for problem in answer.json()["errors"]]


@pytest.mark.parametrize("ending", ENDINGS)
async def test_event_state_with_a_control_character_is_refused(app, ending):
    r"""``state: "mode\n"`` would spoof the host-only ``mode`` state; any control character is refused."""
    instance_id, ip = await _installing(app)
    async with client_from(app, ip) as guest:
        answer = await guest.post("/events", json={"state": f"mode{ending}"})
        also = await guest.post("/events", json={"state": f"booting{ending}"})
    assert (answer.status_code, _fields(answer)) == (400, ["state"])
    assert (also.status_code, _fields(also)) == (400, ["state"])
    async with admin_client(app) as admin:
        assert (await admin.get(f"/device-events/{instance_id}")).json()["events"] == []


@pytest.mark.parametrize("path", ["/events", "/ganeti/latest/write"])
async def test_event_message_with_a_lone_surrogate_is_a_400(app, path):
    """A lone surrogate in an event's message is a 400 naming ``message`` (it was a 500 on SQLite)."""
    instance_id, ip = await _installing(app)
    async with client_from(app, ip) as guest:
        answer = await guest.post(path, content=b'{"state": "x", "message": ' + SURROGATE + b"}")
        fine = await guest.post(path, json={"state": "x", "message": "caf\u00e9"})
    assert answer.status_code == 400, answer.text
    assert _fields(answer) == ["message"]
    assert "lone surrogate" in answer.json()["errors"][0]["message"]
    assert fine.status_code == 200
    async with admin_client(app) as admin:
        events = (await admin.get(f"/device-events/{instance_id}")).json()["events"]
    assert [event["message"] for event in events] == ["caf\u00e9"]


@pytest.mark.parametrize("ending", ENDINGS)
async def test_os_names_with_a_control_character_are_refused(app, ending):
    """An OS parameter name or ``os_type`` ending in a control character is a 400 naming it; nothing stored."""
    instance_id, _ = await _installing(app)
    async with admin_client(app) as admin:
        bad_name = await admin.post("/device-os", json={
            "id": instance_id, "os_type": "debootstrap", "mode": "install",
            "parameters": {f"dhcp{ending}": {"value": "yes"}}})
        bad_type = await admin.post("/device-os", json={
            "id": instance_id, "os_type": f"debootstrap{ending}", "mode": "install"})
        stored = (await admin.get(f"/device-os/{instance_id}")).json()
    assert bad_name.status_code == 400
    assert _fields(bad_name) == [f"parameters.dhcp{ending}"]
    assert (bad_type.status_code, _fields(bad_type)) == (400, ["os_type"])
    assert stored["mode"] == "run"  # the earlier record, untouched


@pytest.mark.parametrize("field", ["value", "package"])
async def test_os_values_with_a_lone_surrogate_are_a_400(app, field):
    """A lone surrogate in a parameter value or the package URL is a 400 naming the field (it was a 500)."""
    instance_id, _ = await _installing(app)
    body = b'{"id": "%s", "os_type": "debootstrap", "mode": "install", ' % instance_id.encode()
    if field == "value":
        body += b'"parameters": {"dhcp": {"value": ' + SURROGATE + b"}}}"
        expected = "parameters.dhcp.value"
    else:
        body += b'"package": {"url": "http://192.0.2.9/' + SURROGATE[1:-1] + b'.tgz"}}'
        expected = "package.url"
    async with admin_client(app) as admin:
        answer = await admin.post("/device-os", content=body)
    assert answer.status_code == 400, answer.text
    assert _fields(answer) == [expected]


@pytest.mark.parametrize("ending", ["\n", "\r", "\x00"])
def test_environment_never_carries_a_name_with_a_control_character(ending):
    """hv/be parameter keys and OS parameter names that are not shell names never reach os/environment."""
    document = {"ganeti": {"hvparams": {f"kernel{ending}": "x", "boot_order": "disk"},
                           "beparams": {f"memory{ending}reboot": 1}}}
    env = environment(instance_id=new_id(), os_type="debootstrap", document=document, definition=None,
                      parameters={f"dhcp{ending}": "yes", "dns": "192.0.2.53"})
    lines = render(env).decode().removesuffix("\n").split("\n")
    assert "INSTANCE_HV_boot_order=disk" in lines
    assert "OSP_DNS=192.0.2.53" in lines
    for line in lines:  # each line is one KEY=value assignment, nothing sh would run
        name, equals, _ = line.partition("=")
        assert equals
        assert name.isidentifier(), line


@pytest.mark.parametrize("ending", ENDINGS)
def test_device_strings_with_a_control_character_are_refused(ending):
    r"""``"mac": "…\n"`` passes the schema's ``^…$`` under Python's re; the devices check refuses it."""
    devices = [{"type": "nic", "bus": "pci", "address": "0000:00:02.0", "mac": f"fa:16:3e:00:00:01{ending}",
                "tags": ["uplink"]},
               {"type": "disk", "bus": "scsi", "address": "0:0:2:0", "serial": "s1", "tags": [f"data{ending}"]}]
    fields = [problem.field for problem in check_devices(devices)]
    assert "metadata.devices[0].mac" in fields
    assert "metadata.devices[1].tags[0]" in fields
    assert check_devices([{**devices[0], "mac": "fa:16:3e:00:00:01"}]) == []


@pytest.mark.parametrize("ending", ENDINGS)
def test_haproxy_tokens_end_where_they_end(ending):
    """An id or tenant from OVSDB with a control character never goes into haproxy's config unquoted."""
    assert safe_token("7d0ab2bc-3a53-4d5e-8f44-2b2b9c1f6a10")
    assert not safe_token(f"7d0ab2bc-3a53-4d5e-8f44-2b2b9c1f6a10{ending}")


@pytest.fixture
async def metad(tmp_path: Path, sqlite_url: str) -> AsyncIterator[tuple[InstanceFront, Path]]:
    """The app (SQLite) serving the Luxi socket."""
    path = tmp_path / "metad.sock"
    async with running_app(make_settings(db=sqlite_url, ganeti_metad_socket=path)) as running, serving(
            running.services):
        yield running, path


async def test_luxi_lone_surrogate_is_a_clean_refusal(metad):
    """A lone surrogate in a pushed parameter is a refusal naming the field, not "internal error"; echo echoes."""
    app, path = metad
    pushed = json.dumps({"method": "updateConfig", "args": [instance(osparams={"dhcp": "\udc80"})]})
    answer = await call(path, pushed.encode())
    assert answer["success"] is False
    assert answer["result"][0] == "GenericError"
    assert "parameters.dhcp.value" in answer["result"][1][0]
    assert "internal error" not in answer["result"][1][0]
    assert len(app.services.catalog) == 0
    echoed = await call(path, b'{"method": "echo", "args": [' + SURROGATE + b"]}")
    assert echoed == {"success": True, "result": "\udc80"}
    assert await update(path, instance()) == {"success": True, "result": []}


@pytest.mark.parametrize("ending", ["\n", "\x00"])
async def test_luxi_names_with_a_control_character_are_refused(metad, ending):
    """Through Luxi too: an OS parameter name or an os name with a control character refuses the push."""
    app, path = metad
    for pushed in (instance(osparams={f"dhcp{ending}": "yes"}), instance(os=f"debootstrap{ending}")):
        answer = await update(path, pushed)
        assert answer["success"] is False, pushed
    assert len(app.services.catalog) == 0


@pytest.mark.parametrize("ending", ["\n", "\r"])
def test_guest_environment_names_end_where_they_end(ending):
    """The guest tool reads os/environment with shlex: a quoted name with a control character is refused."""
    text = f"OSP_DNS=192.0.2.53\n'OSP_X{ending}'=yes\n"
    with pytest.raises(ServiceError, match="is not KEY=value"):
        parse_environment(text, "os/environment")
    assert parse_environment("OSP_DNS=192.0.2.53\n", "os/environment") == {"OSP_DNS": "192.0.2.53"}
