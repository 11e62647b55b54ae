"""``imds serve`` as a real process on real sockets: peers, IPv6, demo, restarts, flags and help.

Every process is started with a bounded wait and stopped by its PID in a ``finally``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

import imds
from factories import metadata_body, new_id, userdata_body
from imds.cli import cli
from serve_process import ADMIN_TOKEN, IMDS, STOP_TIMEOUT, Server, clean_env, client_at, run_imds, serving

TOKEN = ADMIN_TOKEN
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"


# --- one long-lived server with an SQLite database in a temporary data dir ---------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``imds serve`` on 127.0.0.1 and [::1], default SQLite under --data-dir."""
    tmp_path = tmp_path_factory.mktemp("serve")
    with serving(tmp_path, "--data-dir", str(tmp_path / "data"), v6=True) as running:
        running.data_dir = tmp_path / "data"
        yield running


def test_first_start_creates_and_migrates_the_default_sqlite_database(server):
    """With only --data-dir, the SQLite file appears there, migrated, and readiness says so."""
    assert (server.data_dir / "imds.db").is_file()
    with client_at() as client:
        ready = client.get(f"{server.url}/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    assert "db.migrated" in server.output()


def test_the_server_identifies_the_real_socket_peer(server):
    """A record bound to 127.0.0.2 is served to a client whose socket is bound to 127.0.0.2, and only to it."""
    body = metadata_body(ips=["127.0.0.2"], plan="c3.small")
    with client_at("127.0.0.1") as admin:
        posted = admin.post(f"{server.url}/device-metadata", json=body, headers=AUTH)
        assert posted.status_code == 200
        assert posted.json()["ipAddresses"] == ["127.0.0.2"]
        script = "#!/bin/sh\necho from-127.0.0.2\n"
        assert (
            admin.post(
                f"{server.url}/device-userdata", json=userdata_body(body["id"], ["127.0.0.2"], script), headers=AUTH
            ).status_code
            == 200
        )
    with client_at("127.0.0.2") as guest:
        got = guest.get(f"{server.url}/metadata")
        assert got.status_code == 200
        assert got.json() == body["metadata"]
        user = guest.get(f"{server.url}/api/v1/userdata/")
        assert user.content == script.encode()
        assert user.headers["content-type"] == "text/plain; charset=utf-8"
    with client_at("127.0.0.3") as stranger:
        spoofed = stranger.get(f"{server.url}/metadata", headers={"X-Forwarded-For": "127.0.0.2"})
        assert spoofed.status_code == 404
        assert spoofed.json() == {"message": "no instance is associated with 127.0.0.3"}


def test_reads_over_ipv6_identify_the_v6_peer(server):
    """A record bound to ::1 is served over the [::1] listener; the v4 listener still answers v4 callers."""
    body = metadata_body(ips=["0:0:0:0:0:0:0:1"], facility="v6-only")
    with client_at() as admin:
        posted = admin.post(f"{server.v6}/api/v1/device-metadata", json=body, headers=AUTH)
        assert posted.json()["ipAddresses"] == ["::1"]
        got = admin.get(f"{server.v6}/metadata")
        assert got.status_code == 200
        assert got.json() == body["metadata"]
        head = admin.head(f"{server.v6}/metadata")
        assert head.headers["content-length"] == str(len(got.content))
        over_v4 = admin.get(f"{server.url}/metadata")
        assert over_v4.status_code == 404
        assert over_v4.json() == {"message": "no instance is associated with 127.0.0.1"}


def test_unknown_paths_and_errors_are_json_over_the_wire(server):
    """Through the real server too, an unknown path is 404 JSON and a bad write 400 JSON naming the field."""
    with client_at() as client:
        missing = client.get(f"{server.url}/nope")
        assert missing.status_code == 404
        assert missing.json() == {"message": "not found"}
        bad = client.post(
            f"{server.url}/device-metadata", json={"id": new_id(), "ipAddresses": ["x"], "metadata": {}}, headers=AUTH
        )
        assert bad.status_code == 400
        assert [e["field"] for e in bad.json()["errors"]] == ["ipAddresses[0]"]


# --- demo, restart, shutdown ---------------------------------------------------------------------------------------


def test_demo_mode_serves_the_demo_instance_to_loopback(tmp_path):
    """--demo binds the example instance to 127.0.0.1 and ::1; Ctrl-C (SIGINT) then exits 0."""
    with serving(tmp_path, "--demo", "--db", "memory://", v6=True) as server, client_at() as client:
        for base in (server.url, server.v6):
            metadata = client.get(f"{base}/metadata")
            assert metadata.status_code == 200
            assert metadata.json()["id"] == DEMO_ID
            userdata = client.get(f"{base}/userdata")
            assert userdata.status_code == 200
            assert userdata.content.startswith(b"#!/bin/sh")
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=STOP_TIMEOUT) == 0, server.output()


