"""Private Ganeti OS parameters that are stored in clear, or that no configured key opens, are said so.

The app on one SQLite database, started again with other ``--private-key-file`` settings
(as a restart would): values stored without a key are a warning at start; values that the
configured keys cannot decrypt make ``/readyz`` 503 naming how many instances and the fix,
until the key is listed again (or the record is re-sent).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from structlog.testing import capture_logs

from factories import next_ipv4
from ganeti_data import os_body, put_os
from helpers import admin_client, client_from, make_settings, push_record, running_app

pytestmark = pytest.mark.anyio
PARAMS = "/ganeti/latest/os/parameters.json"


def _keys(path: Path, *keys: bytes) -> Path:
    path.write_bytes(b"".join(key + b"\n" for key in keys))
    return path


async def _store_private(sqlite_url: str, key_file: Path | None, count: int) -> list[tuple[str, str]]:
    """``count`` instances with a private OS parameter, written with ``key_file``; their (id, address)."""
    made = []
    async with running_app(make_settings(db=sqlite_url, private_key_file=key_file)) as app, admin_client(app) as admin:
        for _ in range(count):
            ip = next_ipv4()
            instance_id = await push_record(admin, [ip])
            await put_os(admin, os_body(instance_id, os_type="any"))
            made.append((instance_id, ip))
    return made


async def _start(sqlite_url: str, key_file: Path | None) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    """Start the app (logs captured) and read /readyz: (log events at start, readyz body and status)."""
    with capture_logs() as logs:
        async with running_app(make_settings(db=sqlite_url, private_key_file=key_file)) as app, \
                client_from(app) as anyone:
            ready = await anyone.get("/readyz")
    return logs, ready.json(), ready.status_code


async def test_private_values_stored_without_a_key_are_a_warning_at_start(sqlite_url: str) -> None:
    """Written with no --private-key-file: the next start warns (count, the fix); ready all the same."""
    await _store_private(sqlite_url, None, 2)
    logs, body, status = await _start(sqlite_url, None)
    warned = [event for event in logs if event["event"] == "os.private_unencrypted"]
    assert len(warned) == 1, logs
    assert warned[0]["log_level"] == "warning"
    assert warned[0]["instances"] == 2
    assert "--private-key-file" in warned[0]["hint"]
    assert (status, body["status"]) == (200, "ready")


async def test_no_warning_when_every_private_value_is_encrypted(sqlite_url: str, tmp_path: Path) -> None:
    """The same start with the key that encrypted them: no warning, no problem."""
    key_file = _keys(tmp_path / "private.keys", Fernet.generate_key())
    await _store_private(sqlite_url, key_file, 1)
    logs, body, status = await _start(sqlite_url, key_file)
    assert not [event for event in logs if event["event"].startswith("os.private_")], logs
    assert (status, body["problems"]) == (200, [])


async def test_values_no_key_opens_make_readyz_a_problem_until_the_key_is_back(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Encrypted with key A, restarted with key B only: /readyz 503 names 2 instances and the fix; A back: ready."""
    old, new = Fernet.generate_key(), Fernet.generate_key()
    made = await _store_private(sqlite_url, _keys(tmp_path / "old.keys", old), 2)
    only_new = _keys(tmp_path / "new.keys", new)
    logs, body, status = await _start(sqlite_url, only_new)
    assert status == 503
    assert body["status"] == "not ready"
    (problem,) = body["problems"]
    assert "2 instances" in problem
    assert "--private-key-file" in problem
    assert any(event["event"] == "os.private_unreadable" and event["instances"] == 2 for event in logs), logs
    # A record re-sent under the new key is readable again: one instance left in the problem.
    instance_id, ip = made[0]
    async with running_app(make_settings(db=sqlite_url, private_key_file=only_new)) as app, \
            admin_client(app) as admin, client_from(app, ip) as guest, client_from(app) as anyone:
        assert "root-hash" not in json.loads((await guest.get(PARAMS)).content)  # not served: no key opens it
        await put_os(admin, os_body(instance_id, os_type="any"))
        assert json.loads((await guest.get(PARAMS)).content)["root-hash"] == ["private-value", "private"]
        still = (await anyone.get("/readyz")).json()
        assert [p for p in still["problems"] if "1 instance " in p], still
    both = _keys(tmp_path / "both.keys", new, old)
    _, body, status = await _start(sqlite_url, both)
    assert (status, body["problems"]) == (200, [])
