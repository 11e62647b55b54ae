"""The route table of docs/admin-auth.md walked against the real app: every route listed, every scope needed.

The table is read from the document (not from the code), so the docs, the routes the app
declares and what the server checks cannot drift apart: each route the app answers is a row;
each row's route is refused (403) without any one of the scope groups it names and answers
(neither 401 nor 403) with exactly the scopes it names; an anonymous call is 401 before its
parameters are looked at (no 422 echoing them). Records that hold a Ganeti OS record need
the ``os`` scope too wherever they are shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from factories import new_id, next_ipv4
from helpers import admin_client, client_from, make_settings, push_record, running_app
from imds.services.admission.auth import ALL_SCOPES
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio
DOC = Path(__file__).parents[2] / "docs" / "admin-auth.md"
JUNK = {"after": "x", "limit": "x", "follow": "x", "private": "x", "dry_run": "x", "format": "zz", "q": ""}
JUNK_SHOWN = ('"x"', "'x'", "zz")


def granted_by(named: str) -> frozenset[str]:
    """The scopes that grant a scope named in the table (written out from the doc's first table)."""
    if named == "metrics":
        return frozenset({"read", "metrics"})
    _, verb, kind = named.split(":")
    if verb in {"create", "update"}:
        return frozenset({"write", "create", "update", f"metadata:create:{kind}", f"metadata:update:{kind}"})
    if verb == "read":
        return frozenset({"read", f"metadata:read:{kind}"})
    return frozenset({"write", "delete", f"metadata:delete:{kind}"})


@dataclass(frozen=True)
class Row:
    """One row of the table: a method, a route (``{id}`` for an instance id) and the scopes it names."""

    method: str
    route: str
    needs: tuple[str, ...]  # one named scope per group; empty: public

    @property
    def public(self) -> bool:
        return not self.needs

    def url(self, instance_id: str) -> str:
        return self.route.replace("{id}", instance_id).replace("{project_id}", "proj-1").replace("{name}", "x")


def doc_rows() -> list[Row]:
    """The rows of the table headed ``| method | route | needs |`` in docs/admin-auth.md."""
    lines = DOC.read_text().splitlines()
    start = lines.index("| method | route | needs |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        method, routes, needs = (cell.strip() for cell in line.strip("|").split("|"))
        unconditional = needs.split(";")[0]  # "…; metadata:read:os too when …" is data-dependent
        named = tuple(s for s in re.findall(r"`([^`]+)`", unconditional) if s in ALL_SCOPES)
        assert named or "nothing" in needs, line
        rows += [Row(method.strip("`"), route, named) for route in re.findall(r"`(/[^`]*)`", routes)]
    return rows


ROWS = doc_rows()
GUARDED = [row for row in ROWS if not row.public]


def app_routes(app: InstanceFront) -> set[tuple[str, str]]:
    """(method, path) of every route the admin app declares, ``{instance_id}`` spelled ``{id}`` as the doc does."""
    return {(method, path.replace("{instance_id}", "{id}")) for method, path in app.admin_routes}


def test_every_route_of_the_app_is_in_the_table_and_nothing_else():
    """The table lists exactly the app's routes (the /api/v1 aliases are the same rows)."""
    from imds.app import build_app  # noqa: PLC0415 - built without starting anything

    app = build_app(make_settings())
    declared = {(m, p) for m, p in app_routes(app) if not p.startswith("/api/v1/")}
    listed = {(row.method, row.route) for row in ROWS}
    assert declared - listed == set(), "routes missing from docs/admin-auth.md"
    assert listed - declared == set(), "rows of docs/admin-auth.md the app does not have"
    aliased = {p.removeprefix("/api/v1") for _, p in app_routes(app) if p.startswith("/api/v1/")}
    assert aliased <= {row.route for row in ROWS}  # an alias is its route's row


def _token(scopes: frozenset[str]) -> str:
    return "tok-" + "-".join(sorted(s.replace(":", ".") for s in scopes)) + "-0123456789abcdef"


def _scope_sets() -> set[frozenset[str]]:
    """Every token a walk needs: all scopes but one group, exactly the named ones, and the os cases."""
    sets = {frozenset()}
    for row in GUARDED:
        sets.add(frozenset(row.needs))
        sets.update(frozenset(ALL_SCOPES - granted_by(named)) for named in row.needs)
    reads = {"metadata:read:metadata", "metadata:read:userdata"}
    writes = {"metadata:create:metadata", "metadata:create:userdata"}
    sets.update({frozenset(reads), frozenset({*reads, "metadata:read:os"}), frozenset(writes),
                 frozenset({*writes, "metadata:create:os"})})
    return sets


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def app(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[InstanceFront]:
    """The app with a tokens file holding one token per scope set the walk uses."""
    path = tmp_path_factory.mktemp("scopes") / "tokens.json"
    tokens = [{"subject": f"walk-{index}", "token": _token(scopes), "scopes": sorted(scopes)}
              for index, scopes in enumerate(sorted(_scope_sets(), key=sorted))]
    path.write_text(json.dumps({"tokens": tokens}))
    async with running_app(make_settings(admin_tokens_file=path)) as running:
        yield running


async def _call(app: InstanceFront, row: Row, scopes: frozenset[str] | None, instance_id: str, *,
                junk: bool = True) -> tuple[int, str]:
    async with client_from(app, token=None if scopes is None else _token(scopes)) as client:
        answer = await client.request(row.method, row.url(instance_id), params=JUNK if junk else None)
    return answer.status_code, answer.text


@pytest.mark.parametrize("row", GUARDED, ids=lambda row: f"{row.method} {row.route}")
async def test_a_guarded_route_refuses_without_each_scope_it_names(app, row):
    """401 without a token, whatever the query holds; 403 without any one named group; let in with exactly those."""
    instance_id = new_id()
    for prefix in ("", "/api/v1"):
        aliased = Row(row.method, prefix + row.route, row.needs)
        if (row.method, aliased.route) not in app_routes(app):
            continue  # not every router is under /api/v1 (the page's, the channel's, the operations')
        status, body = await _call(app, aliased, None, instance_id)
        assert status == 401, (aliased, status, body)
        assert not any(shown in body for shown in JUNK_SHOWN), body  # the input is never echoed
    for named in row.needs:
        lacking = frozenset(ALL_SCOPES - granted_by(named))
        status, body = await _call(app, row, lacking, instance_id)
        assert status == 403, (row, named, status, body)
        if row.method != "HEAD":  # a HEAD answer has no body (httpx's ASGI transport drops it too)
            assert all(scope in json.loads(body)["message"] for scope in granted_by(named)), body
    status, body = await _call(app, row, frozenset(row.needs), instance_id)
    assert status not in {401, 403}, (row, status, body)


@pytest.mark.parametrize("row", [row for row in ROWS if row.public], ids=lambda row: f"{row.method} {row.route}")
async def test_a_public_route_answers_anyone(app, row):
    """The public rows (probes, pages and their assets, the identity certificate) need no token."""
    status, body = await _call(app, row, None, new_id(), junk=False)
    assert status not in {401, 403}, (row, status, body)


async def test_a_parameter_that_does_not_parse_is_a_400_naming_it_for_an_allowed_caller(app):
    """FastAPI's 422 that echoes the input is a 400 naming the parameter, and only after the scopes."""
    async with admin_client(app, _token(frozenset({"metadata:read:metadata"}))) as admin:
        answer = await admin.get("/audit", params={"after": "not-a-number"})
    assert answer.status_code == 400
    assert [problem["field"] for problem in answer.json()["errors"]] == ["query.after"]
    assert "not-a-number" not in answer.text


READS = frozenset({"metadata:read:metadata", "metadata:read:userdata"})
WRITES = frozenset({"metadata:create:metadata", "metadata:create:userdata"})


async def _with_os(app: InstanceFront) -> tuple[str, str]:
    ip = next_ipv4()
    instance_id = await push_record(app, [ip], userdata="#cloud-config\n")
    async with admin_client(app) as admin:
        body = {"id": instance_id, "os_type": "debootstrap", "mode": "run",
                "parameters": {"dns": {"value": "192.0.2.53"}, "key": {"value": "p-1", "visibility": "private"}}}
        assert (await admin.post("/device-os", json=body)).status_code == 200
    return instance_id, ip


@pytest.mark.parametrize("path", ["/device-records/{id}", "/device-records", "/device-records?private=false",
                                  "/explain/{id}", "/explain?q={ip}"])
async def test_a_record_with_an_os_record_needs_the_os_read_scope_wherever_it_is_shown(app, path):
    """The OS record's values (public ones too) go out only to a token that may read OS records."""
    instance_id, ip = await _with_os(app)
    url = path.format(id=instance_id, ip=ip)
    async with admin_client(app, _token(READS)) as reader:
        refused = await reader.get(url)
    async with admin_client(app, _token(READS | {"metadata:read:os"})) as os_reader:
        allowed = await os_reader.get(url)
    assert refused.status_code == 403, refused.text
    assert "metadata:read:os" in refused.json()["message"]
    assert "192.0.2.53" not in refused.text
    assert allowed.status_code == 200, allowed.text
    assert "192.0.2.53" in allowed.text


async def test_an_item_with_an_os_record_needs_the_os_write_scope(app):
    """POST /device-records with an item carrying "os" needs metadata:create:os; nothing is written without it."""
    instance_id = new_id()
    item = {"id": instance_id, "ipAddresses": [next_ipv4()], "metadata": {"id": instance_id},
            "os": {"os_type": "debootstrap", "mode": "run"}}
    async with admin_client(app, _token(WRITES)) as writer:
        refused = await writer.post("/device-records", json=[item])
    assert refused.status_code == 403
    assert "metadata:create:os" in refused.json()["message"]
    async with admin_client(app) as admin:
        assert (await admin.get(f"/device-records/{instance_id}")).status_code == 404
    async with admin_client(app, _token(WRITES | {"metadata:create:os"})) as writer:
        assert (await writer.post("/device-records", json=[item])).json()["results"][0]["outcome"] == "created"


@pytest.mark.parametrize("fmt", ["config-2", "nocloud"])
async def test_a_config_drive_needs_the_userdata_read_scope(app, fmt):
    """A metadata-only reader gets no config drive (it holds the userdata); with both it gets the image."""
    instance_id = await push_record(app, [next_ipv4()], userdata="#cloud-config\nsecret-userdata: 1\n")
    url = f"/device-configdrive/{instance_id}?format={fmt}"
    async with admin_client(app, _token(frozenset({"metadata:read:metadata"}))) as reader:
        refused = await reader.get(url)
    async with admin_client(app, _token(READS)) as reader:
        allowed = await reader.get(url)
    assert refused.status_code == 403
    assert "metadata:read:userdata" in refused.json()["message"]
    assert b"secret-userdata" not in refused.content
    assert allowed.status_code == 200
    assert b"secret-userdata" in allowed.content
