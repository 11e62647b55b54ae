"""imds in place of ganeti-metad, side by side with the real one (Debian's Ganeti 3.0.2).

Debian's client (``ganeti.metad.Client``, run by /usr/bin/python3 as the node daemon runs it)
pushes ONE instance to the real ``ganeti-metad`` and to ``imds serve --ganeti-metad-socket``;
then the instance (from its communication NIC's address, 127.0.0.5) reads every path metad
serves from both, and the answers are compared: status and body the same, except the
differences docs/ganeti.md lists ("imds in place of ganeti-metad"), each asserted as listed.
"""

from __future__ import annotations

import io
import json
import shutil
import socket
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ganeti_metad import SOCKET, metad_running, node_root, push, require_ganeti
from serve_process import Server, client_at, serving

INSTANCE_IP, STRANGER_IP, MOVED_IP = "127.0.0.5", "127.0.0.6", "127.0.0.7"
SCRIPTS = ("create", "export", "import", "rename")  # no "verify": both answer 404 for it
PARAMETERS = ("dhcp", "os-install-package", "os-package", "root-password", "api-key")
NODE_PACKAGES = ("/ganeti/latest/os/os-install-package", "/ganeti/latest/os/package")
PUBLIC = "/ganeti/latest/os/parameters.json"


@pytest.fixture
def base() -> Iterator[Path]:
    """A short temp dir (Unix socket paths are limited to 108 bytes), removed afterwards."""
    require_ganeti()
    path = Path(tempfile.mkdtemp(prefix="gnt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def os_definition(base: Path) -> Path:
    """``<base>/srv/ganeti/os/debootstrap``: metad's /srv/ganeti/os and imds's --os-definitions-dir."""
    definition = base / "srv" / "ganeti" / "os" / "debootstrap"
    definition.mkdir(parents=True)
    for name in SCRIPTS:
        (definition / name).write_text(f"#!/bin/sh\necho {name}\n")
        (definition / name).chmod(0o755)
    (definition / "ganeti_api_version").write_text("20\n")
    (definition / "parameters.list").write_text("".join(f"{name} a parameter\n" for name in PARAMETERS))
    return definition.parent


def instance_spec(install_package: Path, package: Path | None = None) -> dict[str, Any]:
    """One instance with a plain NIC first and its communication NIC second (ganeti_push.py's input).

    Its OS parameters name the node's files as Ganeti does: ``os-install-package`` (and ``os-package``).
    """
    instance_id = str(uuid.uuid4())
    return {
        "instance": {"name": "vm1.example.com", "uuid": instance_id, "os": "debootstrap", "primary_node": "node1",
                     "hypervisor": "kvm", "admin_state": "up", "admin_state_source": "admin",
                     "osparams": {"dhcp": "yes", "os-install-package": str(install_package),
                                  **({"os-package": str(package)} if package is not None else {})}},
        "nics": [
            {"name": "eth0", "ip": "192.0.2.10", "mac": "aa:00:00:00:00:01", "uuid": str(uuid.uuid4())},
            {"name": f"ganeti:communication:{instance_id}", "ip": INSTANCE_IP, "mac": "aa:00:00:00:00:02",
             "uuid": str(uuid.uuid4())},
        ],
        "private": {"root-password": "hunter2-private"},
        "secret": {"api-key": "s3cr3t-secret"},
    }


def read(url: str, path: str, *, method: str = "GET", source: str = INSTANCE_IP, body: bytes = b"") -> httpx.Response:
    """One request as the instance (its source address) would send it."""
    with client_at(source) as client:
        return client.request(method, f"{url}{path}", content=body)


def members(archive: bytes) -> dict[str, bytes]:
    """File name (without the top directory) → bytes, from a tar.gz."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name.split("/", 1)[-1]: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


def imds_args(base: Path, os_dir: Path, imds_root: Path) -> tuple[str, ...]:
    return ("--db", f"sqlite:///{base / 'imds.db'}", "--os-definitions-dir", str(os_dir),
            "--ganeti-metad-socket", str(imds_root / SOCKET), "--log-level", "debug",
            "--ganeti-os-package-dir", str(base / "node-files"))


def node_files(base: Path, os_dir: Path) -> tuple[Path, Path]:
    """The install package (the OS definition as a tar.gz, as Ganeti's node daemon makes one) and a package."""
    directory = base / "node-files"
    directory.mkdir()
    install_package, package = directory / "install.tar.gz", directory / "site.tar.gz"
    with tarfile.open(install_package, "w:gz") as tar:
        tar.add(os_dir / "debootstrap", arcname="debootstrap")
    motd = base / "motd"
    motd.write_text("personalized\n")
    with tarfile.open(package, "w:gz") as tar:
        tar.add(motd, arcname="etc/motd")
    return install_package, package


def assert_kept_secret(base: Path, imds: Server) -> None:
    """The secret reached no file and no log line; the private value no log line (docs/ganeti.md, Visibility)."""
    stored = b"".join(path.read_bytes() for path in base.glob("imds.db*"))
    assert b"s3cr3t-secret" not in stored
    assert "s3cr3t-secret" not in imds.output()
    assert "hunter2-private" not in imds.output()


def test_imds_answers_as_ganeti_metad(base: Path) -> None:
    """Same pushes, same reads: equal where docs/ganeti.md says nothing, its listed differences otherwise."""
    os_dir = os_definition(base)
    install_package, package = node_files(base, os_dir)
    spec = instance_spec(install_package, package)
    metad_root, imds_root = node_root(base / "metad"), node_root(base / "imds")
    with metad_running(metad_root, os_dir) as metad, serving(base, *imds_args(base, os_dir, imds_root)) as imds:
        # The push: the client sees the same answers from both (metad answers updateConfig with []).
        assert push(metad_root, spec) == push(imds_root, spec) == {"echo": "ping", "result": []}
        assert_same_reads(metad.url, imds.url)
        assert_node_packages_alike(metad.url, imds.url, install_package, package)
        assert_documented_differences(metad.url, imds.url)
        assert_audited(imds, spec["instance"]["uuid"])
        assert_skipped_alike(metad_root, imds_root, imds)
        assert unterminated(metad_root / SOCKET) == b""  # metad closes without a word
        assert unterminated(imds_root / SOCKET) == (
            b'{"success":false,"result":"message ended without its 0x03 terminator"}\x03')
        served = read(metad.url, PUBLIC).json()
    assert_kept_secret(base, imds)
    assert served == {"dhcp": ["yes", "public"], "os-install-package": [str(install_package), "public"],
                      "os-package": [str(package), "public"], "root-password": ["hunter2-private", "private"],
                      "api-key": ["s3cr3t-secret", "secret"]}
    # After a restart metad has forgotten everything; imds keeps public and private parameters, not secrets.
    with metad_running(metad_root, os_dir) as metad, serving(base, *imds_args(base, os_dir, imds_root)) as imds:
        assert read(metad.url, PUBLIC).status_code == 404
        again = read(imds.url, PUBLIC)
        assert again.status_code == 200
        assert again.json() == {name: value for name, value in served.items() if value[1] != "secret"}
        with httpx.Client(timeout=5.0) as admin:
            view = admin.get(f"{imds.url}/device-os/{spec['instance']['uuid']}", headers=imds.admin_headers).json()
        assert view["parameters"]["api-key"] == {"visibility": "secret", "secret_state": "lost"}
        assert_moves_alike(metad_root, imds_root, metad.url, imds.url, spec)


def assert_moves_alike(metad_root: Path, imds_root: Path, metad: str, imds: str, spec: dict[str, Any]) -> None:
    """A re-push with another address, an OS variant and a name in two sections (the docs' rows for each)."""
    assert push(metad_root, spec)["result"] == []  # metad learns the instance again after its restart
    moved = json.loads(json.dumps(spec))
    moved["nics"][1]["ip"] = MOVED_IP
    moved["instance"]["os"] = "debootstrap+default"
    moved["instance"]["osparams"]["root-password"] = "public-too"
    del moved["instance"]["osparams"]["os-package"]
    assert push(metad_root, moved)["result"] == push(imds_root, moved)["result"] == []
    # The old address: metad's map only grows, imds's address list is replaced.
    assert read(metad, PUBLIC).status_code == 200
    assert read(imds, PUBLIC).status_code == 404
    # An OS variant: metad looks for the directory "debootstrap+default", imds uses "debootstrap".
    theirs, ours = (read(url, "/ganeti/latest/os/scripts/create", source=MOVED_IP) for url in (metad, imds))
    assert (theirs.status_code, ours.status_code, ours.content) == (404, 200, b"#!/bin/sh\necho create\n")
    # A name in two sections: metad writes it twice, imds once with the later section's visibility.
    theirs, ours = (read(url, PUBLIC, source=MOVED_IP) for url in (metad, imds))
    assert theirs.content.count(b'"root-password"') == 2
    assert ours.content.count(b'"root-password"') == 1
    assert ours.json()["root-password"] == theirs.json()["root-password"] == ["hunter2-private", "private"]
    # os/package without an "os-package" parameter: metad's handler throws (500), imds has none to serve (404).
    theirs, ours = (read(url, "/ganeti/latest/os/package", source=MOVED_IP) for url in (metad, imds))
    assert theirs.status_code == 500
    assert b"Could not find OS package" in theirs.content
    assert (ours.status_code, ours.content) == (404, b"404 - Not Found")


def assert_same_reads(metad: str, imds: str) -> None:
    """Paths where both answer the same status and body (content type aside: see the docs' table)."""
    for path in (PUBLIC, *(f"/ganeti/latest/os/scripts/{name}" for name in SCRIPTS)):
        theirs, ours = read(metad, path), read(imds, path)
        assert (ours.status_code, ours.content) == (theirs.status_code, theirs.content), path
        assert theirs.status_code == 200, path
    for name in SCRIPTS:  # scripts: the same content type too
        assert read(imds, f"/ganeti/latest/os/scripts/{name}").headers["content-type"] == "application/octet-stream"
        assert read(metad, f"/ganeti/latest/os/scripts/{name}").headers["content-type"] == "application/octet-stream"
    # Same status (404 body: see the docs' table): no such script, unknown paths, a caller that is no instance.
    for path, source in (("/ganeti/latest/os/scripts/verify", INSTANCE_IP), ("/ganeti/latest/nope", INSTANCE_IP),
                         (PUBLIC, STRANGER_IP)):
        theirs, ours = read(metad, path, source=source), read(imds, path, source=source)
        assert (theirs.status_code, theirs.content) == (404, b"Resource not found"), path
        assert (ours.status_code, ours.content) == (404, b"404 - Not Found"), path
    # Outside /ganeti imds answers as the rest of its listener (the admin API's JSON 404 here).
    theirs, ours = read(metad, "/nope"), read(imds, "/nope")
    assert (theirs.status_code, theirs.content) == (404, b"Resource not found")
    assert (ours.status_code, ours.json()) == (404, {"message": "not found"})
    # read/write with the wrong method: 405 and the same Allow header (bodies: see the docs' table).
    for method, path, allow in (("POST", "read", "GET"), ("PUT", "read", "GET"),
                                ("GET", "write", "POST"), ("PUT", "write", "POST")):
        theirs, ours = (read(url, f"/ganeti/latest/{path}", method=method) for url in (metad, imds))
        assert (theirs.status_code, theirs.headers["allow"]) == (ours.status_code, ours.headers["allow"]) == (
            405, allow), (method, path)
        assert theirs.content == b"", (method, path)
        assert ours.json() == {"message": "method not allowed"}, (method, path)


def assert_node_packages_alike(metad: str, imds: str, install_package: Path, package: Path) -> None:
    """os/os-install-package and os/package: the node's files the parameters name, the same from both."""
    for path, file in zip(NODE_PACKAGES, (install_package, package), strict=True):
        theirs, ours = read(metad, path), read(imds, path)
        assert (ours.status_code, ours.content) == (theirs.status_code, theirs.content) == (200, file.read_bytes())
        assert ours.headers["content-type"] == theirs.headers["content-type"], path
    assert members(read(imds, NODE_PACKAGES[1]).content) == {"motd": b"personalized\n"}


def assert_documented_differences(metad: str, imds: str) -> None:
    """Each row of docs/ganeti.md's table, as listed there."""
    # parameters.json: metad sends no content type, imds application/json.
    assert "content-type" not in read(metad, PUBLIC).headers
    assert read(imds, PUBLIC).headers["content-type"] == "application/json"
    # read/write: metad's stubs answer 200 with nothing; imds's are the instance<->host channel.
    theirs, ours = (read(url, "/ganeti/latest/read") for url in (metad, imds))
    assert (theirs.status_code, theirs.content) == (200, b"")
    assert ours.status_code == 404
    assert "no message is queued" in ours.json()["message"]
    event = json.dumps({"state": "installing"}).encode()
    theirs, ours = (read(url, "/ganeti/latest/write", method="POST", body=event) for url in (metad, imds))
    assert (theirs.status_code, theirs.content) == (200, b"")
    assert ours.status_code == 200
    assert isinstance(ours.json()["cursor"], int)
    # meta_data.json: a stub in metad (200, empty), not served by imds.
    theirs, ours = (read(url, "/ganeti/latest/meta_data.json") for url in (metad, imds))
    assert (theirs.status_code, theirs.content) == (200, b"")
    assert ours.status_code == 404
    # Other methods on os/ paths: metad 404 (only GET is routed), imds 405 (HEAD answers as GET).
    assert read(metad, PUBLIC, method="POST").status_code == read(metad, PUBLIC, method="HEAD").status_code == 404
    assert read(imds, PUBLIC, method="POST").status_code == 405
    assert read(imds, PUBLIC, method="HEAD").status_code == 200
    # Listings: metad has none, imds lists os/.
    theirs, ours = (read(url, "/ganeti/latest/os") for url in (metad, imds))
    assert theirs.status_code == 404
    listed = "environment\nos-install-package\npackage\nparameters.json\nscripts/"
    assert (ours.status_code, ours.text) == (200, listed)


def unterminated(path: Path) -> bytes:
    """Send an echo without its 0x03, close our side: what comes back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(b'{"method": "echo", "args": ["x"]}')
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
        return received


def assert_audited(imds: Server, instance_id: str) -> None:
    """The push is an admin write like the others: audited under the subject ganeti-metad."""
    with httpx.Client(timeout=5.0) as admin:
        entries = admin.get(f"{imds.url}/audit", params={"instance": instance_id},
                            headers=imds.admin_headers).json()["entries"]
    assert [(e["subject"], e["kind"]) for e in entries] == [("ganeti-metad", "metadata"), ("ganeti-metad", "os")]


def assert_skipped_alike(metad_root: Path, imds_root: Path, imds: Server) -> None:
    """An instance without a communication NIC: both answer [] and keep nothing."""
    spec = instance_spec(Path("/nonexistent.tar.gz"))
    spec["nics"] = spec["nics"][:1]
    assert push(metad_root, spec) == push(imds_root, spec) == {"echo": "ping", "result": []}
    with httpx.Client(timeout=5.0) as admin:
        answer = admin.get(f"{imds.url}/device-metadata/{spec['instance']['uuid']}", headers=imds.admin_headers)
    assert answer.status_code == 404
