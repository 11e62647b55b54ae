"""Google's own clients, unchanged, against a real ``imds serve``: google-auth and cloud-init's GCE datasource.

One server (SQLite in a temporary data dir, a free loopback port) holds one instance at 127.0.0.8 with
SSH keys, attributes, a project and userdata. google-auth runs in a subprocess of this venv's python
(``GCE_METADATA_HOST``/``GCE_METADATA_IP`` point it at the server, so nothing leaks into this process's
environment); cloud-init runs under the system python. Both connect *from* 127.0.0.8 and only to the
server (the guard refuses any other destination). The identity token google-auth fetched is verified
against the published key set twice: by PyJWT's ``PyJWKClient`` and by google-auth's own ``jwt.decode``
(its ES256 verifier) with the key rebuilt from the JWK by ``cryptography``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.auth import jwt as google_jwt

from cloudinit_guard import GUEST_GUARD, run_cloud_init
from factories import new_id
from imds.services.render.gce import project_number
from serve_process import clean_env, client_at, serving

GUEST = "127.0.0.8"
AUDIENCE = "https://service.example/api"
ISSUER = "https://imds.example"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHT4s9q alice@example"
USERDATA = "#cloud-config\nhostname: gce-guest\n"
CLIENT_TIMEOUT = 90

GOOGLE_AUTH_SCRIPT = r"""
import json, sys
cfg = json.loads(sys.argv[1])
""" + GUEST_GUARD + r"""
import google.auth.transport.requests
from google.auth.compute_engine import _metadata, credentials

request = google.auth.transport.requests.Request()
out = {"ping": _metadata.ping(request), "id": _metadata.get(request, "instance/id"),
       "project": _metadata.get_project_id(request),
       "account": _metadata.get_service_account_info(request),
       "attributes": _metadata.get(request, "instance/attributes/", recursive=True)}
creds = credentials.IDTokenCredentials(request, cfg["audience"], use_metadata_identity_endpoint=True)
creds.refresh(request)
out["token"], out["expiry"] = creds.token, creds.expiry.timestamp()
print(json.dumps(out))
"""

CLOUD_INIT_SCRIPT = r"""
import base64, json, os, sys
cfg = json.loads(sys.argv[1])
""" + GUEST_GUARD + r"""
from cloudinit import distros, helpers, util
from cloudinit.sources import DataSourceGCE

util._DNS_REDIRECT_IP = set()  # no DNS probes: the URL is an IP address
DataSourceGCE.platform_reports_gce = lambda: True  # no DMI here: say this is GCE
root = cfg["tmp"]
paths = helpers.Paths({"cloud_dir": root + "/cloud", "run_dir": root + "/run", "docs_dir": root + "/docs",
                       "templates_dir": root + "/templates"})
distro = distros.fetch("debian")("debian", {}, paths)
sys_cfg = {"datasource_list": ["GCE"], "datasource": {"GCE": {"metadata_url": cfg["url"] + "/computeMetadata/v1/",
                                                              "retries": 0}}}
ds = DataSourceGCE.DataSourceGCE(sys_cfg, distro, paths)
ok = ds._get_data()
out = {"ok": ok}
if ok:
    out.update(instance_id=ds.get_instance_id(), hostname=ds.get_hostname().hostname,
               public_keys=ds.get_public_ssh_keys(), zone=ds.availability_zone,
               userdata=base64.b64encode(ds.userdata_raw or b"").decode())
