"""The admin wire format: parsing, every error's field path, and the userdata encoding guess."""

from __future__ import annotations

import base64
import ipaddress
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from imds.errors import InvalidInput
from imds.services.records.limits import Limits
from imds.services.records.wire import (
    document_timestamp,
    parse_instance_id,
    parse_json,
    parse_metadata_write,
    parse_userdata_write,
)

ID = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
STRICT = Limits(strict_records=True)  # --strict-records: the rules before hollow's readings were accepted


def problems(exc: pytest.ExceptionInfo[InvalidInput]) -> dict[str, str]:
    return {p.field: p.message for p in exc.value.problems}


def metadata(**fields):
    return {"id": ID, "ipAddresses": ["10.0.0.1"], "metadata": {"hostname": "h"}, **fields}


def userdata(value, **fields):
    return {"id": ID, "ipAddresses": ["10.0.0.1"], "userdata": value, **fields}


# --- parse_json ------------------------------------------------------------------------------


def test_parse_json_decodes_a_body():
    """A JSON body comes back as Python values."""
    assert parse_json(b'{"a": [1, "x"]}') == {"a": [1, "x"]}


@pytest.mark.parametrize("raw", [b"", b"{", b"not json", b'{"a": 1,}', b"\xff\xfe{}", b"{'a': 1}"])
def test_parse_json_names_the_body_when_it_is_not_json(raw):
    """Empty, truncated, non-UTF-8 or single-quoted bodies are one problem under ``body``."""
    with pytest.raises(InvalidInput) as caught:
        parse_json(raw)
    assert list(problems(caught)) == ["body"]
    assert problems(caught)["body"].startswith("not valid JSON")


# --- parse_instance_id -------------------------------------------------------------------------


def test_instance_id_is_canonicalised_to_lower_case():
    """Upper-case UUIDs are accepted and stored lower-case."""
    assert parse_instance_id(ID.upper()) == ID


@pytest.mark.parametrize(
    "value",
    ["", "x", ID.replace("-", ""), "{" + ID + "}", "urn:uuid:" + ID, ID + " ", ID[:-1] + "g", 42, [ID]],
)
def test_instance_id_must_be_a_hyphenated_uuid_string(value):
    """Anything but the 8-4-4-4-12 hex form is refused under the given field name."""
    with pytest.raises(InvalidInput) as caught:
        parse_instance_id(value, field="instance_id")
    assert problems(caught) == {"instance_id": "must be a UUID such as 3f2504e0-4f89-11d3-9a0c-0305e82c3301"}


def test_missing_instance_id_is_required():
    """None means the field was absent."""
    with pytest.raises(InvalidInput) as caught:
        parse_instance_id(None)
    assert problems(caught) == {"id": "is required"}


# --- parse_metadata_write ------------------------------------------------------------------------


def test_metadata_as_an_object():
    """The hollow form: metadata is a JSON object, stored as given."""
    write = parse_metadata_write(metadata(metadata={"hostname": "h", "nested": {"a": [1]}}))
    assert write.id == ID
    assert write.addresses == (ipaddress.ip_network("10.0.0.1/32"),)
    assert write.metadata == {"hostname": "h", "nested": {"a": [1]}}


def test_metadata_as_a_json_encoded_string():
    """The friendlier form: a string holding a JSON object is decoded."""
    document = {"hostname": "h", "tags": ["x"]}
    assert parse_metadata_write(metadata(metadata=json.dumps(document))).metadata == document


def test_addresses_are_normalised_and_deduplicated_in_order():
    """Every textual form is normalised; equal networks collapse to the first occurrence."""
    write = parse_metadata_write(
        metadata(ipAddresses=["10.1.2.0/255.255.255.0", "2001:DB8::1", "10.1.2.0/24", "::ffff:10.9.9.9", "10.9.9.9/32"])
    )
    assert [str(a) for a in write.addresses] == ["10.1.2.0/24", "2001:db8::1/128", "10.9.9.9/32"]


