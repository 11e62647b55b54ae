"""The GCE tree as a pure function of the record: attributes, the project number, answer shapes."""

from __future__ import annotations

import base64
import hashlib
import json

from imds.models import Instance
from imds.services.render.gce import IDENTITY, answer, find, gce_root, instance_attributes, project_number


def test_the_project_number_is_the_documented_hash():
    """12 digits from the first 48 bits of SHA-256 of the project id: the same everywhere, different per project."""
    expected = 10**11 + int.from_bytes(hashlib.sha256(b"acme").digest()[:6], "big") % (9 * 10**11)
    assert project_number("acme") == str(expected)
    assert len({project_number(f"p{i}") for i in range(200)}) == 200
    assert all(len(project_number(f"p{i}")) == 12 for i in range(200))


def test_binary_userdata_is_base64_with_its_encoding_and_explicit_attributes_win():
    instance = Instance("i-1", metadata={"ssh_keys": ["ssh-rsa AAA a@b"], "attributes": {"ssh-keys": "me:ssh-rsa B"}},
                        userdata=b"\xff\x00binary")
    attributes = instance_attributes(instance)
    assert attributes["user-data-encoding"] == "base64"
    assert base64.b64decode(attributes["user-data"]) == b"\xff\x00binary"
    assert attributes["ssh-keys"] == "me:ssh-rsa B"  # the document's own attribute, not the derived one


def test_answer_shapes_and_the_identity_leaf():
    root = gce_root(Instance("i-2", metadata={"hostname": "h.example", "project_id": "p", "tags": ["a"]}))
    assert find(root, ["instance", "service-accounts", "default", "identity"]) is IDENTITY
    assert find(root, ["instance", "network-interfaces", "0"]) is None  # no address, no interface
    body, kind = answer(find(root, ["project"]), recursive=True, alt=None)
    assert (kind, json.loads(body)["projectId"]) == (b"application/json", "p")
    body, kind = answer(find(root, ["instance", "service-accounts", "default", "scopes"]), recursive=False, alt=None)
    assert kind == b"application/text"
    assert body.endswith(b"\n")
    assert len(body.splitlines()) == 2
