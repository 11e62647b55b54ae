"""The instance ETag: one canonical text per version, computed without copying the document."""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
from datetime import UTC, datetime

from helpers import fixture_json
from imds.models import Instance, OsRecord, StoredParam
from imds.services.catalog.watch import instance_etag


def reference_etag(instance: Instance) -> bytes:
    """The definition every replica (and every earlier release) uses: sha256 of the sorted ``asdict`` JSON."""
    canonical = json.dumps(dataclasses.asdict(instance), sort_keys=True, default=str, separators=(",", ":"))
    return b'"' + hashlib.sha256(canonical.encode()).hexdigest()[:32].encode() + b'"'


def full_instance(**changes: object) -> Instance:
    at = datetime(2026, 11, 24, 4, 0, tzinfo=UTC)
    os_record = OsRecord(os_type="debootstrap", mode="install", communication=True,
                         parameters={"dist": StoredParam("public", "bookworm")},
                         install_parameters={"disk": StoredParam("private", "ciphertext", encrypted=True)},
                         package_url=None, package_auth=False, generation="g1", updated_at=at)
    instance = Instance("3f2504e0-4f89-11d3-9a0c-0305e82c3301",
                        (ipaddress.ip_network("10.0.0.5/32"), ipaddress.ip_network("fd00::5/128")),
                        fixture_json("metadata-example.json"), at, b"#!/bin/sh\n", at, b"pw", os_record)
    return dataclasses.replace(instance, **changes)  # type: ignore[arg-type]


def test_the_etag_is_the_reference_canonical_hash():
    """Every field, nested document and OS record included: the same ETag as the asdict-based definition."""
    for instance in (full_instance(), Instance("3f2504e0-4f89-11d3-9a0c-0305e82c3301"),
                     full_instance(os=None, password=None)):
        assert instance_etag(instance) == reference_etag(instance)


def test_any_change_changes_the_etag_and_the_document_is_not_touched():
    """A nested document value, an address, userdata and an OS parameter each change it; the document is untouched."""
    base = full_instance()
    kept = json.dumps(base.metadata)
    changed_doc = json.loads(kept)
    changed_doc["network"]["addresses"][0]["address"] = "192.0.2.99"
    variants = [
        full_instance(metadata=changed_doc),
        full_instance(addresses=(ipaddress.ip_network("10.0.0.6/32"),)),
        full_instance(userdata=b"#!/bin/sh\necho\n"),
        full_instance(os=dataclasses.replace(base.os, parameters={"dist": StoredParam("public", "trixie")})),
    ]
    tags = {instance_etag(v) for v in variants} | {instance_etag(base)}
    assert len(tags) == len(variants) + 1
    assert json.dumps(base.metadata) == kept
