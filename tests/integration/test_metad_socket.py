"""--ganeti-metad-socket in process: Luxi framing, refusals that store nothing, the socket file, replicas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from helpers import client_from, make_settings, running_app, wait_for_async
from imds.errors import ConfigError
from imds.metad import luxi
from imds.metad.luxi import EOM, bind, serving
from luxi_client import IP, call, instance, update

pytestmark = pytest.mark.anyio


@pytest.fixture
async def metad(tmp_path: Path) -> AsyncIterator[tuple[Any, Path]]:
    """The app's services with the socket served, and the socket's path."""
    path = tmp_path / "metad.sock"
    async with running_app(make_settings(ganeti_metad_socket=path)) as app, serving(app.services):
        yield app, path


async def parameters(app: Any, ip: str = IP) -> tuple[int, Any]:
    async with client_from(app, ip) as guest:
        answer = await guest.get("/ganeti/latest/os/parameters.json")
    return answer.status_code, answer.json() if answer.status_code == 200 else answer.text


async def test_update_config_is_served_at_once(metad):
    """The communication NIC's address reads metad's parameters.json; the metadata document names the host."""
    app, path = metad
    pushed = instance()
    assert await update(path, pushed) == {"success": True, "result": []}
    assert await parameters(app) == (200, {"dhcp": ["yes", "public"], "root-hash": ["private-value", "private"],
                                           "root-password": ["secret-value", "secret"]})
    async with client_from(app, IP) as guest:
        document = (await guest.get("/metadata")).json()
    assert (document["id"], document["hostname"]) == (pushed["uuid"], "vm1.example.com")
    assert (await parameters(app, "198.51.100.7"))[0] == 404  # the other NIC is not the instance's address


@pytest.mark.parametrize(("message", "expected"), [
    (b"not json", "Failed to parse request: request: not valid JSON"),
    (b"[1, 2]", "Failed to parse request: request: must be a JSON object"),
    (b'{"method": "echo"}', "Failed to parse request: request: key 'args' not found"),
    (b'{"method": "reboot", "args": []}', ["GenericError", ["No such method: reboot"]]),
    (b'{"method": "updateConfig", "args": []}', ["GenericError", ["RPC input: Unable to read 1 tuple"]]),
    (b'{"method": "updateConfig", "args": [{"nics": []}]}',
     ["GenericError", ["Could not get instance parameters: Could not find instance name"]]),
    (b'{"method": "updateConfig", "args": [{"name": "a", "nics": [{"name": "ganeti:communication:"}]}]}',
     ["GenericError", ["Could not get instance parameters: Could not find instance communication IP"]]),
])
async def test_refusals_name_the_problem_and_store_nothing(metad, message, expected):
    """Each refusal is an error answer (metad's wording where metad has one); the server keeps serving."""
    app, path = metad
    answer = await call(path, message)
    assert answer["success"] is False
    if isinstance(expected, str):
        assert answer["result"].startswith(expected)
    else:
        assert answer["result"] == expected
    assert len(app.services.catalog) == 0
    assert await call(path, b'{"method": "echo", "args": ["still here"]}') == {"success": True, "result": "still here"}


async def test_refused_parameters_store_neither_record(metad):
    """A parameter imds cannot take (name, non-string value) refuses the whole push: no metadata record either."""
    app, path = metad
    answer = await update(path, instance(osparams={"Bad Name": "x"}, osparams_private={"n": 5}))
    assert answer["success"] is False
    message = answer["result"][1][0]
    assert "parameters.Bad Name" in message
    assert "parameters.n.value: must be a string" in message
    assert len(app.services.catalog) == 0


async def test_without_communication_nic_is_skipped(metad):
    """Ganeti's metad skips an instance without a communication NIC (success, nothing kept): so does imds."""
    app, path = metad
    assert await update(path, instance(nics=[{"name": "eth0", "ip": IP}])) == {"success": True, "result": []}
    assert len(app.services.catalog) == 0


async def test_an_instance_without_os_gets_only_its_instance_record(metad):
    """No OS name: the metadata record is stored, the /ganeti paths stay 404 (docs/ganeti.md's table)."""
    app, path = metad
    assert (await update(path, instance(os="")))["success"] is True
    async with client_from(app, IP) as guest:
        assert (await guest.get("/metadata")).json()["hostname"] == "vm1.example.com"
    assert (await parameters(app))[0] == 404


async def test_message_without_terminator_gets_an_error(metad):
    """Bytes then EOF without 0x03: an error answer naming it, nothing stored."""
    app, path = metad
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(json.dumps({"method": "updateConfig", "args": [instance()]}).encode())
    writer.write_eof()
    answer = json.loads((await reader.readuntil(EOM))[:-1])
    writer.close()
    assert answer == {"success": False, "result": "message ended without its 0x03 terminator"}
    assert len(app.services.catalog) == 0


def _send_huge(path: str, size: int) -> bytes:
    """A message of ``size`` bytes without its end; what comes back before the server closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(path)
        # Closed while we are still sending: the answer may be lost, the connection is gone.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b'{"method": "echo", "args": ["' + b"a" * size)
        try:
            return sock.recv(65536)
        except ConnectionResetError:
            return b""


async def test_a_100_mb_message_is_refused_and_the_server_keeps_serving(metad):
    """Over --max-body-bytes: an error answer (or just the close), never buffered whole; the next call works."""
    app, path = metad
    answer = await asyncio.to_thread(_send_huge, str(path), 100 * 1024 * 1024)
    assert answer in (b"", b'{"success":false,"result":"message larger than 1048576 bytes (--max-body-bytes)"}' + EOM)
    assert await call(path, b'{"method": "echo", "args": ["ok"]}') == {"success": True, "result": "ok"}
    assert len(app.services.catalog) == 0


async def test_a_new_address_replaces_the_old_one_and_clashes_resolve_to_the_later_visibility(metad):
    """A re-push with another IP: only the new one reads (metad keeps both); a name in two sections is served once."""
    app, path = metad
    first = instance()
    await update(path, first)
    moved = {**first, "nics": [{"name": "ganeti:communication:x", "ip": "192.0.2.51"}],
             "osparams": {"dhcp": "yes", "root-hash": "public-too"}}
    assert (await update(path, moved))["success"] is True
    assert (await parameters(app, IP))[0] == 404
    status, served = await parameters(app, "192.0.2.51")
    assert status == 200
    assert served["root-hash"] == ["private-value", "private"]


async def test_socket_is_0600_replaces_a_stale_one_and_goes_at_exit(tmp_path):
    """Mode 0600; a stale socket file is replaced (as metad does); anything else there is refused."""
    path = tmp_path / "metad.sock"
    bind(path).close()  # a stale socket file, nobody listening
    async with running_app(make_settings(ganeti_metad_socket=path)) as app, serving(app.services):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert (await call(path, b'{"method": "echo", "args": ["x"]}'))["result"] == "x"
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        bind(path)


async def test_another_replica_serves_it_through_the_store(tmp_path, sqlite_url):
    """Replica A takes the push; replica B (same database) serves it after the change feed, without secrets."""
    path = tmp_path / "metad.sock"
    async with running_app(make_settings(db=sqlite_url, ganeti_metad_socket=path)) as a, serving(a.services), \
            running_app(make_settings(db=sqlite_url)) as b:
        await update(path, instance())
        assert (await parameters(a))[1]["root-password"] == ["secret-value", "secret"]
        await b.services.catalog.catch_up()  # what B's feed follower does on its next poll
        assert await parameters(b) == (200, {"dhcp": ["yes", "public"], "root-hash": ["private-value", "private"]})


async def test_a_push_being_parsed_never_holds_the_event_loop(metad, monkeypatch):
    """A push's JSON is parsed in a worker thread: while one is held mid-parse, HTTP is still answered.

    No timing: the parse waits for the test to release it. Were it parsed on the event loop,
    the loop could not run the test on until the parse gave up waiting (its timeout), and the
    parse would record that it was never released.
    """
    app, path = metad
    entered, release = threading.Event(), threading.Event()
    released: list[bool] = []
    parse = luxi.loads_strict

    def held(raw: bytes, field: str = "body") -> Any:
        entered.set()
        released.append(release.wait(timeout=30))
        return parse(raw, field)

    monkeypatch.setattr(luxi, "loads_strict", held)
    push = asyncio.create_task(update(path, instance()))
    await wait_for_async(entered.is_set, what="the push's parse to start")
    async with client_from(app) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/metadata")).status_code == 404  # an instance read, while the parse is held
    release.set()
    assert await push == {"success": True, "result": []}
    assert released == [True]
