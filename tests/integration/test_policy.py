"""Policy fixes: no redirects, private operational endpoints, logged 500s, trusted-proxy warnings."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from factories import metadata_body, new_id, next_ipv4
from helpers import admin_client, client_from, make_settings, running_app
from imds.models import Instance
from imds.store.memory import MemoryStore

pytestmark = pytest.mark.anyio


# --- (a) a trailing slash is a 404, never a redirect to the Host header --------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/device-metadata/"),
        ("POST", "/device-userdata/"),
        ("POST", "/api/v1/device-metadata/"),
        ("GET", "/device-metadata/{id}/"),
        ("DELETE", "/device-userdata/{id}/"),
        ("GET", "/identity/certificate.pem/"),
        ("GET", "/healthz/"),
    ],
)
async def test_a_trailing_slash_on_an_admin_route_is_a_404_not_an_open_redirect(method, path):
    """FastAPI answered 307 to http://<Host header>/…: any Host made it a redirect to anywhere. Now 404, as hollow."""
    async with running_app() as app, admin_client(app) as admin:
        body = metadata_body(ips=[next_ipv4()])
        await admin.post("/device-metadata", json=body)
        answer = await admin.request(method, path.format(id=body["id"]), json=body,
                                     headers={"host": "evil.example"}, follow_redirects=False)
        assert answer.status_code == 404
        assert "location" not in answer.headers
        assert answer.json() == {"message": "not found"}
        assert (await admin.get(f"/device-metadata/{body['id']}")).json() == body["metadata"]


# --- (b) operational endpoints: probes public, metrics and the API description need a token ----


def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [
        {"subject": "scraper", "token": "metrics-token-0123456789", "scopes": ["metrics"]},
        {"subject": "reader", "token": "read-token-0123456789", "scopes": ["read"]},
        {"subject": "writer", "token": "write-token-0123456789", "scopes": ["write"]},
    ]}))
    return path


PRIVATE = ("/metrics", "/openapi.json")  # /docs is a public page that sends a token for the spec


async def test_metrics_and_the_api_description_need_the_read_or_metrics_scope(tmp_path):
    """Anonymous: 401 (probes stay 200); a write-only token: 403; metrics or read scope: 200."""
    settings = make_settings(admin_token=None, admin_tokens_file=tokens_file(tmp_path))
    async with running_app(settings) as app, client_from(app, next_ipv4()) as anonymous:
        for path in ("/healthz", "/readyz"):
            assert (await anonymous.get(path)).status_code == 200, path
        for path in PRIVATE:
            answer = await anonymous.get(path)
            assert answer.status_code == 401, path
            assert "imds_http_requests_total" not in answer.text
            writer = await anonymous.get(path, headers={"authorization": "Bearer write-token-0123456789"})
            assert writer.status_code == 403, path
            assert writer.json()["message"] == "token lacks a required scope; one of: read, metrics"
        for token in ("metrics-token-0123456789", "read-token-0123456789"):
            auth = {"authorization": f"Bearer {token}"}
            assert "imds_http_requests_total" in (await anonymous.get("/metrics", headers=auth)).text
            assert "/device-metadata" in (await anonymous.get("/openapi.json", headers=auth)).json()["paths"]
            assert "swagger" in (await anonymous.get("/docs", headers=auth)).text.lower()
        scraper = {"authorization": "Bearer metrics-token-0123456789"}
        assert (await anonymous.get(f"/device-metadata/{new_id()}", headers=scraper)).status_code == 403


async def test_metrics_public_opens_only_metrics():
    """--metrics-public keeps hollow-style anonymous scraping; the API description stays private."""
    async with running_app(make_settings(metrics_public=True)) as app, client_from(app, next_ipv4()) as anonymous:
        assert "imds_http_requests_total" in (await anonymous.get("/metrics")).text
        assert (await anonymous.get("/openapi.json")).status_code == 401


# --- (c) an admin 500 is logged with its traceback, never with the request body ------------------


class FailingStore(MemoryStore):
    """A store whose reads by id fail with a bug (a collaborator's fault, not the code under test)."""

    async def get(self, instance_id: str) -> Instance | None:
        raise RuntimeError("store bug " + instance_id)