def test_a_demo_restart_on_the_same_database_writes_nothing(tmp_path):
    """The second --demo start finds the demo records as they were: the audit log keeps the first start's two."""
    data = tmp_path / "data"
    for start in range(2):
        with serving(tmp_path, "--demo", "--data-dir", str(data)) as server, client_at() as client:
            assert client.get(f"{server.url}/metadata").json()["id"] == DEMO_ID
            audit = client.get(f"{server.url}/audit", params={"instance": DEMO_ID}, headers=AUTH)
            assert audit.status_code == 200, audit.text
            entries = [(e["subject"], e["kind"]) for e in audit.json()["entries"]]
            assert entries == [("demo", "metadata"), ("demo", "userdata")], (start, entries)
            code, _ = server.terminate()
            assert code == 0, server.output()
        loaded = [line for line in server.output().splitlines() if '"demo.loaded"' in line]
        assert len(loaded) == 1, server.output()
        assert ('"written": []' in loaded[0]) == (start == 1), loaded


def test_sigterm_exits_zero_promptly_and_acknowledged_writes_survive_a_restart(tmp_path):
    """A write that got its 200 is served after SIGTERM (exit 0, quickly) and a fresh start on the same data dir."""
    data = tmp_path / "data"
    body = metadata_body(ips=["127.0.0.4"], generation=1)
    script = "#!/bin/sh\necho durable\n"
    with serving(tmp_path, "--data-dir", str(data)) as first:
        with client_at() as admin:
            assert admin.post(f"{first.url}/device-metadata", json=body, headers=AUTH).json()["applied"] is True
            admin.post(
                f"{first.url}/device-userdata", json=userdata_body(body["id"], ["127.0.0.4"], script), headers=AUTH
            )
        code, seconds = first.terminate()
        assert code == 0, first.output()
        assert seconds < 5.0
        assert '"event": "imds.stopped"' in first.output()  # the lifespan ran its shutdown
    with serving(tmp_path, "--data-dir", str(data)) as second, client_at("127.0.0.4") as guest:
        assert guest.get(f"{second.url}/metadata").json() == body["metadata"]
        assert guest.get(f"{second.url}/userdata").content == script.encode()
        code, _ = second.terminate()
        assert code == 0


def test_an_acknowledged_write_survives_sigkill(tmp_path):
    """Durable before the 200: a write answered just before the process is killed outright is there on restart."""
    data = tmp_path / "data"
    body = metadata_body(ips=["127.0.0.5"], generation=2)
    with serving(tmp_path, "--data-dir", str(data)) as first, client_at() as admin:
        assert admin.post(f"{first.url}/device-metadata", json=body, headers=AUTH).json()["applied"] is True
        first.process.kill()
        assert first.process.wait(timeout=STOP_TIMEOUT) == -signal.SIGKILL
    with serving(tmp_path, "--data-dir", str(data)) as second, client_at("127.0.0.5") as guest:
        assert guest.get(f"{second.url}/metadata").json() == body["metadata"]


# --- the real executable: usage errors, help, version, busy port ----------------------------------------------------


def test_the_real_executable_reports_usage_errors_help_and_version(tmp_path):
    """Run concurrently: bad --listen and --trusted-proxy exit 2 naming the flag; --help and version exit 0."""
    cases = {
        "listen": ["serve", "--db", "memory://", "--listen", "nonsense"],
        "proxy": ["serve", "--db", "memory://", "--trusted-proxy", "10.0.0.0/33"],
        "help": ["--help"],
        "version": ["version"],
    }
    processes = {
        name: subprocess.Popen(
            [str(IMDS), *args],
            env=clean_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in cases.items()
    }
    results: dict[str, tuple[int, str, str]] = {}
    try:
        for name, process in processes.items():
            out, err = process.communicate(timeout=30)
            results[name] = (process.returncode, out, err)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=STOP_TIMEOUT)
    code, _out, err = results["listen"]
    assert code == 2
    assert "Error: --listen / IMDS_LISTEN: 'nonsense' is not HOST:PORT" in err
    code, _out, err = results["proxy"]
    assert code == 2
    assert "Error: --trusted-proxy / IMDS_TRUSTED_PROXIES: '10.0.0.0/33' is not a CIDR" in err
    code, out, err = results["help"]
    assert (code, err) == (0, "")
    assert out.startswith("Usage: imds")
    for command in ("serve", "db", "version"):
        assert command in out
    assert results["version"] == (0, f"{imds.__version__}\n", "")


