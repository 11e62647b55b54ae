"""``imds import`` hardening and hollow's readings, through the real executable.

Input that cannot be read ends with one clear error naming the line and nothing written; an
id given twice is reported (``--strict`` rejects the file); a JSON array is streamed; one
set of limits for the admin API and imports; a secret an offline import drops is named;
``imds explain --url`` for an address nobody holds is an answer, not a 500.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from factories import new_id
from serve_process import ADMIN_TOKEN, IMDS, clean_env, run_imds, serving


def imds(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """The real executable with a clean environment; stdin as bytes (some inputs are not UTF-8)."""
    with tempfile.TemporaryDirectory(prefix="imds-hollow-") as home:
        done = subprocess.run([str(IMDS), *args], input=stdin, env=clean_env(Path(home)), capture_output=True,
                              timeout=300, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def item(instance_id: str, ip: str, **document) -> dict:
    return {"id": instance_id, "ipAddresses": [ip], "metadata": {"id": instance_id, **document}}


def line(obj: dict) -> bytes:
    return json.dumps(obj).encode() + b"\n"


@pytest.fixture
def data(tmp_path) -> str:
    path = tmp_path / "data"
    assert imds("db", "upgrade", "--data-dir", str(path)).returncode == 0
    return str(path)


def exported(data: str) -> list[dict]:
    done = imds("export", "--data-dir", data)
    assert done.returncode == 0, done.stderr
    return [json.loads(text) for text in done.stdout.splitlines()]


@pytest.mark.parametrize(("tail", "error"), [
    (b'{"id": "x", "metadata": {"note": "caf\xe9"}}\n',
     "Error: line 2: not valid UTF-8 (byte 0xe9 at column 38): save the file as UTF-8 (nothing was written)"),
    (b"[" * 200_000 + b"]" * 200_000 + b"\n",
     ("Error: line 2: nested too deeply for the JSON parser (a document is at most --max-document-depth levels "
      "deep) (nothing was written)")),
])
def test_unreadable_input_is_one_clear_error_and_nothing_is_written(tmp_path, data, tail, error):
    """Not UTF-8, or nested 200,000 deep: exit 1, the line named, no traceback, not even line 1 written."""
    source = tmp_path / "fleet.jsonl"
    source.write_bytes(line(item(new_id(), "10.71.0.1")) + tail + line(item(new_id(), "10.71.0.3")))
    for args in (("import", str(source)), ("import", "-")):
        done = imds(*args, "--data-dir", data, stdin=source.read_bytes())
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines()[-1] == error
        assert "Traceback" not in done.stderr
        assert exported(data) == []


def test_an_array_that_cannot_be_read_names_its_line(tmp_path, data):
    """A JSON array is read element by element: a bad element stops the import before anything is written."""
    good = json.dumps(item(new_id(), "10.71.1.1"))
    source = tmp_path / "fleet.json"
    source.write_bytes(f"[\n{good},\n{good}\n".encode() + b'{"note": "caf\xc3\xa9"}]')
    done = imds("import", str(source), "--data-dir", data)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: line 4: not a valid JSON array: expected ',' or ']' after item 2, found '{' (nothing was written)")
    assert exported(data) == []


def test_an_id_given_twice_is_reported_and_strict_rejects_the_file(tmp_path, data):
    """A warning names the id and both lines (the later one wins); --strict writes nothing."""
    twice = new_id()
    first, other, second = item(twice, "10.71.2.1", v=1), item(new_id(), "10.71.2.2"), item(twice.upper(), "10.71.2.3",
                                                                                          v=2)
    source = tmp_path / "fleet.jsonl"
    source.write_bytes(line(first) + line(other) + b"\n" + line(second))
    strict = imds("import", str(source), "--data-dir", data, "--strict")
    assert strict.returncode == 1
    assert strict.stdout.splitlines() == [
        "0 created, 0 updated, 0 unchanged, 0 stale, 1 rejected (--strict: nothing written)",
        f"rejected line 4 ({twice}): id: the same id as line 1 (--strict: each id once)",
    ]
    assert f"warning: instance {twice} is given twice: line 1 and line 4 (--strict: the file is rejected)" in (
        strict.stderr)
    assert exported(data) == []
    done = imds("import", str(source), "--data-dir", data)
    assert done.returncode == 0, done.stdout
    assert f"warning: instance {twice} is given twice: line 1 and line 4 (the later one wins)" in done.stderr
    stored = {record["id"]: record for record in exported(data)}
    assert stored[twice]["metadata"]["v"] == 2
    array = tmp_path / "fleet.json"
    array.write_text(json.dumps([first, second]))
    again = imds("import", str(array), "--data-dir", data)
    assert f"warning: instance {twice} is given twice: item 1 (line 1) and item 2 (line 1)" in again.stderr


def test_a_large_array_is_streamed(tmp_path):
    """A 40 MB array costs about what a tiny one does (parsed whole it took several times the file)."""
    tiny, big = tmp_path / "tiny.json", tmp_path / "big.json"
    tiny.write_text(json.dumps([item(new_id(), "10.72.0.1")]))
    with big.open("w") as out:
        out.write("[")
        for n in range(4000):
            out.write(("," if n else "") + json.dumps(item(new_id(), f"10.72.{n // 250}.{n % 250 + 1}",
                                                           pad="x" * 10_000)))
        out.write("]")
    assert big.stat().st_size > 40_000_000

    def peak_rss_kib(source: Path) -> int:
        data = tmp_path / f"data-{source.stem}"
        measure = ("import resource, subprocess, sys; "
                   "done = subprocess.run(sys.argv[1:], capture_output=True); "
                   "assert done.returncode == 0, done.stdout + done.stderr; "
                   "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        env = clean_env(tmp_path)
        assert subprocess.run([str(IMDS), "db", "upgrade", "--data-dir", str(data)], env=env, check=False,
                              capture_output=True).returncode == 0
        done = subprocess.run([sys.executable, "-c", measure, str(IMDS), "import", str(source), "--dry-run",
                               "--data-dir", str(data)], env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    assert peak_rss_kib(big) - peak_rss_kib(tiny) < 60_000  # KiB: well under the file's own 40 MB twice over


def test_an_item_is_held_to_the_admin_apis_limits(tmp_path, data):
    """2 MB of userdata: refused as the admin API refuses the body (--max-body-bytes); the same flag raises it."""
    big = {"id": new_id(), "ipAddresses": ["10.73.0.1"], "userdata": "u" * 2_000_000, "userdata_encoding": "text"}
    source = tmp_path / "big.jsonl"
    source.write_bytes(line(big))
    refused = imds("import", str(source), "--data-dir", data)
    assert refused.returncode == 1
    assert refused.stdout.splitlines()[1] == (
        f"rejected line 1 ({big['id']}): userdata: is 2000000 bytes; at most 1048576 are accepted, as in one admin "
        "write (--max-body-bytes / IMDS_MAX_BODY_BYTES)")
    assert exported(data) == []
    accepted = imds("import", str(source), "--data-dir", data, "--max-body-bytes", "3000000")
    assert accepted.returncode == 0, accepted.stdout
    assert len(exported(data)[0]["userdata"]) == 2_000_000


def test_an_offline_import_names_the_secret_it_drops(tmp_path, data):
    """The database never holds a secret OS value: the import warns, naming the instance and the parameter."""
    instance_id = new_id()
    obj = item(instance_id, "10.74.0.1")
    obj["os"] = {"os_type": "debootstrap+default", "mode": "install", "communication": False,
                 "parameters": {"dns": {"value": "10.9.0.2", "visibility": "public"},
                                "root_password": {"value": "hunter2", "visibility": "secret"}}}
    source = tmp_path / "os.jsonl"
    source.write_bytes(line(obj))
    done = imds("import", str(source), "--data-dir", data)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"warning: line 1 ({instance_id}): os.parameters.root_password: a secret value is never stored in the "
            "database; this import drops it") in done.stderr
    assert "hunter2" not in done.stderr + done.stdout
    assert "dns" not in done.stderr


def test_imports_read_hollows_addresses_unless_strict_records(tmp_path, data):
    """10.70.17.9/31 is accepted with a warning and exported as sent; --strict-records rejects it."""
    instance_id = new_id()
    source = tmp_path / "hollow.jsonl"
    source.write_bytes(line(item(instance_id, "10.70.17.9/31")))
    strict = imds("import", str(source), "--data-dir", data, "--strict-records")
    assert strict.returncode == 1
    assert "has host bits set" in strict.stdout.splitlines()[1]
    done = imds("import", str(source), "--data-dir", data)
    assert done.returncode == 0, done.stdout
    assert (f"warning: line 1 ({instance_id}): ipAddresses: 10.70.17.9/31 has host bits set: it covers the network "
            "10.70.17.8/31") in done.stderr
    assert exported(data)[0]["ipAddresses"] == ["10.70.17.9/31"]
    assert imds("import", str(source), "--data-dir", data).stdout.startswith("0 created, 0 updated, 1 unchanged")
    source.write_bytes(line(item(instance_id, "10.70.17.8/31")))  # the same network, spelled otherwise: a change
    assert imds("import", str(source), "--data-dir", data).stdout.startswith("0 created, 1 updated, 0 unchanged")
    assert exported(data)[0]["ipAddresses"] == ["10.70.17.8/31"]
    source.write_bytes(line(item(instance_id, "10.70.17.9/31")))
    assert imds("import", str(source), "--data-dir", data).returncode == 0
    explained = run_imds(tmp_path, "explain", "10.70.17.8", "--data-dir", data)
    assert "entry        10.70.17.9/31 (cidr, /31, covering 10.70.17.8/31: the longest prefix)" in explained.stdout


def test_explain_url_for_an_address_nobody_holds(tmp_path):
    """Was a 500 (KeyError 'by_ip_cache') from a server without an upstream lookup."""
    with serving(tmp_path, "--data-dir", str(tmp_path / "served")) as server:
        done = run_imds(tmp_path, "explain", "10.75.0.1", "--url", server.url, IMDS_ADMIN_TOKEN=ADMIN_TOKEN)
    assert done.returncode == 0, done.stderr
    assert "instance     none: no stored entry contains it: no instance holds 10.75.0.1" in done.stdout