async def test_an_admin_500_is_logged_once_with_its_exception_and_answered_as_json():
    """The error log carries exc_info (so the traceback is rendered) and the path, not the body or the token."""
    async with running_app(store=FailingStore()) as app, admin_client(app) as admin:
        instance_id = new_id()
        with capture_logs() as logs:
            answer = await admin.get(f"/device-metadata/{instance_id}")
        assert answer.status_code == 500
        assert answer.json() == {"message": "internal error"}
        errors = [entry for entry in logs if entry["log_level"] == "error"]
        assert len(errors) == 1
        assert errors[0]["event"] == "admin.error"
        assert errors[0]["exc_info"] is True
        assert errors[0]["path"] == f"/device-metadata/{instance_id}"
        assert "test-admin-token" not in repr(errors[0])


def test_the_log_setup_renders_tracebacks_of_stdlib_records():
    """Uvicorn logs through stdlib logging: those records kept exc_info but lost the traceback text."""
    script = (
        "import logging; from imds import log; log.configure('info')\n"
        "try:\n    raise RuntimeError('kaboom')\n"
        "except RuntimeError:\n    logging.getLogger('uvicorn.error').exception('Exception in ASGI application')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert line["event"] == "Exception in ASGI application"
    assert "Traceback (most recent call last)" in line["exception"]
    assert "RuntimeError: kaboom" in line["exception"]


# --- (g) an instance inside a trusted-proxy network could impersonate any other: say so ----------

PROXIES = (ipaddress.ip_network("10.250.0.0/16"), ipaddress.ip_network("fd00:250::/32"))


async def test_a_write_binding_an_address_inside_a_trusted_proxy_network_warns():
    """The write still applies (the operator may mean it), with a warning in the answer and in the log."""
    async with running_app(make_settings(trusted_proxies=PROXIES)) as app, admin_client(app) as admin:
        body = metadata_body(ips=["10.250.3.4", "10.0.0.0/8", next_ipv4()])
        with capture_logs() as logs:
            answer = await admin.post("/device-metadata", json=body)
        assert answer.status_code == 200
        tail = (" overlaps the trusted-proxy network 10.250.0.0/16: a caller there can impersonate any instance "
                "with X-Forwarded-For (see SECURITY.md)")
        assert answer.json()["warnings"] == [f"10.250.3.4{tail}", f"10.0.0.0/8{tail}"]
        warned = [e for e in logs if e["event"] == "record.inside_trusted_proxy"]
        assert [(e["log_level"], e["instance_id"], len(e["problems"])) for e in warned] == [
            ("warning", body["id"], 2)]
        clean = metadata_body(ips=[next_ipv4()])
        assert "warnings" not in (await admin.post("/device-metadata", json=clean)).json()


async def test_startup_warns_about_stored_instances_inside_a_trusted_proxy_network(sqlite_url):
    """Records stored before the proxy was trusted are reported once when the service starts."""
    inside, outside = metadata_body(ips=["fd00:250::9"]), metadata_body(ips=[next_ipv4()])
    async with running_app(make_settings(db_url=sqlite_url)) as app, admin_client(app) as admin:
        for body in (inside, outside):
            assert (await admin.post("/device-metadata", json=body)).status_code == 200
    with capture_logs() as logs:
        async with running_app(make_settings(db_url=sqlite_url, trusted_proxies=PROXIES)):
            pass
    warned = [e for e in logs if e["event"] == "instance.inside_trusted_proxy"]
    assert [(e["log_level"], e["instance_id"]) for e in warned] == [("warning", inside["id"])]
    assert "fd00:250::/32" in warned[0]["problems"][0]


async def test_the_api_description_lists_every_error_status():
    """400, 401, 403, 404, 409, 413, 502 and 503 were answered but missing from /openapi.json."""
    async with running_app() as app, admin_client(app) as admin:
        paths = (await admin.get("/openapi.json")).json()["paths"]
    write = paths["/device-metadata"]["post"]["responses"]
    assert {"200", "400", "401", "403", "413", "503"} <= set(write)
    assert write["400"]["content"]["application/json"]["schema"]["required"] == ["message"]
    assert {"200", "400", "401", "403", "404"} <= set(paths["/device-userdata/{instance_id}"]["delete"]["responses"])
    assert {"404", "409", "502"} <= set(paths["/device-metadata/refresh/{instance_id}"]["post"]["responses"])
    assert {"400", "404"} <= set(paths["/device-configdrive/{instance_id}"]["get"]["responses"])