def test_a_port_in_use_exits_non_zero_with_one_line(tmp_path):
    """Binding a port someone else listens on fails fast with a single readable line."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_imds(tmp_path, "serve", "--db", "memory://", "--listen", f"127.0.0.1:{port}")
    assert result.returncode not in (0, 2)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"]


# --- the same CLI in-process (fast): every usage error and every help page -------------------------------------------


def invoke(args: list[str], **env: str) -> Result:
    cleared = {k: None for k in os.environ if k.startswith("IMDS_")}
    return CliRunner().invoke(cli, args, env={**cleared, **env}, prog_name="imds")


@pytest.mark.parametrize(
    ("args", "env", "needles"),
    [
        (["--listen", "nonsense"], {}, ["--listen", "IMDS_LISTEN", "'nonsense'"]),
        (["--listen", "[::1]:"], {}, ["--listen", "IMDS_LISTEN"]),
        (["--trusted-proxy", "10.0.0.0/33"], {}, ["--trusted-proxy", "IMDS_TRUSTED_PROXIES", "'10.0.0.0/33'"]),
        (["--trusted-proxy", "10.0.0.0/8", "--trusted-proxy", "bogus"], {}, ["--trusted-proxy", "'bogus'"]),
        (["--max-body-bytes", "lots"], {}, ["--max-body-bytes", "'lots'"]),
        (["--max-body-bytes", "0"], {}, ["--max-body-bytes", "IMDS_MAX_BODY_BYTES"]),
        (["--feed-poll-interval", "fast"], {}, ["--feed-poll-interval", "'fast'"]),
        (["--log-level", "loud"], {}, ["--log-level", "IMDS_LOG_LEVEL", "'loud'"]),
        (["--db", "mysql://u:pw@h/db"], {}, ["--db", "IMDS_DB", "mysql://u:***@h/db"]),
        (["--admin-tokens-file", "/nonexistent.json"], {}, ["--admin-tokens-file", "IMDS_ADMIN_TOKENS_FILE"]),
        (["--no-such-flag"], {}, ["--no-such-flag"]),
        ([], {"IMDS_DEMO": "maybe"}, ["IMDS_DEMO", "--demo", "'maybe'"]),
        ([], {"IMDS_LISTEN": "127.0.0.1:70000"}, ["IMDS_LISTEN", "--listen"]),
        ([], {"IMDS_TRUSTED_PROXIES": "10.0.0.0/8,nope"}, ["IMDS_TRUSTED_PROXIES", "--trusted-proxy", "'nope'"]),
        (["--api-url", "{{range .x}}"], {}, ["--api-url", "IMDS_API_URL", "'{{range .x}}'"]),
        ([], {"IMDS_PHONE_HOME_URL": "https://{{.a"}, ["--phone-home-url", "IMDS_PHONE_HOME_URL", "unbalanced"]),
    ],
)
def test_a_bad_setting_exits_2_naming_the_flag(args, env, needles):
    """Every invalid flag or environment value is a usage error (status 2) naming the flag and variable."""
    result = invoke(["serve", "--db", "memory://", *args], **env)
    assert result.exit_code == 2, result.output
    for needle in needles:
        assert needle in result.output
    assert "pw@" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["-h"],
        ["serve", "--help"],
        ["db", "--help"],
        ["db", "upgrade", "--help"],
        ["db", "current", "--help"],
        ["db", "check", "--help"],
        ["version", "--help"],
    ],
)
def test_help_works_for_every_command(args):
    """Each command's help exits 0 with a usage line, even when a setting in the environment is invalid."""
    result = invoke(args, IMDS_DEMO="not-a-bool")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: imds")


def test_serve_help_lists_flags_with_their_env_vars_and_hides_the_token():
    """Flags and env vars come from one table; the admin token's value is never echoed."""
    result = invoke(["serve", "--help"], IMDS_ADMIN_TOKEN="leak-me-not")
    for needle in ("--listen", "IMDS_LISTEN", "--trusted-proxy", "IMDS_TRUSTED_PROXIES", "--admin-token", "--demo"):
        assert needle in result.output
    assert "leak-me-not" not in result.output


def test_db_upgrade_current_and_check_on_a_fresh_data_dir(tmp_path):
    """The db commands create, report and verify the SQLite schema under --data-dir."""
    data = str(tmp_path / "db-data")
    upgraded = invoke(["db", "upgrade", "--data-dir", data])
    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.output.strip().endswith("database upgraded to head")
    assert (tmp_path / "db-data" / "imds.db").is_file()
    current = invoke(["db", "current", "--data-dir", data])
    assert current.exit_code == 0, current.output
    assert "(head)" in current.output
    checked = invoke(["db", "check", "--data-dir", data])
    assert checked.exit_code == 0, checked.output
    assert checked.output.strip().endswith("schema matches migrations")


def test_db_commands_refuse_the_memory_store():
    """memory:// has no schema: a usage error, not a crash."""
    result = invoke(["db", "upgrade", "--db", "memory://"])
    assert result.exit_code == 2
    assert "memory:// has no schema to migrate" in result.output