def test_an_empty_address_list_is_allowed():
    """``[]`` means the instance should hold no address."""
    assert parse_metadata_write(metadata(ipAddresses=[])).addresses == ()


@pytest.mark.parametrize(
    ("value", "message_start"),
    [
        ("{", "is a string but not valid JSON"),
        ("", "is a string but not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ("null", "must be a JSON object"),
        ([1, 2], "must be a JSON object"),
        (42, "must be a JSON object"),
        (True, "must be a JSON object"),
        (None, "is required"),
    ],
)
def test_metadata_must_be_an_object_or_an_object_string(value, message_start):
    """Non-objects, undecodable strings and null are refused under ``metadata``."""
    with pytest.raises(InvalidInput) as caught:
        parse_metadata_write(metadata(metadata=value))
    assert list(problems(caught)) == ["metadata"]
    assert problems(caught)["metadata"].startswith(message_start)


@pytest.mark.parametrize("stamp", ["yesterday", "", 1700000000, None, "2024-13-01T00:00:00Z"])
def test_metadata_updated_at_must_be_a_timestamp(stamp):
    """A present but unparseable top-level updated_at is named by its path."""
    with pytest.raises(InvalidInput) as caught:
        parse_metadata_write(metadata(metadata={"updated_at": stamp}))
    assert problems(caught) == {"metadata.updated_at": "must be an RFC 3339 timestamp string"}


def test_updated_at_inside_a_string_document_is_checked_too():
    """The JSON-encoded form gets the same timestamp check."""
    with pytest.raises(InvalidInput) as caught:
        parse_metadata_write(metadata(metadata=json.dumps({"updated_at": "soon"})))
    assert list(problems(caught)) == ["metadata.updated_at"]


@pytest.mark.parametrize("body", [[], "x", 1, None, True])
def test_body_must_be_an_object(body):
    """A JSON body that is not an object names ``body`` and every required field."""
    with pytest.raises(InvalidInput) as caught:
        parse_metadata_write(body)
    assert list(problems(caught)) == ["body", "id", "ipAddresses", "metadata"]
    assert problems(caught)["body"] == "must be a JSON object"


def test_missing_fields_are_each_required():
    """``{}`` names id, ipAddresses and metadata (--strict-records)."""
    with pytest.raises(InvalidInput) as caught:
        parse_metadata_write({}, STRICT)
    assert problems(caught) == {
        "id": "is required",
        "ipAddresses": "is required: the complete list (send [] to remove every address)",
        "metadata": "is required",
    }


@pytest.mark.parametrize("value", [None, "10.0.0.1", {"0": "10.0.0.1"}, 5])
def test_ip_addresses_must_be_a_list(value):
    """A null list is "required" (--strict-records); strings, objects and numbers are "must be a list"."""
    with pytest.raises(InvalidInput) as caught:
        parse_metadata_write(metadata(ipAddresses=value), STRICT)
    message = problems(caught)["ipAddresses"]
    assert message.startswith("is required" if value is None else "must be a list")


def test_every_problem_is_reported_at_once_with_its_path():
    """Bad id, each bad list element by index and bad metadata come back together, in order."""
    body = {
        "id": "nope",
        "ipAddresses": ["10.0.0.1", "10.0.0.300", 7, "2001:db8::1", "10.0.0.0/33", None, "fe80::1%eth0"],
        "metadata": "{not json",
    }
    with pytest.raises(InvalidInput) as caught:
        parse_metadata_write(body)
    assert caught.value.message == "invalid request"
    assert [p.field for p in caught.value.problems] == [
        "id",
        "ipAddresses[1]",
        "ipAddresses[2]",
        "ipAddresses[4]",
        "ipAddresses[5]",
        "ipAddresses[6]",
        "metadata",
    ]
    found = problems(caught)
    assert found["ipAddresses[1]"] == "'10.0.0.300' is not an IP address or CIDR"
    assert found["ipAddresses[2]"] == "must be a string"
    assert found["ipAddresses[4]"] == "'10.0.0.0/33' is not an IP address or CIDR"
    assert found["ipAddresses[5]"] == "must be a string"


def test_unknown_fields_are_ignored():
    """Extra keys (hollow sends some) do not fail the write."""
    assert parse_metadata_write(metadata(extra="x", createdAt="now")).id == ID


# --- the record's host -----------------------------------------------------------------------------


def test_a_top_level_host_is_stored_as_the_documents_host():
    """``host`` beside the document (Nova's instance.host) is kept where serve's host check reads it."""
    write = parse_metadata_write(metadata(host="compute-7"))
    assert write.metadata == {"hostname": "h", "host": "compute-7"}
    inside = parse_metadata_write({**metadata(host="compute-7"), "metadata": {"hostname": "h", "host": "compute-7"}})
    assert inside.metadata == write.metadata
    assert parse_metadata_write(metadata(host=None)).metadata == {"hostname": "h"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (metadata(host=7), "host"),
        (metadata(host="compute 7"), "host"),
        (metadata(host=""), "host"),
        ({**metadata(), "metadata": {"hostname": "h", "host": 7}}, "metadata.host"),
        ({**metadata(), "metadata": {"hostname": "h", "host": {"name": "compute-7"}}}, "metadata.host"),
        ({**metadata(), "metadata": {"hostname": "h", "host": "a;b"}}, "metadata.host"),
        ({**metadata(host="compute-7"), "metadata": {"hostname": "h", "host": "compute-8"}}, "host"),
    ],
    ids=["number", "space", "empty", "document-number", "document-object", "document-bad-name", "disagree"],
)
def test_a_host_the_check_could_not_use_is_refused_naming_the_field(body, field):
    """A host that is no host name (a number would leave serve's check off) or two that disagree: 400, nothing kept."""
    with pytest.raises(InvalidInput) as exc:
        parse_metadata_write(body)
    assert field in problems(exc)


