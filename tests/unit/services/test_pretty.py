"""``pretty``: ``json.dumps(indent=2)``'s text from the C encoder, byte for byte, without cyclic garbage."""

from __future__ import annotations

import gc
import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ec2_expected import INSTANCE_ID, seed
from imds.models import Instance, Notice
from imds.services.render.context import Context
from imds.services.render.ec2 import identity_document
from imds.services.render.events import ec2_items, history, scheduled
from imds.services.render.pretty import pretty
from imds.services.render.timeline import Seen

scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
    | st.sampled_from(["\ud800", "z\udfff", "é", "²", "日本", "\u2028", '"\\/', "\x00\x1f", ""])
)
keys = st.text(max_size=6) | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)

CASES: list[Any] = [
    {}, [], (), {"a": {}}, {"a": []}, [[]], [{}], "x", 0, -1.5, None, True, math.inf,
    {"a": 1, "b": [1, 2, {"c": None, "d": [[], {}]}], "e": {"f": {"g": "é\u2028\ud800"}}},
    {3: "three", 2.5: "two and a half", True: "yes", False: "no", None: "nothing"},
    [1, [2, [3, [4]]], (5, (6,))],
    {"accountId": "", "billingProducts": None, "region": "日本", "nested": {"list": [1, "two", None]}},
]


@pytest.mark.parametrize("value", CASES)
def test_pretty_is_json_dumps_indent_2(value: Any) -> None:
    """Nested and empty containers, non-ASCII, surrogates, non-string keys, infinities: the same text."""
    assert pretty(value) == json.dumps(value, indent=2)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(json_values)
def test_pretty_is_json_dumps_indent_2_for_any_json_value(value: Any) -> None:
    """Any value the JSON encoder takes: the same text as the standard library's indented encoder."""
    assert pretty(value) == json.dumps(value, indent=2)


def test_pretty_refuses_what_json_dumps_refuses() -> None:
    """A value JSON cannot hold is a TypeError, as with ``json.dumps``."""
    with pytest.raises(TypeError):
        pretty({"a": {1, 2}})
    with pytest.raises(TypeError):
        json.dumps({"a": {1, 2}}, indent=2)


def test_pretty_leaves_no_cyclic_garbage() -> None:
    """The indented standard encoder leaves a reference cycle per call; ``pretty`` none (nothing for the GC)."""
    document = {"a": [1, {"b": "c"}], "d": None, "e": {"f": [[], {}]}}
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            json.dumps(document, indent=2)
        assert gc.collect() > 0  # the reference: what the identity document cost before
        for _ in range(20):
            pretty(document)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_identity_document_is_the_indented_json_of_its_fields() -> None:
    """The document's bytes are ``json.dumps(fields, indent=2)``'s, as before (non-ASCII escaped, nulls kept)."""
    doc = {**seed(), "project_id": "projét-1", "plan": "c3.large.arm64", "facility": "日本1"}
    inst = Instance(INSTANCE_ID, metadata=doc, metadata_updated_at=datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC))
    document = identity_document(inst)
    fields = json.loads(document)
    assert document == json.dumps(fields, indent=2).encode()
    assert fields["accountId"] == "projét-1"
    assert b"proj\\u00e9t-1" in document
    assert document.startswith(b'{\n  "accountId": ')
    assert document.endswith(b'\n  "version": "2017-09-30"\n}')


def test_the_events_documents_are_the_indented_json_of_their_events() -> None:
    """``events/maintenance/scheduled`` and ``history`` (lists of objects, ``[]`` without notices): as before."""
    at = datetime(2026, 11, 24, 4, 0, tzinfo=UTC)
    reboot = Notice("instance", INSTANCE_ID, "reboot", at, window_end=at, description="réboot", id="n1")
    moved = Notice("instance", INSTANCE_ID, "maintenance", at, id="n2")
    seen = (Seen(reboot, "scheduled"), Seen(moved, "canceled"))
    maintenance = ec2_items(Context(None, seen, at))["events"]["maintenance"]  # type: ignore[index]
    assert maintenance["scheduled"] == json.dumps(scheduled(seen, at), indent=2).encode()  # type: ignore[index]
    assert maintenance["history"] == json.dumps(history(seen), indent=2).encode()  # type: ignore[index]
    assert json.loads(maintenance["scheduled"])[0]["Description"] == "réboot"  # type: ignore[index]
    assert len(json.loads(maintenance["history"])) == 1  # type: ignore[index]
    empty = ec2_items(Context())["events"]["maintenance"]  # type: ignore[index]
    assert (empty["scheduled"], empty["history"]) == (b"[]", b"[]")  # type: ignore[index]