print(json.dumps(out))
"""


def document(instance_id: str) -> dict[str, Any]:
    return {"id": instance_id, "hostname": "gce-guest.acme.internal", "facility": "us-east1-b", "plan": "n2.small",
            "project_id": "acme-prod", "tags": ["web"], "ssh_keys": [KEY, "bob:ssh-rsa AAAAB3Nza bob@example"],
            "attributes": {"enable-oslogin": "FALSE"}}


def run_google_auth(cfg: dict[str, Any], tmp: Path, host: str) -> dict[str, Any]:
    """The google-auth script under this venv's python, pointed at ``host`` by its environment variables."""
    env = clean_env(tmp, GCE_METADATA_HOST=host, GCE_METADATA_IP=host)
    result = subprocess.run([sys.executable, "-c", GOOGLE_AUTH_SCRIPT, json.dumps(cfg)], env=env,
                            capture_output=True, text=True, timeout=CLIENT_TIMEOUT, check=False)
    assert result.returncode == 0, result.stderr
    seen: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return seen


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Serve one instance, run google-auth and cloud-init against it once; yield what they saw."""
    tmp = tmp_path_factory.mktemp("gce-clients")
    instance_id = new_id()
    with serving(tmp, "--data-dir", str(tmp / "data"), "--identity-issuer", ISSUER) as server:
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUEST], "metadata": document(instance_id)})
        server.post("/device-userdata", {"id": instance_id, "ipAddresses": [GUEST], "userdata": USERDATA,
                                         "userdata_encoding": "text"})
        cfg = {"url": server.url, "source": GUEST, "tmp": str(tmp / "cloud-init"), "audience": AUDIENCE}
        seen = {"google_auth": run_google_auth(cfg, tmp, server.url.removeprefix("http://")),
                "cloud_init": run_cloud_init(CLOUD_INIT_SCRIPT, cfg, tmp, CLIENT_TIMEOUT),
                "id": instance_id, "url": server.url}
        seen["jwks"] = jwt.PyJWKClient(f"{server.url}/.well-known/jwks.json").get_signing_key_from_jwt(
            seen["google_auth"]["token"])
        with client_at() as client:
            seen["published"] = client.get(f"{server.url}/.well-known/jwks.json").json()
        with (tmp / "data" / "idtoken-key.pem").open("rb") as handle:
            seen["key_file"] = handle.read()
        yield seen


def test_google_auth_finds_the_server_and_reads_metadata(crawled):
    """ping, get and get_project_id, the service account info and recursive attributes, as google-auth reads them."""
    got = crawled["google_auth"]
    assert got["ping"] is True
    assert got["id"] == crawled["id"]
    assert got["project"] == "acme-prod"
    assert got["account"]["aliases"] == ["default"]
    assert got["account"]["email"].startswith(project_number("acme-prod"))
    assert got["attributes"]["enable-oslogin"] == "FALSE"
    assert got["attributes"]["user-data"] == USERDATA


def test_the_identity_token_verifies_with_pyjwks_client(crawled):
    """The token google-auth fetched: aud, iss, sub and the compute_engine claims, by PyJWT's PyJWKClient."""
    token = crawled["google_auth"]["token"]
    claims = jwt.decode(token, crawled["jwks"].key, algorithms=["ES256"], audience=AUDIENCE, issuer=ISSUER)
    assert claims["sub"] == crawled["id"]
    assert claims["exp"] == crawled["google_auth"]["expiry"]
    assert claims["exp"] - claims["iat"] <= 3600
    assert claims["google"]["compute_engine"]["project_id"] == "acme-prod"
    assert claims["google"]["compute_engine"]["zone"] == "us-east1-b"
    with pytest.raises(jwt.InvalidAudienceError):
        jwt.decode(token, crawled["jwks"].key, algorithms=["ES256"], audience="https://someone.else")


def test_the_identity_token_verifies_with_google_auths_own_verifier(crawled):
    """google.auth.jwt.decode (its ES256 verifier), the key rebuilt from the published JWK by cryptography."""
    token = crawled["google_auth"]["token"]
    kid = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "==="))["kid"]
    key = next(k for k in crawled["published"]["keys"] if k["kid"] == kid)  # the JWK as published, no PyJWT
    numbers = ec.EllipticCurvePublicNumbers(_int(key["x"]), _int(key["y"]), ec.SECP256R1())
    pem = numbers.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    claims = google_jwt.decode(token, certs={key["kid"]: pem.decode()}, audience=AUDIENCE)
    assert (claims["sub"], claims["iss"]) == (crawled["id"], ISSUER)
    private = serialization.load_pem_private_key(crawled["key_file"], password=None)
    assert private.public_key().public_numbers() == numbers  # the key in the data dir signed it