def test_a_document_without_a_host_is_unchanged():
    """No host anywhere: the document as sent (the host check starts once the source of truth names hosts)."""
    assert parse_metadata_write(metadata()).metadata == {"hostname": "h"}
    assert parse_metadata_write({**metadata(), "metadata": {"hostname": "h", "host": None}}).metadata == {
        "hostname": "h", "host": None}


# --- parse_userdata_write -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("#!/bin/sh\necho hi\n", b"#!/bin/sh\necho hi\n"),
        ("#cloud-config\npackages: [vim]\n", b"#cloud-config\npackages: [vim]\n"),
        ("", b""),
        ("héllo ☃", "héllo ☃".encode()),
        ("abc", b"abc"),
        ("YQ=", b"YQ="),
        ("YQ===", b"YQ==="),
        ("YWJj ZGVm", b"YWJj ZGVm"),
        ("YWJj\nZGVm", b"YWJj\nZGVm"),
        ("YW-j", b"YW-j"),
        ("=YWJj", b"=YWJj"),
    ],
)
def test_userdata_that_is_not_strict_base64_is_stored_verbatim(value, stored):
    """Text, empty strings, bad padding, whitespace, URL-safe characters: stored as UTF-8 text."""
    assert parse_userdata_write(userdata(value)).userdata == stored


@pytest.mark.parametrize(
    "raw", [b"#!/bin/sh\necho hi\n", bytes(range(256)), b"a", b"ab", b"abc", b"\x00\xff", b"\xfb\xff\xbf"]
)
def test_userdata_in_strict_base64_is_decoded(raw):
    """The hollow service sends bytes as standard base64 with padding; imds stores the decoded bytes."""
    assert parse_userdata_write(userdata(base64.b64encode(raw).decode())).userdata == raw


def test_text_made_only_of_the_base64_alphabet_is_decoded_by_the_guess():
    """A 4-character word like ``test`` is valid base64, so the guess decodes it (the documented rule)."""
    assert parse_userdata_write(userdata("test")).userdata == base64.b64decode("test")


def test_encoding_text_overrides_the_guess():
    """``userdata_encoding: text`` stores a base64-looking value as the text it is."""
    assert parse_userdata_write(userdata("test", userdata_encoding="text")).userdata == b"test"
    assert parse_userdata_write(userdata("YWJj", userdata_encoding="text")).userdata == b"YWJj"


