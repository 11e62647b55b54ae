"""``imds get / list / delete`` on the database (``--data-dir``) and against a live server (``--url``).

Both ways must print the same thing for the same records; the server is a real ``imds
serve`` on loopback, stopped by its PID.
"""

from __future__ import annotations

import base64
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import imds
from factories import metadata_body, new_id, next_ipv4, userdata_body
from serve_process import ADMIN_TOKEN, run_imds, serving

BINARY = b"\x00\xffbinary"


@dataclass
class Ran:
    exit_code: int
    output: str  # stdout: the answer
    stderr: str  # errors and logs


def invoke(*args: str, **env: str) -> Ran:
    """The real ``imds`` executable (it configures logging for the process, so never in-process)."""
    with tempfile.TemporaryDirectory(prefix="imds-records-cli-") as home:
        done = run_imds(Path(home), *args, **env)
    return Ran(done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A real server on an SQLite data dir holding three instances: both records, metadata only, binary userdata."""
    tmp_path = tmp_path_factory.mktemp("records")
    data = tmp_path / "data"
    both, meta_only, binary = new_id(), new_id(), new_id()
    ips = {both: [next_ipv4(), "10.99.0.0/16"], meta_only: [next_ipv4()], binary: [next_ipv4()]}
    with serving(tmp_path, "--data-dir", str(data)) as server:
        server.post("/device-metadata", metadata_body(both, ips[both], facility="da11"))
        server.post("/device-userdata", userdata_body(both, ips[both], "#cloud-config\nhostname: a\n",
                                                       userdata_encoding="text"))
        server.post("/device-metadata", metadata_body(meta_only, ips[meta_only]))
        server.post("/device-userdata", userdata_body(binary, ips[binary], base64.b64encode(BINARY).decode()))
        yield {"server": server, "data": str(data), "both": both, "meta_only": meta_only, "binary": binary,
               "ips": ips}


@pytest.fixture(params=["db", "url"])
def where(request, fleet):
    """The target flags: the database directly, or the live server with the token from the environment."""
    if request.param == "db":
        return ["--data-dir", fleet["data"]], {}
    return ["--url", fleet["server"].url], {"IMDS_ADMIN_TOKEN": ADMIN_TOKEN}


def test_get_json_is_the_upsert_wire_format(fleet, where):
    """--output json: id, ipAddresses, metadata and userdata (text, or base64 when not UTF-8) as POSTed."""
    flags, env = where
    both = invoke("get", fleet["both"], *flags, "-o", "json", **env)
    assert both.exit_code == 0, both.output
    assert json.loads(both.output) == {
        "id": fleet["both"],
        "ipAddresses": fleet["ips"][fleet["both"]],
        "metadata": {"id": fleet["both"], "hostname": f"host-{fleet['both'][:8]}", "facility": "da11"},
        "userdata": "#cloud-config\nhostname: a\n",
        "userdata_encoding": "text",
    }
    binary = json.loads(invoke("get", fleet["binary"], *flags, "-o", "json", **env).output)
    assert (binary["userdata"], binary["userdata_encoding"]) == (base64.b64encode(BINARY).decode(), "base64")
    assert "metadata" not in binary


def test_get_table_names_each_part(fleet, where):
    """The table shows addresses, hostname, metadata keys and the userdata size."""
    flags, env = where
    result = invoke("get", fleet["both"], *flags, **env)
    assert result.exit_code == 0, result.output
    rows = dict(line.split(None, 1) for line in result.output.splitlines()[1:])
    assert rows == {
        "id": fleet["both"],
        "addresses": ", ".join(fleet["ips"][fleet["both"]]),
        "hostname": f"host-{fleet['both'][:8]}",
        "metadata": "3 keys: facility, hostname, id",
        "userdata": "26 bytes (text)",
    }


def test_list_shows_every_instance_the_same_both_ways(fleet):
    """--output json and table list the three instances; the database and the server agree exactly."""
    by_db = invoke("list", "--data-dir", fleet["data"], "-o", "json")
    by_url = invoke("list", "--url", fleet["server"].url, "--token", ADMIN_TOKEN, "-o", "json")
    assert by_db.exit_code == by_url.exit_code == 0, (by_db.output, by_url.output)
    rows = {row["id"]: row for row in json.loads(by_db.output)}
    assert set(rows) >= {fleet["both"], fleet["meta_only"], fleet["binary"]}
    assert rows[fleet["meta_only"]]["userdata_bytes"] is None
    assert rows[fleet["binary"]] == {
        "id": fleet["binary"], "hostname": None, "ipAddresses": fleet["ips"][fleet["binary"]],
        "metadata": False, "userdata_bytes": len(BINARY),
    }
    assert json.loads(by_url.output) == json.loads(by_db.output)
    assert by_url.stderr == ""  # JSON on stdout and nothing else: no log line per HTTP request
    table = invoke("list", "--data-dir", fleet["data"])
    assert table.output.splitlines()[0].split() == ["ID", "HOSTNAME", "ADDRESSES", "METADATA", "USERDATA"]
    line = next(line for line in table.output.splitlines() if line.startswith(fleet["both"]))
    addresses = ",".join(fleet["ips"][fleet["both"]])
    assert line.split() == [fleet["both"], f"host-{fleet['both'][:8]}", addresses, "yes", "26"]


def test_delete_one_kind_then_the_rest(fleet, where, tmp_path):
    """--kind userdata keeps the metadata; a second delete removes the instance; a third says it is gone."""
    flags, env = where
    server = fleet["server"]
    instance_id, ip = new_id(), next_ipv4()
    server.post("/device-metadata", metadata_body(instance_id, [ip]))
    server.post("/device-userdata", userdata_body(instance_id, [ip], "x", userdata_encoding="text"))
    first = invoke("delete", instance_id, *flags, "--kind", "userdata", **env)
    assert (first.exit_code, first.output) == (0, f"deleted userdata of {instance_id}\n")
    if "--data-dir" in flags:  # on the database, the CLI's delete is logged (JSON on stderr) like an admin one
        logged = [json.loads(line) for line in first.stderr.splitlines()]
        assert [(e["event"], e["subject"], e["kind"]) for e in logged] == [("record.deleted", "imds-cli", "userdata")]
    assert "userdata" not in json.loads(invoke("get", instance_id, *flags, "-o", "json", **env).output)
    second = invoke("delete", instance_id, *flags, "-o", "json", **env)
    assert (second.exit_code, json.loads(second.output)) == (0, {"id": instance_id, "deleted": ["metadata"]})
    gone = invoke("get", instance_id, *flags, **env)
    assert gone.exit_code == 1
    assert gone.stderr.splitlines()[-1].endswith(f"no instance {instance_id} is stored")
    # The server sees deletes made on the database (change feed), and vice versa.
    with httpx.Client(timeout=10) as client:
        answer = client.get(f"{server.url}/device-metadata/{instance_id}", headers=server.admin_headers)
    assert answer.status_code == 404


def test_errors_are_one_line(fleet, tmp_path):
    """A bad id is a usage error; a wrong token names the 401; no token with --url says how to give one."""
    assert invoke("get", "not-a-uuid", "--data-dir", fleet["data"]).exit_code == 2
    wrong = invoke("get", fleet["both"], "--url", fleet["server"].url, "--token", "wrong")
    assert wrong.exit_code == 1
    assert wrong.stderr.splitlines()[-1] == f"Error: GET /device-records/{fleet['both']}: 401 invalid bearer token"
    missing = invoke("list", "--url", fleet["server"].url)
    assert missing.exit_code == 2
    assert "--token, or IMDS_ADMIN_TOKEN" in missing.stderr
    memory = invoke("list", "--db", "memory://")
    assert memory.exit_code == 2
    assert "memory:// holds nothing outside a running server" in memory.stderr


@pytest.mark.parametrize("command", [["get"], ["list"], ["delete"]])
def test_help_says_both_targets(command, tmp_path):
    """Each command's --help (from the real executable) offers --db, --data-dir, --url, --token and --output."""
    result = run_imds(tmp_path, *command, "--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--db", "--data-dir", "--url", "--token", "--output"):
        assert flag in result.stdout


def test_version_flag(tmp_path):
    """``imds --version`` prints the program name and version."""
    result = run_imds(tmp_path, "--version")
    assert (result.returncode, result.stdout) == (0, f"imds {imds.__version__}\n")