def test_cloud_inits_gce_datasource_reads_id_hostname_keys_and_userdata(crawled):
    """DataSourceGCE: instance id, hostname, SSH keys (cloudinit: ones only), zone and exact userdata."""
    got = crawled["cloud_init"]
    assert got["ok"] is True
    assert (got["instance_id"], got["hostname"], got["zone"]) == (crawled["id"], "gce-guest", "us-east1-b")
    assert got["public_keys"] == [KEY]
    assert base64.b64decode(got["userdata"]).decode() == USERDATA


def _int(text: str) -> int:
    return int.from_bytes(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)), "big")


PROJECT_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPr0j3ct carol@example"
PROJECT_SCRIPT = r"""
import json, sys
cfg = json.loads(sys.argv[1])
""" + GUEST_GUARD + r"""
import google.auth.transport.requests
from google.auth.compute_engine import _metadata

request = google.auth.transport.requests.Request()
print(json.dumps({"team": _metadata.get(request, "project/attributes/team"),
                  "all": _metadata.get(request, "project/attributes/", recursive=True),
                  "project": _metadata.get_project_id(request)}))
"""


@pytest.fixture(scope="module")
def project_crawled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An instance without SSH keys of its own in project fleet-prj, whose attributes are written by PUT."""
    tmp = tmp_path_factory.mktemp("gce-project-clients")
    instance_id = new_id()
    doc = {"id": instance_id, "hostname": "fleet-guest.acme.internal", "facility": "us-east1-c",
           "project_id": "fleet-prj"}
    with serving(tmp, "--data-dir", str(tmp / "data")) as server:
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUEST], "metadata": doc})
        attributes = {"ssh-keys": f"cloudinit:{PROJECT_KEY}\ndave:ssh-rsa AAAAB3Nzb dave@example", "team": "infra"}
        with client_at() as admin:
            put = admin.put(f"{server.url}/projects/fleet-prj/attributes", json=attributes,
                            headers=server.admin_headers)
        assert put.status_code == 200, put.text
        cfg = {"url": server.url, "source": GUEST, "tmp": str(tmp / "cloud-init")}
        env = clean_env(tmp, GCE_METADATA_HOST=server.url.removeprefix("http://"))
        ran = subprocess.run([sys.executable, "-c", PROJECT_SCRIPT, json.dumps(cfg)], env=env, capture_output=True,
                             text=True, timeout=CLIENT_TIMEOUT, check=False)
        assert ran.returncode == 0, ran.stderr
        yield {"google_auth": json.loads(ran.stdout.strip().splitlines()[-1]), "attributes": attributes,
               "cloud_init": run_cloud_init(CLOUD_INIT_SCRIPT, cfg, tmp, CLIENT_TIMEOUT), "id": instance_id}


def test_google_auth_reads_project_attributes_written_by_put(project_crawled):
    """_metadata.get of project/attributes/team and the recursive directory: the record PUT wrote."""
    got = project_crawled["google_auth"]
    assert got["team"] == "infra"
    assert got["all"] == project_crawled["attributes"]
    assert got["project"] == "fleet-prj"


def test_cloud_inits_gce_datasource_takes_ssh_keys_from_project_attributes(project_crawled):
    """DataSourceGCE reads project/attributes/ssh-keys: the cloudinit user's key (not dave's) reaches the guest."""
    got = project_crawled["cloud_init"]
    assert got["ok"] is True
    assert got["instance_id"] == project_crawled["id"]
    assert got["public_keys"] == [PROJECT_KEY]