def test_encoding_base64_decodes_explicitly():
    """``userdata_encoding: base64`` decodes, including the empty string."""
    assert parse_userdata_write(userdata("YWJj", userdata_encoding="base64")).userdata == b"abc"
    assert parse_userdata_write(userdata("", userdata_encoding="base64")).userdata == b""


@pytest.mark.parametrize("value", ["#!/bin/sh", "YQ=", "YW Jj", "ab!c"])
def test_encoding_base64_refuses_invalid_base64(value):
    """With an explicit base64 encoding, anything that is not valid base64 is an error under ``userdata``."""
    with pytest.raises(InvalidInput) as caught:
        parse_userdata_write(userdata(value, userdata_encoding="base64"))
    assert problems(caught) == {"userdata": 'is not valid base64 (userdata_encoding is "base64")'}


@pytest.mark.parametrize("encoding", ["BASE64", "hex", "", 1, True])
def test_unknown_encoding_is_refused(encoding):
    """Only "text" and "base64" are encodings."""
    with pytest.raises(InvalidInput) as caught:
        parse_userdata_write(userdata("#!/bin/sh", userdata_encoding=encoding))
    assert problems(caught) == {"userdata_encoding": 'must be "text" or "base64"'}


def test_null_encoding_means_guess():
    """``userdata_encoding: null`` is the same as leaving it out."""
    assert parse_userdata_write(userdata("YWJj", userdata_encoding=None)).userdata == b"abc"


@pytest.mark.parametrize(
    ("value", "message"),
    [(None, 'is required (send "" for empty userdata)'), (5, "must be a string"), (["x"], "must be a string")],
)
def test_userdata_must_be_a_string(value, message):
    """Missing or non-string userdata is named ``userdata``."""
    with pytest.raises(InvalidInput) as caught:
        parse_userdata_write(userdata(value))
    assert problems(caught) == {"userdata": message}


def test_userdata_reports_every_problem_at_once():
    """Bad id, bad address and bad encoding, with missing userdata, are all named."""
    with pytest.raises(InvalidInput) as caught:
        parse_userdata_write({"id": 1, "ipAddresses": ["x"], "userdata_encoding": "rot13"})
    assert [p.field for p in caught.value.problems] == ["id", "ipAddresses[0]", "userdata_encoding", "userdata"]


def test_userdata_write_carries_id_and_addresses():
    """The parsed write has the canonical id and the normalised networks."""
    write = parse_userdata_write({"id": ID.upper(), "ipAddresses": ["2001:DB8::/64"], "userdata": "x"})
    assert write.id == ID
    assert write.addresses == (ipaddress.ip_network("2001:db8::/64"),)


# --- document_timestamp ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2024-05-01T12:00:00Z", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01T12:00:00+00:00", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01T14:00:00+02:00", datetime(2024, 5, 1, 14, tzinfo=timezone(timedelta(hours=2)))),
        ("2024-05-01T12:00:00.123456Z", datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)),
        ("2024-05-01T12:00:00", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01", datetime(2024, 5, 1, tzinfo=UTC)),
    ],
)
def test_document_timestamp_parses_rfc3339_and_treats_naive_as_utc(value, expected):
    """Offsets are honoured; a timestamp without one is UTC."""
    parsed = document_timestamp({"updated_at": value})
    assert parsed == expected
    assert parsed is not None
    assert parsed.tzinfo is not None


def test_offsets_compare_as_instants():
    """14:00+02:00 is the same instant as 12:00Z."""
    assert document_timestamp({"updated_at": "2024-05-01T14:00:00+02:00"}) == document_timestamp(
        {"updated_at": "2024-05-01T12:00:00Z"}
    )


@pytest.mark.parametrize("document", [{}, {"updated_at": None}, {"updated_at": 5}, {"updated_at": "soon"}])
def test_document_timestamp_is_none_without_a_valid_one(document):
    """Absent, non-string or unparseable values give None."""
    assert document_timestamp(document) is None
