"""A hollow deployment's environment starts ``imds serve``.

Its listen address, templates and grace period work through hollow's ``METADATASERVICE_*`` names
(plus the admin token imds needs where hollow's admin API was open, and ``IMDS_DB``: hollow's
CockroachDB settings are refused, see tests/unit/test_hollow_config.py); a PostgreSQL URL in
hollow's quickstart style (``?sslmode=disable``) works as it is.
"""

from __future__ import annotations

import asyncio
import subprocess

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import httpx
import pytest
import sqlalchemy as sa

from imds.config import load
from imds.store.sql.engine import connector_for, create_engine
from serve_process import ADMIN_TOKEN, IMDS, Server, clean_env, free_port, stop_process

INSTANCE = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"


@pytest.mark.postgres
def test_quickstart_style_url_with_sslmode_connects(postgres_server) -> None:
    """The engine and the feed listener's connector both connect with a hollow-quickstart-style URL (sslmode)."""
    url = load(environ={"IMDS_DB": postgres_server.url() + "?sslmode=disable"}).store.db
    assert url.endswith("?sslmode=disable")

    async def run() -> tuple[int, int]:
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                through_engine = (await conn.execute(sa.text("SELECT 1"))).scalar_one()
        finally:
            await engine.dispose()
        listener = await connector_for(url).connect()
        try:
            return through_engine, await listener.fetchval("SELECT 2")
        finally:
            await listener.close()

    assert asyncio.run(run()) == (1, 2)


@pytest.mark.postgres
def test_quickstart_environment_serves(postgres_empty_url: str, tmp_path) -> None:
    """The hollow quickstart.yml variables (plus IMDS_ADMIN_TOKEN) migrate, serve a record and log ignored names."""
    port = free_port()
    env = clean_env(
        tmp_path,
        METADATASERVICE_OIDC_ENABLED="false",
        IMDS_DB=postgres_empty_url + "?sslmode=disable",
        METADATASERVICE_LISTEN=f"127.0.0.1:{port}",
        METADATASERVICE_METADATA_PHONE_HOME_URL="http://phone.example/{{.facility}}",
        METADATASERVICE_SHUTDOWN_GRACE_PERIOD="2s",
        METADATASERVICE_LOGGING_PRETTY="true",
        IMDS_ADMIN_TOKEN=ADMIN_TOKEN,
    )
    # quickstart.yml's migrate container (``metadataservice migrate up``), then the service.
    migrated = subprocess.run([str(IMDS), "db", "upgrade"], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
    assert migrated.returncode == 0, migrated.stderr
    assert asyncio.run(_revision(postgres_empty_url)), "imds db upgrade did not migrate hollow's database"
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([str(IMDS), "serve", "--rate-limit", "0"], env=env, stdin=subprocess.DEVNULL,
                                   stdout=sink, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        server.wait_healthy()
        record = {"id": INSTANCE, "ipAddresses": ["127.0.0.1"], "metadata": {"facility": "da11"}}
        server.post("/device-metadata", record)
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            document = client.get(f"{server.url}/metadata").json()
        assert document["phone_home_url"] == "http://phone.example/da11"
        assert "METADATASERVICE_LOGGING_PRETTY ignored" in server.output()
    finally:
        assert stop_process(process) == 0, server.output()


async def _revision(url: str) -> str | None:
    """The Alembic revision the database at ``url`` is at."""
    conn = await asyncpg.connect(url)
    try:
        revision: str | None = await conn.fetchval("SELECT version_num FROM alembic_version")
    finally:
        await conn.close()
    return revision
