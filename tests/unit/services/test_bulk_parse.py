"""Parsing an import item (``imds.services.transfer.bulk.parse_item``): the shortcuts an import takes decide as before.

An item's metadata is measured as compact JSON only when its text could be long enough to carry
more than ``max_body_bytes`` (``GROWTH``), and its two parts read ``ipAddresses`` once.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from imds.errors import InvalidInput
from imds.services.records.limits import Limits
from imds.services.transfer.bulk import GROWTH, GROWTH_SLACK, parse_item

ID = str(uuid.UUID(int=29, version=4))

# Documents whose compact \u-escaped JSON is as long as can be for their text: astral characters (12 bytes
# from one character), other non-ASCII ones, numbers that print longer than written, escapes, a host.
GROWING: list[dict[str, Any]] = [
    {"emoji": "😀" * 500},
    {"é": "é" * 400, "中": ["中文" * 100]},
    {"n": [1e15] * 200, "m": [9e15, 1e-4, 1e16]},
    {"ctl": "\x01\x1f" * 300, "q": '"\\' * 100},
    {"deep": [[[[{"a": "😀"}]]]] * 50},
]


def _item(document: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"id": ID, "ipAddresses": ["10.29.0.1"], "metadata": document, **more}


@pytest.mark.parametrize("document", GROWING)
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_metadata_written_back_is_never_longer_than_the_bound(document: dict[str, Any], ensure_ascii: bool) -> None:
    """Whatever the item's text counted (UTF-8 bytes of a line, characters of an array element), the bound holds."""
    for item in (_item(document), _item(document, host="node-1.example"), _item(json.dumps(document))):
        text = json.dumps(item, ensure_ascii=ensure_ascii, separators=(",", ":"))
        parsed = parse_item(json.loads(text), label="line 1")
        assert parsed.metadata is not None
        written = len(json.dumps(parsed.metadata.metadata, separators=(",", ":")))
        for size in (len(text), len(text.encode())):
            assert written <= GROWTH * size + GROWTH_SLACK, (size, written)


@pytest.mark.parametrize("document", GROWING)
def test_the_size_check_decides_the_same_with_and_without_the_items_size(document: dict[str, Any]) -> None:
    """At limits just under, at and over the metadata's size: the same refusal whether the size is known or not."""
    text = json.dumps(_item(document), ensure_ascii=False)
    written = len(json.dumps(document, separators=(",", ":")))
    for limit in (written - 1, written, written + 1, GROWTH * len(text) + GROWTH_SLACK):
        limits = Limits(max_body_bytes=limit)
        outcomes = []
        for size in (0, len(text), len(text.encode())):
            try:
                parse_item(json.loads(text), label="line 1", limits=limits, size=size)
            except InvalidInput as exc:
                outcomes.append([p.field for p in exc.problems])
            else:
                outcomes.append([])
        assert outcomes[0] == outcomes[1] == outcomes[2], (limit, outcomes)
        assert outcomes[0] == (["metadata"] if written > limit else [])


def test_both_parts_hold_the_addresses_read_once_and_a_bad_one_is_named_once() -> None:
    """Metadata and userdata of one item share one address list; a bad address is one problem, not two."""
    item = parse_item({**_item({"hostname": "a"}), "ipAddresses": ["10.29.0.1", "10.29.0.8/29"],
                       "userdata": "#cloud-config\n", "userdata_encoding": "text"}, label="line 1")
    assert item.metadata is not None
    assert item.userdata is not None
    assert item.userdata.addresses == item.metadata.addresses
    assert [str(a) for a in item.userdata.addresses] == ["10.29.0.1/32", "10.29.0.8/29"]
    with pytest.raises(InvalidInput) as caught:
        parse_item({**_item({"hostname": "a"}), "ipAddresses": ["10.29.0.1", "not an address"],
                    "userdata": "x", "userdata_encoding": "text"}, label="line 1")
    assert [p.field for p in caught.value.problems] == ["ipAddresses[1]"]
    userdata_only = parse_item({"id": ID, "ipAddresses": ["10.29.0.2"], "userdata": "x"}, label="line 2")
    assert userdata_only.userdata is not None
    assert [str(a) for a in userdata_only.userdata.addresses] == ["10.29.0.2/32"]
